"""Score a `minit2i batch` run of a demo model with the shape checker (evaluate.py), as GenEval
scores a run of a real model: accuracy per attribute, held-in scenes and held-out colour-shape
pairs apart, and the misses as thumbnails.

    python -m minit2i.training.score --write-prompts prompts.jsonl     # 64 held-in + 32 held-out scenes
    minit2i batch prompts.jsonl --out runs/demo -n 4                   # any engine, resumable
    python -m minit2i.training.score runs/demo                         # runs/demo/score.{md,json}, score-misses.png

The prompt file is GenEval's metadata format: each line a full caption ("prompt"), its group
("tag": held_in or held_out) and the scene it names ("scene"), which the checker compares with
what it reads back from every image of that prompt the run's manifest lists.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from minit2i.batch import store
from minit2i.console import OneLineParser, emit, guarded, printable
from minit2i.core.checks import Range
from minit2i.core.errors import MiniT2IError
from minit2i.core.files import check_output_file, write_atomically
from minit2i.core.images import png_bytes

from . import evaluate, shapes

GROUPS = ("held_in", "held_out")
SCORED = "score.md", "score.json", "score-misses.png"


def prompt_lines(prompts: int, held_out_prompts: int | None = None) -> list[dict]:
    """GenEval-style metadata of the scenes `evaluate.evaluation_scenes` picks (one seed each)."""
    return [{"prompt": scene.caption(), "tag": GROUPS[held_out], "scene": vars(scene)}
            for scene, _, held_out in evaluate.evaluation_scenes(prompts, 1, held_out_prompts)]


def read_run(out: Path) -> tuple[list, list[np.ndarray], list[str]]:
    """([(scene, seed, held_out)], uint8 images at the checker's size, store paths) of every image
    the run's manifest lists, in manifest order; the folder is read as `minit2i batch --export`
    reads it (store.read_run: nothing in it created or changed, every file checked before it is read)."""
    run = store.read_run(out, "the run folder")
    entries = sorted(run.done.values(), key=lambda e: (e["index"], e["k"]))
    if not entries:
        raise MiniT2IError(f"{out}/{store.MANIFEST} lists no image; draw the run first (minit2i batch)")
    scenes, pixels = [], []
    for entry in entries:
        scene, held_out = scene_of(out, entry["index"])
        scenes.append((scene, entry["seed"], held_out))
        pixels.append(evaluate.at_checker_size(run.image(entry)[1]))
    return scenes, pixels, [entry["path"] for entry in entries]


def scene_of(out: Path, index: int) -> tuple[shapes.Scene, bool]:
    """The scene a prompt's metadata.jsonl names, and whether its colour-shape pair is held out."""
    fields = store.read_metadata(out, index).get("scene")
    tables = {"size": shapes.SIZES, "colour": shapes.COLOURS, "shape": shapes.SHAPES, "position": shapes.POSITIONS,
              "background": shapes.BACKGROUNDS}
    if not (isinstance(fields, dict) and set(fields) == set(tables)
            and all(isinstance(fields[k], str) and fields[k] in table for k, table in tables.items())):
        raise MiniT2IError(f"{out / store.metadata_path(index)} names no demo scene (a \"scene\" with "
                           f"{', '.join(tables)}); score runs drawn from the prompts `score --write-prompts` writes")
    scene = shapes.Scene(**fields)
    return scene, (scene.colour, scene.shape) in shapes.HELD_OUT


def all_correct(scenes, pixels) -> dict[str, float]:
    """{group: the share of its images with every attribute read right} (GenEval's per-image score)."""
    wrong = {i for i, _ in evaluate.misread(scenes, pixels)}
    shares = {}
    for group, wanted in zip(GROUPS, (False, True)):
        members = [i for i, (_, _, held_out) in enumerate(scenes) if held_out == wanted]
        if members:
            shares[group] = float(np.mean([i not in wrong for i in members]))
    return shares


def main(argv=None) -> int:
    def command() -> int:
        p = OneLineParser(prog="score", description=__doc__.splitlines()[0])
        p.add_argument("run", nargs="?", type=Path, default=None, help="the run folder of `minit2i batch`")
        p.add_argument("--write-prompts", type=Path, default=None, metavar="FILE",
                       help="write the prompt file of the demo scenes instead (GenEval's metadata format)")
        p.add_argument("--prompts", type=int, default=64, help="held-in scenes (held-out: half as many)")
        args = p.parse_args(argv)
        Range(1, 10**4).check("--prompts", args.prompts)
        if args.write_prompts is not None:
            check_output_file(args.write_prompts, "--write-prompts")
            lines = prompt_lines(args.prompts)
            write_atomically(args.write_prompts, "".join(json.dumps(line) + "\n" for line in lines).encode())
            emit(f"{printable(str(args.write_prompts), None)}: {len(lines)} prompts")
            return 0
        if args.run is None:
            raise MiniT2IError("pass a run folder to score, or --write-prompts FILE")
        scenes, pixels, paths = read_run(args.run)
        report = evaluate.accuracy_report(scenes, pixels) | {"all_correct": all_correct(scenes, pixels)}
        wrong = evaluate.misread(scenes, pixels)
        report["misses"] = [{"path": paths[i], "read": read} for i, read in wrong]
        table = evaluate.markdown_table(report)
        overall = " | ".join(f"{group.replace('_', '-')}: {share:.0%}" for group, share in report["all_correct"].items())
        text = f"{table}\n\nimages with every attribute right: {overall}\n\n{len(wrong)} of {len(scenes)} images read wrong"
        text += "".join(f"\n- {paths[i]}: {evaluate.misread_line(scenes[i], read)}" for i, read in wrong)
        write_atomically(args.run / SCORED[0], (text + "\n").encode())
        write_atomically(args.run / SCORED[1], (json.dumps(report, indent=2) + "\n").encode())
        if wrong:
            sheet = evaluate.contact_sheet([pixels[i] for i, _ in wrong])
            write_atomically(args.run / SCORED[2], png_bytes(sheet))
        emit(text)
        return 0

    return guarded("score", command)


if __name__ == "__main__":
    sys.exit(main())
