"""The write-it-yourself exercises (minit2i/exercises, docs/exercises.md): each checker passes a
correct solution written another way than the reference and fails a planted wrong one, naming the
case, the element and by how much; the sampler pieces draw the demo picture with the learner's
function; the command answers bad input in one line with exit status 2.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minit2i.cli import main
from minit2i.exercises import EXERCISES, stub
from minit2i.exercises.check import check, draw, load_solution, picture_line

ROOT = Path(__file__).resolve().parent.parent

# name -> (a correct solution computed another way than the reference, a planted mistake a first
# attempt makes, the words of the verdict that names it)
SOLUTIONS = {
    "euler_step": (
        "def euler_step(x, x0, factor):\n    f = x.dtype.type(factor)\n    return (1 - f) * x + f * x0\n",
        "def euler_step(x, x0, factor):\n    f = x.dtype.type(factor)\n    return x0 + f * (x - x0)\n",
        "case 1 of 4 (x float64 [2, 3, 8, 8], x0 float64 [2, 3, 8, 8], factor 0.05): yours differs by up to"),
    "guided_x0": (
        "def guided_x0(x0_cond, x0_uncond, cfg_scale):\n    s = x0_cond.dtype.type(cfg_scale)\n"
        "    return (1 - s) * x0_uncond + s * x0_cond\n",
        "def guided_x0(x0_cond, x0_uncond, cfg_scale):\n    s = x0_cond.dtype.type(cfg_scale)\n"
        "    return x0_cond + s * (x0_cond - x0_uncond)\n",
        "case 1 of 5 (x0_cond float64 [2, 3, 8, 8], x0_uncond float64 [2, 3, 8, 8], cfg_scale 0): yours differs"),
    "step_factors": (
        "import numpy as np\n\ndef step_factors(steps, a_min):\n    t = np.arange(steps + 1) / steps\n"
        "    return np.diff(t) / np.maximum(1 - t[:-1], a_min)\n",
        "import numpy as np\n\ndef step_factors(steps, a_min):\n    t = np.arange(steps + 1) / steps\n"
        "    return np.diff(t) / (1 - t[:-1])\n",
        "case 4 of 5 (steps 100, a_min 0.05): yours differs by up to 0.8 at [99]"),
    "mean_flow_step_factors": (
        "import numpy as np\n\ndef mean_flow_step_factors(steps):\n    t = 1 - np.arange(steps + 1) / steps\n"
        "    return (t[:-1] - t[1:]) / np.clip(t[:-1], 0.05, 1)\n",
        "import numpy as np\n\ndef mean_flow_step_factors(steps):\n    t = 1 - np.arange(steps + 1) / steps\n"
        "    return (t[:-1] - t[1:]) / t[:-1]\n",
        "case 4 of 5 (steps 25): yours differs by up to 0.2 at [24]"),
    "rms_norm": (
        "import numpy as np\n\ndef rms_norm(x, weight, eps):\n"
        "    return x * weight / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)\n",
        "import numpy as np\n\ndef rms_norm(x, weight, eps):\n    x = x - x.mean(axis=-1, keepdims=True)\n"
        "    return x * weight / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)\n",
        "case 1 of 3 (x float64 [4, 16], weight float64 [16], eps 1e-06): yours differs by up to"),
    "apply_rope": (
        "import numpy as np\n\ndef apply_rope(x, cos, sin):\n    a, b = np.split(x, 2, axis=-1)\n"
        "    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)\n",
        "import numpy as np\n\ndef apply_rope(x, cos, sin):\n    a, b = x[..., 0::2], x[..., 1::2]\n"
        "    out = np.empty_like(x)\n    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin\n"
        "    return out\n",
        "case 1 of 3 (x float64 [1, 1, 6, 8], cos float64 [6, 4], sin float64 [6, 4]): yours differs by up to"),
    "attention": (
        "import numpy as np\n\ndef attention(q, k, v, scale):\n    s = q @ np.swapaxes(k, -1, -2) * scale\n"
        "    w = np.exp(s - s.max(axis=-1, keepdims=True))\n    return (w / w.sum(axis=-1, keepdims=True)) @ v\n",
        "import numpy as np\n\ndef attention(q, k, v, scale):\n    w = np.exp(q @ np.swapaxes(k, -1, -2) * scale)\n"
        "    return (w / w.sum(axis=-1, keepdims=True)) @ v\n",
        "case 3 of 3 (q float64 [1, 2, 4, 8], k float64 [1, 2, 9, 8], v float64 [1, 2, 9, 8], scale 0.353553): "
        "yours is nan at"),
}


def solution(tmp_path: Path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_solution(path, name)


def test_there_are_six_or_more_exercises_each_with_a_correct_and_a_wrong_solution():
    assert len(EXERCISES) >= 6 and set(SOLUTIONS) == set(EXERCISES)


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_correct_solution_agrees_on_every_case(name, tmp_path):
    """Computed in another order than the reference, within the checker's tolerance (1e-9 of the
    largest value in float64, 1e-5 in float32), for several seeds of the drawn inputs."""
    yours = solution(tmp_path, name, SOLUTIONS[name][0])
    for seed in range(3):
        verdict = check(EXERCISES[name], yours, seed)
        assert verdict.agrees and verdict.lines == [f"{name}: all {len(EXERCISES[name].cases(np.random.default_rng()))} "
                                                    "cases agree with the reference's"], verdict.lines


@pytest.mark.parametrize("name", list(EXERCISES))
def test_a_planted_mistake_is_caught_and_named(name, tmp_path):
    """The verdict is one line naming the first case that disagrees, its inputs and the element."""
    verdict = check(EXERCISES[name], solution(tmp_path, name, SOLUTIONS[name][1]))
    assert not verdict.agrees and len(verdict.lines) == 1
    assert verdict.lines[0].startswith(f"{name}: {SOLUTIONS[name][2]}"), verdict.lines


def test_a_float64_factor_on_a_float32_state_is_named_as_the_dtype_it_changes(tmp_path):
    """NumPy makes a float64 scalar times a float32 array float64: the sampler's state would change dtype."""
    yours = solution(tmp_path, "euler_step", "def euler_step(x, x0, factor):\n    return x + factor * (x0 - x)\n")
    assert check(EXERCISES["euler_step"], yours).lines == [
        "euler_step: case 4 of 4 (x float32 [2, 3, 8, 8], x0 float32 [2, 3, 8, 8], factor 0.25): yours is float64 "
        "where the reference's is float32 (keep the inputs' dtype)"]


