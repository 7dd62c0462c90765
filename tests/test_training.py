"""The demo model's training script (training/train.py; its data set and checker:
test_evaluation.py).

The training run itself is never repeated here: a few steps of the tiny smoke configuration prove
that the script runs, resumes deterministically and exports files the NumPy reference reproduces.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minit2i
from minit2i.core.tokenizer import PromptTokenizer, make_word_tokenizer
from minit2i.core.weights import nest
from minit2i.pipeline import load_model
from minit2i.reference.mmjit import mmjit_forward
from minit2i.reference.t5 import t5_encode
from minit2i.training import shapes

torch = pytest.importorskip("torch", reason="training needs the [train] extra (torch)")
from minit2i.training import train  # noqa: E402  (needs torch
from minit2i.training.torch_model import mmjit_forward as torch_mmjit_forward  # noqa: E402
from minit2i.training.torch_model import to_torch_tree  # noqa: E402
from minit2i.training.torch_model import t5_encode as torch_t5_encode

# ---------------------------------------------------------------------------------------------
# Data set


def test_the_low_noise_share_of_a_batch_draws_t_above_its_minimum():
    """With the whole batch at low noise every t lies in [t_min, 1); with none, the official
    logit-normal draws, of which far more than one in 256 fall below 0.85 (about 99 %)."""
    tokenizer = PromptTokenizer(make_word_tokenizer(shapes.vocabulary()), train.DEMO_MMJIT.prompt_length)
    low = train.Recipe(batch=256, low_noise_fraction=1.0, low_noise_t_min=0.85)
    t = train.training_batch(low, tokenizer, step=3)["t"].numpy()
    assert t.min() >= 0.85 and t.max() < 1.0
    official = train.training_batch(train.Recipe(batch=256, low_noise_fraction=0.0), tokenizer, step=3)["t"].numpy()
    assert (official < 0.85).mean() > 0.9


def test_the_phrase_probability_sets_how_many_captions_are_full():
    """Each of the three optional phrases is kept with probability p, so a caption is full
    with probability p^3: at p = 1 every one of 256, at 0.75 about 42 % (binomial standard
    error 3 points at 256, so the bounds 30-55 % cannot fail by chance)."""
    tokenizer = PromptTokenizer(make_word_tokenizer(shapes.vocabulary()), train.DEMO_MMJIT.prompt_length)
    full_tokens = len(shapes.all_scenes()[0].caption().split()) + 1  # and </s>

    def full_share(p):
        mask = train.training_batch(train.Recipe(batch=256, phrase_probability=p), tokenizer, step=5)["mask"].numpy()
        return (mask.sum(axis=1) == full_tokens).mean()

    assert full_share(1.0) == 1.0
    assert 0.30 < full_share(0.75) < 0.55


# ---------------------------------------------------------------------------------------------
# Training script (tiny configuration)


def train_checkpoint(folder) -> tuple[dict[str, np.ndarray], int]:
    """(tensors, step) of a run's checkpoint, read as plain data."""
    from safetensors import safe_open

    with safe_open(str(folder / train.CHECKPOINT), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["run"])["step"]


