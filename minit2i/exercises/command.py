"""`minit2i exercise`: list the write-it-yourself exercises, print one's stub, or check a file.

    minit2i exercise                          # the exercises, one a line
    minit2i exercise rms_norm > rms_norm.py   # the stub to start from
    minit2i exercise rms_norm rms_norm.py     # check it: exit 0 if it agrees, 1 if not

A sampler piece is also drawn with: the demo model's picture with the learner's function in the
sampler's place, against the reference's (`--output` writes the two side by side).
"""

from __future__ import annotations

from minit2i.core.errors import MiniT2IError
from minit2i.core.images import check_writable, save_png

from ..console import emit
from . import EXERCISES, stub
from .check import check, draw, load_solution, picture_line, side_by_side


def add_parser(sub) -> None:
    p = sub.add_parser("exercise", help="write a function of the model yourself and check it against the reference",
                       description="Without NAME: the exercises. With NAME: its stub (redirect it into a file). "
                                   "With NAME and FILE: run FILE (your own Python: it is executed) and check its "
                                   "function against the reference on drawn inputs (docs/exercises.md).")
    p.add_argument("name", nargs="?", default=None, metavar="NAME", help=f"one of {', '.join(EXERCISES)}")
    p.add_argument("file", nargs="?", default=None, metavar="FILE", help="your .py file, started from the stub")
    p.add_argument("--output", default=None,
                   help="for a sampler piece: write the picture drawn with yours beside the reference's (PNG)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn inputs (default 0)")
    p.set_defaults(run=run_exercise)


def run_exercise(args) -> int:
    if args.name is None:
        width = max(map(len, EXERCISES))
        emit("\n".join(f"{name:<{width}}  {e.title}{' (drawn)' if e.swapped_in else ''}"
                       for name, e in EXERCISES.items()))
        return 0
    exercise = EXERCISES.get(args.name)
    if exercise is None:
        raise MiniT2IError(f"no exercise named {args.name!r}; choose one of {', '.join(EXERCISES)}")
    if args.file is None:
        if args.output is not None:
            raise MiniT2IError("--output needs FILE: minit2i exercise NAME FILE --output PNG")
        emit(stub(exercise).rstrip("\n"))
        return 0
    if args.output is not None:
        if exercise.swapped_in is None:
            raise MiniT2IError(f"{exercise.name} is no sampler piece, so nothing is drawn; drop --output "
                               f"(drawn: {', '.join(n for n, e in EXERCISES.items() if e.swapped_in)})")
        check_writable(args.output)
    yours = load_solution(args.file, exercise.name)
    verdict = check(exercise, yours, args.seed)
    emit("\n".join(verdict.lines))
    if exercise.swapped_in is not None and verdict.runs:
        draw_with(exercise, yours, args.output)
    return 0 if verdict.agrees else 1


def draw_with(exercise, yours, output) -> None:
    """Draw the exercise's picture with `yours` in the sampler and say how far it is from the
    reference's; write both to `output` where given. A function that breaks the sampler (a wrong
    shape, a NaN state) is one line: it is the learner's to fix, not the checker's failure."""
    try:
        mine, reference = draw(exercise, yours)
    except Exception as err:  # noqa: BLE001 (the learner's function broke the sampler: one line)
        emit(f"{exercise.draws_with} could not draw with your {exercise.name} ({type(err).__name__}: {err})")
        return
    emit(picture_line(exercise, mine, reference))
    if output is not None:
        save_png(side_by_side(mine, reference), output)
        emit(f"wrote {output}: yours on the left, the reference's on the right")