@pytest.mark.parametrize("name", list(EXERCISES))
def test_the_stub_states_the_shapes_and_is_not_written_yet(name, tmp_path):
    """The stub runs, names its function with the reference's parameters, and checks as unwritten."""
    text = stub(EXERCISES[name])
    assert re.search(rf"^def {name}\({re.escape(EXERCISES[name].signature)}\):$", text, re.M)
    assert "[" in text.split('"""')[3] or "float64 [N]" in text  # the shapes
    verdict = check(EXERCISES[name], solution(tmp_path, name, text))
    assert (verdict.agrees, verdict.runs) == (False, False) and "not written yet" in verdict.lines[0]


def test_a_wrong_sampler_piece_draws_another_picture_and_a_right_one_the_same():
    """The demo picture with the learner's euler_step in the sampler: the reference's pixels
    exactly when it is right; when it swaps x and x0 (each step lands near x0, the last on the
    state before it), off by tens of levels (54 at the edges of the disc)."""
    for source, changed in ((SOLUTIONS["euler_step"][0], False), (SOLUTIONS["euler_step"][1], True)):
        namespace = {}
        exec(source, namespace)
        mine, reference = draw(EXERCISES["euler_step"], namespace["euler_step"])
        assert (np.abs(mine.astype(int) - reference).max() > 20) == changed
        line = picture_line(EXERCISES["euler_step"], mine, reference)
        assert re.fullmatch(r'demo drew ".*" \(seed 42\) with your euler_step: ' + (
            r"off the reference's picture by up to \d+ levels of 255 \(mean [\d.]+\)" if changed
            else r"the reference's picture, pixel for pixel"), line), line