def run_training(folder, steps):
    """Train the tiny model `steps` steps in `folder`, exported where --export-dir defaults to:
    folder/export."""
    train.main(["--tiny", "--steps", str(steps), "--run", str(folder), "--eval-every", "0", "--checkpoint-every", "2",
                "--batch", "4", "--threads", "1"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step run in one go, and the same run stopped after 2 steps and resumed."""
    whole, split = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("split")
    run_training(whole, 4)
    run_training(split, 2)
    run_training(split, 4)
    return whole, split


def test_training_resumes_to_the_same_weights(trained):
    """Step k's batch, noise and t depend only on (seed, k), so a resumed run repeats the
    uninterrupted one; the only difference allowed is float32 summation order (one thread here,
    so none is expected, but torch does not promise it): 1e-6 relative."""
    whole, split = (train_checkpoint(f) for f in trained)
    assert whole[1] == split[1] == 4
    assert set(whole[0]) == set(split[0]) and any(name.startswith("adam/") for name in whole[0])
    for name, value in whole[0].items():
        np.testing.assert_allclose(split[0][name], value, rtol=1e-6, atol=1e-7)
    losses = [json.loads(line)["loss"] for line in (trained[0] / "log.jsonl").read_text().splitlines()]
    assert all(np.isfinite(losses))


def test_export_is_reproduced_by_the_numpy_reference(trained):
    """The exported float16 files, loaded by the ordinary loader, run through reference/ and the
    torch model on the same float32 weights. Both compute in float32 over reductions of at most
    128 terms, so they agree to a few float32 ulps of the outputs' scale (bound: 1e-5 relative)."""
    model = load_model(trained[0] / "export" / "transformer", trained[0] / "export" / "t5")
    assert model.mmjit.config == train.SMOKE_MMJIT and model.t5.config == train.SMOKE_T5
    assert model.mmjit.stored_dtypes == ["F16"] and model.sampling == {"steps": 20, "cfg_scale": 3.0}
    ids, mask = model.tokenizer(["a large red circle at the left on a gray background", "a blue cross"])
    t5_params, mmjit_params = nest(model.t5.tensors), nest(model.mmjit.tensors)
    context = t5_encode(t5_params, model.t5.config, ids, mask)
    torch_context = torch_t5_encode(to_torch_tree(t5_params), model.t5.config, torch.from_numpy(ids),
                                    torch.from_numpy(mask)).numpy()
    np.testing.assert_allclose(context, torch_context, rtol=1e-5, atol=1e-5 * np.abs(torch_context).max())
    x = np.random.default_rng(3).standard_normal((2, 3, 64, 64)).astype(np.float32)
    config = model.mmjit.config
    ours = mmjit_forward(mmjit_params, config, x, context, mask)
    theirs = torch_mmjit_forward(to_torch_tree(mmjit_params), config, *map(torch.from_numpy, (x, context, mask))).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5 * np.abs(theirs).max())


def test_the_exported_log_counts_each_step_once_up_to_the_checkpoint():
    """Steps 1-20 logged, the run stopped at 25 and resumed from its checkpoint at 20: steps 21-25
    appear twice (the later records win) and 26-30 are past the exported step 25."""
    first = [{"step": k, "loss": 1.0} for k in range(1, 26)]
    resumed = [{"step": k, "loss": 2.0, "error": 3.0} for k in range(21, 31)] + [{"step": 25, "eval": {"x": 1}}]
    compact = train.compact_log(first + resumed, last_step=25)
    assert compact == [{"step": 10, "loss": 1.0}, {"step": 20, "loss": 1.0}, {"step": 25, "eval": {"x": 1}},
                       {"step": 30, "loss": 2.0, "error": 3.0}]


def test_learning_rate_warms_up_then_decays_to_its_floor():
    recipe = train.Recipe(steps=1000, warmup=100)
    lrs = [train.learning_rate(recipe, k) for k in range(1001)]
    assert lrs[0] == pytest.approx(recipe.lr / 100) and lrs[99] == pytest.approx(recipe.lr)
    assert all(a >= b for a, b in zip(lrs[100:], lrs[101:]))
    assert lrs[-1] == pytest.approx(recipe.lr * recipe.final_lr_fraction)


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], ["--steps", "found 0"]),
    (["--batch", "-2"], ["--batch", "found -2"]),
    (["--eval-every", "-1"], ["--eval-every", "found -1"]),
])
def test_bad_training_arguments_are_one_line(argv, words, tmp_path, capsys):
    assert train.main([*argv, "--run", str(tmp_path / "run"), "--export-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train: error:") and all(w in err for w in words)
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_resuming_with_another_architecture_is_one_line(trained, capsys):
    """The tiny run's checkpoint cannot be resumed as the full demo architecture."""
    assert train.main(["--run", str(trained[0]), "--export-dir", str(trained[0] / "other"), "--steps", "5"]) == 2
    assert "was made with other settings" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2 (130 for Ctrl-C), nothing existing removed or changed


TINY = ["--tiny", "--batch", "4"]  # the settings of the `trained` runs


def training_error(capsys, *argv, status=2) -> str:
    """Run train.main (argparse's exit included); assert the status and one error line, return it."""
    try:
        code = train.main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    assert code == status
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


def snapshot(folder) -> dict:
    """Every file under `folder` with its bytes (and every folder), to prove nothing changed."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def test_export_refuses_a_folder_of_user_files(trained, tmp_path, capsys):
    user = tmp_path / "photos"
    (user / "2024").mkdir(parents=True)
    (user / "2024" / "beach.jpg").write_bytes(b"\xff\xd8 a photo")
    (user / "notes.txt").write_text("mine")
    before = snapshot(user)
    err = training_error(capsys, *TINY, "--run", trained[0], "--export-only", "--export-dir", user)
    assert "holds files that are not a previous export (2024, notes.txt)" in err
    assert snapshot(user) == before


def test_export_refuses_the_run_folder_files_devices_and_links(trained, tmp_path, capsys):
    run = trained[0]
    before = snapshot(run)
    plain = tmp_path / "plain"
    plain.write_text("keep me")
    (tmp_path / "link").symlink_to(run / "export")
    for target, words in ((run, "holds the --run folder"), (run.parent, "holds"), (plain, "is a file, not a folder"),
                          ("/dev/null", "is a character device, not a folder"),
                          (tmp_path / "link", "is a symbolic link")):
        err = training_error(capsys, *TINY, "--run", run, "--export-only", "--export-dir", target)
        assert words in err, err
    assert snapshot(run) == before and plain.read_text() == "keep me"
    assert os.path.exists("/dev/null") and not os.path.isdir("/dev/null")


def test_export_refuses_user_files_of_another_kind_under_export_names(trained, tmp_path, capsys):
    """The names of an export are not enough: a `t5` that is the user's text file, a
    `transformer/config.json` that is a folder of photos, a `t5/tokenizer.json` that links to
    the user's file elsewhere are named with their kind, and nothing is removed."""
    export = trained[0] / "export"
    elsewhere = tmp_path / "mine.json"
    elsewhere.write_text("my tokenizer")
    cases = {"t5 (a file)": lambda f: (f / "t5").write_text("my notes"),
             "transformer/config.json (a folder)": lambda f: (f / "transformer" / "config.json").mkdir(),
             "t5/tokenizer.json (a symbolic link)": lambda f: (f / "t5" / "tokenizer.json").symlink_to(elsewhere)}
    for words, plant in cases.items():
        folder = tmp_path / words.split()[0].replace("/", "-")
        shutil.copytree(export, folder, symlinks=True)
        target = folder / words.split()[0]
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        plant(folder)
        if target.is_dir():
            (target / "photo.jpg").write_bytes(b"\xff\xd8 a photo")
        before = snapshot(folder)
        err = training_error(capsys, *TINY, "--run", trained[0], "--export-only", "--export-dir", folder)
        assert f"holds files that are not a previous export ({words})" in err, err
        assert snapshot(folder) == before
    assert elsewhere.read_text() == "my tokenizer"


def package_files() -> dict[Path, bytes]:
    """Every file of the installed `minit2i` package folder (the demo models' included) with its bytes."""
    package = Path(minit2i.__file__).parent
    return {p: p.read_bytes() for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def test_a_run_without_export_dir_leaves_the_package_as_it_was(tmp_path, monkeypatch):
    """The default --export-dir is the run folder's export/, never the installed package's demo
    model (whose files an editable install shares with the repository)."""
    before = package_files()
    monkeypatch.chdir(tmp_path)
    assert train.main([*TINY, "--steps", "3", "--run", "R", "--eval-every", "0", "--threads", "1"]) == 0
    assert package_files() == before
    assert load_model(tmp_path / "R" / "export" / "transformer", tmp_path / "R" / "export" / "t5").mmjit.config == \
        train.SMOKE_MMJIT


def test_export_dir_naming_the_current_folder_is_refused_before_work(trained, tmp_path, capsys, monkeypatch):
    """`.`, `..` and the current folder by its name would replace the folder the user is in: one
    line, and no staging folder is left behind to block the next run."""
    monkeypatch.chdir(tmp_path)
    for target in (".", "..", tmp_path, tmp_path / "sub" / ".."):
        err = training_error(capsys, *TINY, "--run", trained[0], "--export-only", "--export-dir", target)
        assert "is the current folder, one holding it or a `..`" in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("run, export", [("X", "X"), ("X/run", "X"), ("X", "{tmp}/X")])
def test_an_export_dir_that_is_or_holds_a_new_run_folder_is_refused_before_training(tmp_path, capsys, monkeypatch,
                                                                                    run, export):
    """`--run X --export-dir X` with X new trained for the whole run, then refused its export (the
    two were compared only where the export folder existed already)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "train", lambda *args: pytest.fail("training ran before the export folder was checked"))
    err = training_error(capsys, *TINY, "--run", run, "--export-dir", export.format(tmp=tmp_path))
    assert f"--export-dir {export.format(tmp=tmp_path)} holds the --run folder {run}, which export would replace" in err
    assert os.listdir(tmp_path) == []


def test_an_unwritable_export_parent_is_found_before_training(tmp_path, capsys, monkeypatch):
    """The same os.access check a normal user's run makes (tests may run as root)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real_access(p, mode))
    monkeypatch.setattr(train, "train", lambda *args: pytest.fail("training ran before the export folder was checked"))
    err = training_error(capsys, *TINY, "--run", tmp_path / "run", "--export-dir", locked / "new" / "export")
    assert f"--export-dir folder {locked} is not writable" in err, err
    assert os.listdir(locked) == [] and not (tmp_path / "run").exists()


def test_a_damaged_training_log_is_one_line_naming_its_line(trained, tmp_path, capsys):
    """A log line that is not JSON, or not a record with a step, is named with its file and line
    number before any step runs (the log is read at export, after the training)."""
    for line, words in (('{"step": 3, "lo', "line 2 of the training log"),
                        ('{"step": "three"}', 'line 2 of the training log {}: expected a record with a step')):
        run = tmp_path / f"run{len(line)}"
        run.mkdir()
        shutil.copy(trained[0] / train.CHECKPOINT, run)
        (run / "log.jsonl").write_text('{"step": 1, "loss": 0.5}\n' + line + "\n")
        before = snapshot(run)
        for mode in (["--export-only"], ["--steps", "6"]):
            err = training_error(capsys, *TINY, "--run", run, "--export-dir", tmp_path / "out", *mode)
            assert words.format(run / "log.jsonl") in err, err
        assert snapshot(run) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize("log, mode, words", [
    ("log.jsonl", ["--steps", "6"], "training log {}: expected a file, found a FIFO"),
    ("sweep.jsonl", ["--sweep", "--sweep-steps", "1", "--sweep-cfg", "2", "--eval-prompts", "1"],
     "cannot append to the run's log {} (a FIFO)"),
])
def test_a_fifo_in_place_of_a_run_log_is_refused_not_waited_on(trained, tmp_path, capsys, log, mode, words):
    """The run runs in a thread, so that blocking on the FIFO fails the test after 60 s (the
    refused run takes under a second; the sweep's one evaluation a few)."""
    import threading

    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(trained[0] / train.CHECKPOINT, run)
    os.mkfifo(run / log)
    errors = []
    worker = threading.Thread(target=lambda: errors.append(
        training_error(capsys, *TINY, "--run", run, "--export-dir", tmp_path / "out", *mode)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), f"the run blocked on the FIFO {log}"
    assert words.format(run / log) in errors[0], errors[0]


def test_export_replaces_a_previous_export_and_keeps_it_if_interrupted(trained, tmp_path, capsys, monkeypatch):
    export = tmp_path / "export"
    assert train.main([*TINY, "--run", str(trained[0]), "--export-only", "--export-dir", str(export)]) == 0
    before = snapshot(export)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "save_model", interrupted)
    assert training_error(capsys, *TINY, "--run", trained[0], "--export-only", "--export-dir", export,
                          status=130) == "train: interrupted\n"
    assert snapshot(export) == before and sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    monkeypatch.undo()
    assert train.main([*TINY, "--run", str(trained[0]), "--export-only", "--export-dir", str(export)]) == 0
    assert snapshot(export) == before  # the same checkpoint exports the same files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_crafted_checkpoint_cannot_run_code(tmp_path, capsys):
    """A pickle that would create a file when unpickled, as checkpoint.pt (the old format) and
    as checkpoint.safetensors: neither is unpickled."""
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for name in ("checkpoint.pt", train.CHECKPOINT):
        run = tmp_path / name.replace(".", "-")
        run.mkdir()
        (run / name).write_bytes(pickle.dumps(Payload()))
        err = training_error(capsys, *TINY, "--run", run, "--export-only", "--export-dir", tmp_path / "out")
        assert "never loaded" in err if name == "checkpoint.pt" else "is not a readable checkpoint" in err
    assert not marker.exists() and not (tmp_path / "out").exists()


def damaged_checkpoints(source) -> dict[str, bytes]:
    """A good checkpoint cut short, with a tensor of another shape, with a tensor missing, with
    another step type, and from another run's settings."""
    from safetensors import safe_open
    from safetensors.numpy import save

    good = (source / train.CHECKPOINT).read_bytes()
    tensors, _ = train_checkpoint(source)
    with safe_open(str(source / train.CHECKPOINT), framework="numpy") as f:
        record = json.loads(f.metadata()["run"])
    name = sorted(k for k in tensors if k.startswith("params/"))[0]

    def with_(changed, **fields):
        return save(changed, metadata={"run": json.dumps({**record, **fields})})

    adam = sorted(k for k in tensors if k.startswith("adam/") and k.endswith("/exp_avg"))[0].removesuffix("/exp_avg")

    def poisoned(name, value, at=0):
        changed = tensors[name].copy()
        changed.reshape(-1)[at] = value
        return with_({**tensors, name: changed})

    return {
        "truncated": good[:len(good) // 2],
        "negative step": poisoned(f"{adam}/step", -3),
        "fractional step": poisoned(f"{adam}/step", 1.5),
        "NaN weight": poisoned(name, np.nan),
        "Inf EMA": poisoned(name.replace("params/", "ema/"), np.inf, at=-1),
        "NaN moment": poisoned(f"{adam}/exp_avg", np.nan),
        "negative second moment": poisoned(f"{adam}/exp_avg_sq", -1.0),
        "reshaped": with_({**tensors, name: np.zeros(3, np.float32)}),
        "missing": with_({k: v for k, v in tensors.items() if k != name}),
        "step": with_(tensors, step="4"),
        "settings": with_(tensors, identity={"recipe": {}}),
    }


@pytest.mark.parametrize("damage, words", [
    ("truncated", ["is not a readable checkpoint"]),
    ("negative step", ["/step is -3, expected a whole number of optimiser steps in [0, 4]"]),
    ("fractional step", ["/step is 1.5, expected a whole number"]),
    ("NaN weight", [": params/", "holds 1 NaN or Inf value(s) of"]),
    ("Inf EMA", [": ema/", "holds 1 NaN or Inf value(s) of"]),
    ("NaN moment", ["/exp_avg holds 1 NaN or Inf value(s)"]),
    ("negative second moment", ["/exp_avg_sq holds negative values"]),
    ("reshaped", ["is float32 [3], expected float32"]),
    ("missing", ["missing params/"]),
    ("step", ['step must be an integer in [0, 10000000], found "4" (a string)']),
    ("settings", ["was made with other settings"]),
])
def test_damaged_checkpoints_are_one_line(trained, tmp_path, capsys, damage, words):
    run = tmp_path / "run"
    run.mkdir()
    (run / train.CHECKPOINT).write_bytes(damaged_checkpoints(trained[0])[damage])
    before = snapshot(run)
    for mode in (["--export-only"], ["--steps", "6"], ["--sweep", "--sweep-steps", "1", "--eval-prompts", "1"]):
        err = training_error(capsys, *TINY, "--run", run, "--export-dir", tmp_path / "out", *mode)
        assert all(w in err for w in words), err
    assert snapshot(run) == before and not (tmp_path / "out").exists()


def test_nothing_is_exported_or_evaluated_without_a_checkpoint(tmp_path, capsys):
    for mode in (["--export-only"], ["--sweep"]):
        err = training_error(capsys, *TINY, "--run", tmp_path / "run", "--export-dir", tmp_path / "out", *mode)
        assert "no checkpoint in --run" in err
    assert sorted(tmp_path.iterdir()) == []


def test_non_finite_weights_are_not_exported(trained, tmp_path, capsys, monkeypatch):
    real_resume = train.Run._resume

    def diverged(self):
        real_resume(self)
        next(iter(self.ema.values())).fill_(float("nan"))

    monkeypatch.setattr(train.Run, "_resume", diverged)
    err = training_error(capsys, *TINY, "--run", trained[0], "--export-only", "--export-dir", tmp_path / "out")
    assert "the weights hold NaN or Inf" in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv, words", [
    (["--seed", "-1"], ["--seed", "found -1"]),
    (["--threads", "100000"], ["--threads", "found 100000"]),
    (["--sweep", "--sweep-steps", "-5"], ["--sweep-steps must be an integer in [1, 10000], found -5"]),
    (["--sweep", "--sweep-steps", "0"], ["--sweep-steps", "found 0"]),
    (["--sweep", "--sweep-cfg", "nan"], ["--sweep-cfg", "found nan"]),
    (["--cfg-scale", "inf"], ["--cfg-scale", "found inf"]),
    (["--steps", "x"], ["argument --steps: invalid int value: 'x'"]),
    (["--low-noise-fraction", "1.5"], ["--low-noise-fraction", "found 1.5"]),
    (["--low-noise-t-min", "-0.1"], ["--low-noise-t-min", "found -0.1"]),
    (["--phrase-probability", "1.01"], ["--phrase-probability", "found 1.01"]),
])
def test_more_bad_training_arguments_are_one_line(argv, words, tmp_path, capsys):
    err = training_error(capsys, *argv, "--run", tmp_path / "run", "--export-dir", tmp_path / "out")
    assert err.startswith("train: error:") and all(w in err for w in words), err
    assert sorted(tmp_path.iterdir()) == []


def test_run_folder_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "run").write_text("keep")
    assert "--run" in training_error(capsys, *TINY, "--run", tmp_path / "run", "--export-dir", tmp_path / "out")
    assert (tmp_path / "run").read_text() == "keep"


TRAINING_FLAGS = ["--steps", "--batch", "--seed", "--threads", "--eval-every", "--eval-prompts", "--checkpoint-every",
                  "--sample-steps", "--cfg-scale", "--sweep-steps", "--sweep-cfg"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flags=st.dictionaries(st.sampled_from(TRAINING_FLAGS), st.one_of(
    st.integers(-2**64, 2**64), st.integers(-3, 3), st.floats(allow_nan=True),
    st.sampled_from(["", "x", "nan", "inf", "1e999"])), min_size=1, max_size=3))
def test_generated_training_arguments(tmp_path, capsys, monkeypatch, flags):
    """Any mix of argument values: one line and nothing created, or every check passes (the run
    is then stopped where training would start)."""
    monkeypatch.setattr(train, "run_command", lambda args: 0)
    argv = [a for flag, value in flags.items() for a in (flag, str(value))]
    with tempfile.TemporaryDirectory(dir=tmp_path) as root:
        try:
            code = train.main([*argv, "--run", f"{root}/run", "--export-dir", f"{root}/out"])
        except SystemExit as exit_:
            code = exit_.code
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert code == 0 or (code == 2 and err.count("\n") == 1 and err.startswith("train: error:")), err
        assert os.listdir(root) == []
