"""Check a learner's function against the reference: on every case of its exercise, the first case
where the two disagree named with the inputs, the element and by how much; for a sampler piece,
the demo model's picture drawn with the learner's function in the sampler's place.

The learner's file is run as Python: running the learner's own code is the point of the exercise,
so only files the learner wrote should be checked (docs/exercises.md says so).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from minit2i.core.checks import existing_path
from minit2i.core.errors import MiniT2IError

from . import Exercise

# How close a correct function comes, relative to the largest value the reference returns. The
# inputs are float64 (and one float32 case of each sampler piece): a function computed in another
# order differs by a few roundings per reduced term, under 1e-13 of the largest value in float64
# for the cases' at most a few hundred terms (1e-5 in float32); a mistake misses by far more.
TOLERANCE = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-5}
SOURCE_LIMIT = 2**20  # bytes: an exercise file is a page of Python
PROMPT = "a large red circle at the left on a gray background"
SEED = 42


@dataclass
class Verdict:
    """Whether every case agreed, the lines that say so (or say where the first did not), and
    whether the learner's function returned on every case it was given (wrong or right)."""

    agrees: bool
    lines: list[str]
    runs: bool = True


def load_solution(path, name: str):
    """The function `name` defined by the Python file at `path`, which is run to define it; a file
    that cannot be read or run, or defines no such function, is one line (MiniT2IError)."""
    file = existing_path(path)
    if not file.is_file():
        raise MiniT2IError(f"{path} is a folder; pass the .py file you wrote from the stub")
    if file.suffix != ".py":
        raise MiniT2IError(f"{path} is not a .py file; start one from the stub: minit2i exercise {name} > {name}.py")
    if file.stat().st_size > SOURCE_LIMIT:
        raise MiniT2IError(f"{path} is over {SOURCE_LIMIT // 2**20} MiB, not an exercise file; pass the .py file "
                           "you wrote from the stub")
    try:
        code = compile(file.read_bytes(), str(file), "exec")
    except SyntaxError as err:
        raise MiniT2IError(f"{path}, line {err.lineno}: {err.msg}; fix the file and check it again") from None
    except ValueError as err:  # null bytes
        raise MiniT2IError(f"{path} is not Python source ({err}); pass the .py file you wrote") from None
    namespace = {"__name__": f"exercise_{name}", "__file__": str(file)}
    try:
        exec(code, namespace)  # noqa: S102 (the learner's own file, run on purpose: module docstring)
    except Exception as err:  # noqa: BLE001 (any failure of the learner's module is one line)
        raise MiniT2IError(f"{path} failed while it was loaded ({type(err).__name__}: {err}); fix the file and "
                           "check it again") from None
    function = namespace.get(name)
    if not callable(function):
        raise MiniT2IError(f"{path} defines no function {name}; keep the stub's name (minit2i exercise {name})")
    return function


def describe(case: dict) -> str:
    """'x float64 [2, 3, 8, 8], factor 0.5': each input of a case, an array by its dtype and shape."""
    def one(value):
        if isinstance(value, np.ndarray):
            return f"{value.dtype} [{', '.join(map(str, value.shape))}]"
        return f"{value:g}" if isinstance(value, float) else str(value)
    return ", ".join(f"{name} {one(value)}" for name, value in case.items())


def disagreement(yours, expected: np.ndarray) -> str | None:
    """How `yours` fails to be `expected` (its type, shape, dtype, a value that is not finite or one
    off by more than TOLERANCE), or None."""
    if not isinstance(yours, np.ndarray):
        return f"yours returns {type(yours).__name__} where the reference returns an array"
    if yours.shape != expected.shape:
        return f"yours has shape {list(yours.shape)} where the reference's has {list(expected.shape)}"
    if yours.dtype != expected.dtype:
        return f"yours is {yours.dtype} where the reference's is {expected.dtype} (keep the inputs' dtype)"
    bad = ~np.isfinite(yours) & np.isfinite(expected)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        return f"yours is {yours[at]} at {list(at)}, where the reference's is {expected[at]:.6g}"
    difference = np.abs(yours.astype(np.float64) - expected)
    allowed = TOLERANCE[expected.dtype] * max(float(np.abs(expected).max()), 1.0)
    if difference.max() <= allowed:
        return None
    at = np.unravel_index(np.argmax(difference), difference.shape)
    return (f"yours differs by up to {difference[at]:.3g} at {[int(i) for i in at]} (yours {yours[at]:.6g}, the "
            f"reference's {expected[at]:.6g}; allowed {allowed:.1g})")


