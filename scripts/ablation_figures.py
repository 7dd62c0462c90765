"""Run the watch-it-learn experiments and draw their sheets for docs/concepts.md (the `train` extra):

    python scripts/ablation_figures.py             # every run into runs/ablations/, then the sheets

Each experiment is one `python -m minit2i.training.learn --out runs/ablations/NAME SWITCHES`
command (EXPERIMENTS), the baseline the same command without switches; a finished run is only
read again, an interrupted one resumes. The loss plots of LOSS_FIGURES are copied as they are.
Each sheet (docs/figures/ablation-*.png) shows the data's
row, then for each run its samples at the middle snapshot and at the end, labelled (the caption
drop's sheet also the final weights at guidance 1); the script prints the checker's final counts
of every run, as the tables of concepts.md quote them. Runs are
deterministic on one thread, so the sheets come out byte for byte the same.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from make_figures import FIGURES
from minit2i.console import emit
from minit2i.core.images import save_png
from minit2i.training import learn
from minit2i.training.evaluate import evaluation_scenes
from minit2i.training.train import compact_log, read_log

RUNS = Path("runs/ablations")
# name: (the switches, a label of at most ten characters for the sheet)
EXPERIMENTS = {
    "baseline": ([], "x0 (model)"),
    "velocity": (["--predict", "velocity"], "velocity"),
    "noise": (["--predict", "noise"], "noise"),
    "no-positions": (["--positions", "none"], "none"),
    "no-caption-drop": (["--caption-drop", "0"], "drop 0"),
    "patch8": (["--patch", "8"], "x0, p 8"),
    "patch8-velocity": (["--patch", "8", "--predict", "velocity"], "v, p 8"),
    "velocity-wide": (["--predict", "velocity", "--bottleneck", "48"], "v, b 48"),
    "sincos-only": (["--positions", "sincos"], "sin/cos"),
    "rope-only": (["--positions", "rope"], "RoPE only"),
    # concepts.md 2's exercise: a short run that closes on the floor its bottleneck predicts.
    "predict-v32": (["--predict", "velocity", "--bottleneck", "32", "--steps", "500", "--eval-prompts", "8"],
                    "v, b 32"),
}
# The loss plots shown as they are (learn's loss.png, the predicted floor dashed): figure: run.
LOSS_FIGURES = {"ablation-velocity-loss.png": "velocity", "ablation-noise-loss.png": "noise",
                "ablation-v32-loss.png": "predict-v32"}
# The runs also drawn and read back at guidance 1 (the conditional prediction alone, no
# unconditional branch): whether a run draws well without guidance, or guidance breaks it.
UNGUIDED = ("baseline", "no-caption-drop")
# The sheet of each concepts.md section: the runs it sets beside each other, and those of them
# shown again at guidance 1.
SHEETS = {
    "ablation-prediction.png": (("baseline", "velocity", "noise", "patch8", "patch8-velocity", "velocity-wide"), ()),
    "ablation-caption-drop.png": (("baseline", "no-caption-drop"), UNGUIDED),
    "ablation-positions.png": (("baseline", "rope-only", "sincos-only", "no-positions"), ()),
}


def run_all() -> None:
    """Each experiment's run, finished or resumed; a failed run stops nothing after it."""
    failed = []
    for name, (switches, _) in EXPERIMENTS.items():
        emit(f"--- {name}: learn --out {RUNS / name} {' '.join(switches)}")
        if learn.main(["--out", str(RUNS / name), *switches]) != 0:
            failed.append(name)
    if failed:
        sys.exit(f"these runs failed: {', '.join(failed)}; their errors are above")


def final_report(name: str) -> tuple[int, dict]:
    """(the last snapshot step, the checker's report there) of a finished run."""
    steps = learn.rows_taken(RUNS / name)
    reports = {r["step"]: r["eval"] for r in read_log(RUNS / name / "log.jsonl") if "eval" in r}
    return steps[-1], reports[steps[-1]]


def finished_run(name: str):
    """The finished run `name` (learn.AblationRun at its last checkpoint)."""
    return learn.run_of(learn.parse_args(["--out", str(RUNS / name), *EXPERIMENTS[name][0]]))


def sheet(names: tuple[str, ...], unguided: tuple[str, ...]):
    """The data's row, then each run's rows at its middle and last snapshots (guidance 3), and for
    the `unguided` runs the last one again at guidance 1, labelled."""
    rows, labels = [learn.data_row(learn.LEARN_MMJIT.image_size)], ["the data"]
    for name in names:
        steps = learn.rows_taken(RUNS / name)
        for step in (steps[-2], steps[-1]):
            rows.append(learn.read_row(learn.row_path(RUNS / name, step), len(learn.SHEET_SCENES),
                                       learn.LEARN_MMJIT.image_size))
            labels.append(f"{EXPERIMENTS[name][1]}\n{step}")
        if name in unguided:
            rows.append(learn.sheet_row(finished_run(name), 1.0))
            labels.append(f"{EXPERIMENTS[name][1]}\n{steps[-1]}, g 1")
    return learn.sample_sheet(rows, labels)


def score_table() -> str:
    """A markdown table: each run's switches, its last 10-step mean loss and the checker's final
    counts (guidance 3), and the UNGUIDED runs' counts at guidance 1."""
    lines = ["| run | switches | loss | " + " | ".join(learn.ATTRIBUTES) + " |",
             "| --- | --- | --- |" + " --- |" * len(learn.ATTRIBUTES)]
    scenes = evaluation_scenes(learn.EVAL_PROMPTS, seeds=1)
    for name, (switches, _) in EXPERIMENTS.items():
        step, report = final_report(name)
        loss = [r for r in compact_log(read_log(RUNS / name / "log.jsonl"), step) if "loss" in r][-1]["loss"]
        reports = [("", report)]
        if name in UNGUIDED:
            reports.append((", guidance 1", finished_run(name).evaluate(scenes, learn.SAMPLE_STEPS, 1.0)))
        for suffix, counted in reports:
            counts = learn.right_counts(counted)
            lines.append(f"| {name}{suffix} | `{' '.join(switches) or '(none)'}` | {loss:.4f} | "
                         + " | ".join(str(counts[a]) for a in learn.ATTRIBUTES) + " |")
    return "\n".join(lines)


def main() -> None:
    run_all()
    for filename, (names, unguided) in SHEETS.items():
        save_png(sheet(names, unguided), FIGURES / filename)
    for filename, name in LOSS_FIGURES.items():
        shutil.copyfile(RUNS / name / "loss.png", FIGURES / filename)
    emit(score_table())


if __name__ == "__main__":
    main()
