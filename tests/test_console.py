"""The one-line-error machinery (minit2i/console.py) and the dispatcher's registration: what comes
from files and arguments is printed escaped and shortened, and a missing subcommand is loud."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys

from minit2i.cli import main
from minit2i.console import LINE_LIMIT, OneLineFormatter, printable

TINY_ARGS = ["-p", "a red cat", "--steps", "1", "-W", "16", "-H", "16", "-q"]
# A name that would colour the terminal, ring its bell, and forge a line of its own.
HOSTILE = "a\x1b[31mred\x07\rFORGED: yes\nFORGED: yes"


def test_printable_writes_control_characters_as_escapes():
    assert printable(HOSTILE) == "a\\x1b[31mred\\x07\\rFORGED: yes\\nFORGED: yes"
    assert printable("line one\nline two\tx", keep="\n") == "line one\nline two\\tx"
    assert printable("naïve 猫 ok") == "naïve 猫 ok"


def test_printable_keeps_the_head_and_the_tail_of_a_long_value():
    text = "h" * 1000 + "TAIL"
    shown = printable(text, 100)
    assert shown == "h" * 75 + "...(904 characters left out)..." + "h" * 21 + "TAIL"
    assert printable(text, None) == text and printable("x" * 100, 100) == "x" * 100


def test_a_note_is_one_escaped_line():
    record = logging.LogRecord("minit2i", logging.WARNING, __file__, 1, "cached %s", (HOSTILE,), None)
    assert OneLineFormatter("minit2i: %(message)s").format(record) == f"minit2i: cached {printable(HOSTILE)}"


def test_a_100_kB_argument_is_shortened_in_the_one_line_error(capsys):
    assert main(["trace", "--a", "x" * 100_000]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("minit2i: error: cannot read side 'xxx") and len(err) < LINE_LIMIT + 50
    assert "characters left out" in err and err.endswith("(e.g. numpy:fp64)\n")


def test_an_error_shows_a_hostile_argument_escaped(capsys):
    assert main(["generate", "-p", "a cat", "--model", HOSTILE]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err and "\x07" not in err
    assert "a\\x1b[31mred\\x07\\rFORGED: yes\\nFORGED: yes" in err


def test_info_shows_a_hostile_path_escaped_on_its_own_line(tiny_model, tmp_path, capsys):
    folder = tmp_path / HOSTILE
    shutil.copytree(tiny_model[0], folder)
    assert main(["info", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "\x1b" not in out and "\r" not in out and "\x07" not in out
    assert not any(line.startswith("FORGED") for line in out.splitlines())
    assert f"  files:      {printable(str(folder / 'diffusion_pytorch_model.safetensors'))}" in out.splitlines()


def test_generate_echoes_a_hostile_output_path_escaped(tiny_model, tmp_path, capsys):
    output = tmp_path / f"{HOSTILE}.png"
    assert main(["generate", *TINY_ARGS, "--model", str(tiny_model[0]), "--t5", str(tiny_model[1]),
                 "-o", str(output)]) == 0
    out, _ = capsys.readouterr()
    assert output.is_file() and out == printable(str(output)) + "\n"


def test_a_subcommand_module_missing_from_an_install_fails_loudly():
    """Before, a missing module was skipped and its command silently vanished from `--help`."""
    hidden = "import sys; sys.modules['minit2i.trace'] = None; from minit2i.cli import main; sys.exit(main(['--help']))"
    result = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr and "minit2i.trace" in result.stderr