def test_the_command_checks_a_sampler_piece_and_writes_both_pictures(tmp_path, capsys):
    """`minit2i exercise mean_flow_step_factors FILE --output PNG`: exit 0, the verdict, the student's
    picture the reference's, and the PNG with both side by side."""
    path = tmp_path / "mine.py"
    path.write_text(SOLUTIONS["mean_flow_step_factors"][0])
    assert main(["exercise", "mean_flow_step_factors", str(path), "--output", str(tmp_path / "both.png")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "mean_flow_step_factors: all 5 cases agree with the reference's"
    assert out[1].startswith('demo-mf drew "') and out[1].endswith("the reference's picture, pixel for pixel")
    both = np.asarray(Image.open(tmp_path / "both.png"))
    assert both.shape == (64, 132, 3) and np.array_equal(both[:, :64], both[:, 68:])


def test_a_wrong_solution_exits_1_with_its_verdict(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text(SOLUTIONS["rms_norm"][1])
    assert main(["exercise", "rms_norm", str(path)]) == 1
    assert capsys.readouterr().out.startswith(f"rms_norm: {SOLUTIONS['rms_norm'][2]}")


def test_without_a_file_the_command_lists_and_prints_stubs(capsys):
    assert main(["exercise"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(EXERCISES)
    assert main(["exercise", "attention"]) == 0
    assert capsys.readouterr().out == stub(EXERCISES["attention"])


@pytest.mark.parametrize("argv, source, message", [
    (["nope"], None, "no exercise named 'nope'; choose one of euler_step"),
    (["rms_norm", "{tmp}/absent.py"], None, "absent.py: no such file"),
    (["rms_norm", "{tmp}"], None, "is a folder; pass the .py file you wrote from the stub"),
    (["rms_norm", "{tmp}/mine.txt"], "x", "mine.txt is not a .py file; start one from the stub"),
    (["rms_norm", "{tmp}/mine.py"], "def rms_norm(x, weight, eps)\n    return x\n",
     "mine.py, line 1: expected ':'; fix the file and check it again"),
    (["rms_norm", "{tmp}/mine.py"], "import no_such_module\n",
     "mine.py failed while it was loaded (ModuleNotFoundError: No module named 'no_such_module')"),
    (["rms_norm", "{tmp}/mine.py"], "def rmsnorm(x, weight, eps):\n    return x\n",
     "mine.py defines no function rms_norm; keep the stub's name"),
    (["rms_norm", "{tmp}/mine.py", "--output", "{tmp}/out.png"], "", "rms_norm is no sampler piece"),
    (["euler_step", "--output", "{tmp}/out.png"], None, "--output needs FILE"),
    (["euler_step", "{tmp}/mine.py", "--output", "{tmp}/no/out.png"], "", "/no does not exist; create it"),
], ids=["name", "missing", "folder", "suffix", "syntax", "import", "no function", "output not drawn",
        "output without file", "output folder"])
def test_bad_input_is_one_line_and_exit_2(argv, source, message, tmp_path, capsys):
    for name in ("mine.py", "mine.txt"):
        if source is not None and any(a.endswith(name) for a in argv):
            (tmp_path / name).write_text(source)
    assert main(["exercise", *(a.format(tmp=tmp_path) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("minit2i: error: ") and message in err, err
    assert not (tmp_path / "out.png").exists()


def test_the_docs_page_teaches_every_exercise():
    """docs/exercises.md names each exercise with its command, and says the file is run as code."""
    text = (ROOT / "docs" / "exercises.md").read_text()
    for name in EXERCISES:
        assert f"minit2i exercise {name}" in text, name
    assert "runs your file as Python" in text