def copies(case: dict) -> dict:
    """A case's inputs, each array a fresh copy: neither function sees what the other changed."""
    return {name: value.copy() if isinstance(value, np.ndarray) else value for name, value in case.items()}


def check(exercise: Exercise, yours, seed: int = 0) -> Verdict:
    """`yours` against `exercise.reference` on its cases drawn with `seed`, stopping at the first
    that disagrees."""
    cases = exercise.cases(np.random.default_rng(seed))
    for number, case in enumerate(cases, 1):
        expected = exercise.reference(**copies(case))
        where = f"case {number} of {len(cases)} ({describe(case)})"
        try:
            with np.errstate(all="ignore"):  # an overflow shows as the value it leaves, named below
                got = yours(**copies(case))
        except NotImplementedError:
            return Verdict(False, [f"{exercise.name}: not written yet (it raises NotImplementedError); write it "
                                   "in the file and check it again"], runs=False)
        except Exception as err:  # noqa: BLE001 (the learner's failure is the verdict, in one line)
            return Verdict(False, [f"{exercise.name}: {where}: yours raised {type(err).__name__}: {err}"], runs=False)
        problem = disagreement(got, expected)
        if problem:
            return Verdict(False, [f"{exercise.name}: {where}: {problem}"])
    return Verdict(True, [f"{exercise.name}: all {len(cases)} cases agree with the reference's"])


@contextlib.contextmanager
def swapped(module, name: str, function):
    """`module.name` is `function` meanwhile: the sampler looks its pieces up in its module."""
    before = getattr(module, name)
    setattr(module, name, function)
    try:
        yield
    finally:
        setattr(module, name, before)


def draw(exercise: Exercise, yours) -> tuple[np.ndarray, np.ndarray]:
    """(the picture drawn with `yours` in the sampler, the reference's), uint8 [H, W, 3] each: the
    exercise's demo model on PROMPT, seed SEED, at its own settings, on the NumPy reference."""
    from minit2i.pipeline import Request, generate, load_model, make_runner, sampling_defaults

    model = load_model(exercise.draws_with)
    runner = make_runner(model)
    request = Request(PROMPT, seed=SEED, **sampling_defaults(model))
    reference = generate(model, runner, request).pixels[0]
    with swapped(exercise.swapped_in, exercise.name, yours):
        mine = generate(model, runner, request).pixels[0]
    return mine, reference


def picture_line(exercise: Exercise, mine: np.ndarray, reference: np.ndarray) -> str:
    """What the picture drawn with the learner's function looks like next to the reference's."""
    drawn = f'{exercise.draws_with} drew "{PROMPT}" (seed {SEED}) with your {exercise.name}'
    difference = np.abs(mine.astype(np.int16) - reference)
    if not difference.any():
        return f"{drawn}: the reference's picture, pixel for pixel"
    return (f"{drawn}: off the reference's picture by up to {difference.max()} levels of 255 "
            f"(mean {difference.mean():.1f})")


def side_by_side(mine: np.ndarray, reference: np.ndarray, gap: int = 4) -> np.ndarray:
    """uint8 [H, 2W + gap, 3]: the learner's picture, a white gap, the reference's."""
    white = np.full((mine.shape[0], gap, 3), 255, np.uint8)
    return np.concatenate([mine, white, reference], axis=1)

