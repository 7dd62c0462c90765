"""CuPy 14.2's dtype rules, which cudasim's stand-in follows where they are not NumPy's.

A CuPy ufunc is a list of loops ("ff->f", ...) tried in order: the first whose every input the
operands can be cast to safely (`numpy.can_cast`) runs, and its types are the result's
(cupy/_core/_kernel.pyx, `_Ops._guess_routine_from_in_types`). A Python int, float or complex is a
weak scalar: it fits a loop whose type it does not promote (`numpy.result_type(kind(0), t) == t`),
provided some array operand is of at least its kind (`_check_should_use_weak_scalar`); a Python
bool and NumPy scalars are strong. bfloat16 (ml_dtypes, character "E") has a loop only where CuPy
lists one (cupy/_util.pyx, `bf16_loop`, present when ml_dtypes imports), and `where` has none
(cupy/_sorting/search.py, `_where_ufunc`): `where(c, bf16, bf16)` runs the float32 loop and comes
back float32, where NumPy with ml_dtypes keeps bfloat16. With ml_dtypes' promotion
(`result_type(0.0, bfloat16)` is float64) a Python float does not fit the bfloat16 loop either:
`bf16 + 1.0` is float32 on CuPy.

A 16-bit loop computes in float32 and rounds once on the store: CuPy's device types `float16`
and `bfloat16` convert to float for every operation (cupy/_core/include/cupy/float16.cuh,
bfloat16.cuh). tests/test_cudasim.py checks each table against the real `cupy.<name>.types`
where CuPy imports (the [compile] extra), so a CuPy release that changes a loop fails there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

try:
    import ml_dtypes
except ImportError:  # CuPy then has no bfloat16 loops either
    ml_dtypes = None

_INTEGER_PAIRS = ("bb->b", "BB->B", "hh->h", "HH->H", "ii->i", "II->I", "ll->l", "LL->L", "qq->q", "QQ->Q")
_FLOAT_PAIRS = ("ee->e", "EE->E", "ff->f", "dd->d", "FF->F", "DD->D")
_UNARY = ("?->?", "b->b", "B->B", "h->h", "H->H", "i->i", "I->I", "l->l", "L->L", "q->q", "Q->Q",
          "e->e", "E->E", "f->f", "d->d", "F->F", "D->D")
_COMPARISON = ("??->?", "qq->?", "QQ->?", "qQ->?", "Qq->?", "ee->?", "EE->?", "ff->?", "dd->?", "FF->?", "DD->?")
_MATH = ("e->e", "E->E", "f->f", "d->d", "F->F", "D->D")

# CuPy 14.2's loops, in its order, under NumPy's ufunc names (`cupy.<name>.types`), and where each is made.
LOOPS = {
    # cupy/_core/_routines_math.pyx, create_arithmetic: bool + bool is `|`, bool * bool `&`, bool - bool an error
    "add": ("??->?", *_INTEGER_PAIRS, *_FLOAT_PAIRS),
    "subtract": ("??->?", *_INTEGER_PAIRS, *_FLOAT_PAIRS),
    "multiply": ("??->?", *_INTEGER_PAIRS, *_FLOAT_PAIRS),
    # cupy/_core/_routines_math.pyx, _true_divide (cupy.divide is the same ufunc): integers divide as float64
    "divide": ("qq->d", "qQ->d", "Qq->d", "QQ->d", *_FLOAT_PAIRS),
    # cupy/_core/_routines_math.pyx, _negative (bool: an error) and _absolute (complex: its real type)
    "negative": _UNARY,
    "absolute": (*_UNARY[:-2], "F->f", "D->d"),
    # cupy/_core/_routines_logic.pyx, create_comparison (no_complex_dtype=False for both)
    "greater": _COMPARISON,
    "less": _COMPARISON,
    # cupy/_math/explog.py, trigonometric.py: create_math_ufunc
    "exp": _MATH,
    "sin": _MATH,
    "cos": _MATH,
    # cupy/_sorting/search.py, _where_ufunc: no bfloat16 loop
    "where": ("???->?", "?bb->b", "?BB->B", "?hh->h", "?HH->H", "?ii->i", "?II->I", "?ll->l", "?LL->L", "?qq->q",
              "?QQ->Q", "?ee->e", "?ff->f", "?dd->d", "?FF->F", "?DD->D"),
}
# Loops CuPy lists only to raise (cupy/_core/_routines_math.pyx: _negative_boolean_error, _subtract_boolean_error).
ERROR_LOOPS = {
    ("negative", "?->?"): "The cupy boolean negative, the `-` operator, is not supported, use the `~` operator or "
                          "the logical_not function instead.",
    ("subtract", "??->?"): "cupy boolean subtract, the `-` operator, is deprecated, use the bitwise_xor, the `^` "
                           "operator, or the logical_xor function instead.",
}
# The comparisons' promote_weak_int (cupy/_core/_routines_logic.pyx): a Python int beside an integer array is strong.
WEAK_INT_PROMOTERS = ("greater", "less")
SIXTEEN_BIT_FLOATS = "eE"


class Loop(NamedTuple):
    """One CuPy loop: its input and output dtypes."""

    inputs: tuple
    outputs: tuple


def loop_dtypes(signature: str) -> Loop | None:
    """"?ff->f" -> Loop((bool, float32, float32), (float32,)); None for a bfloat16 loop without ml_dtypes."""
    if "E" in signature and ml_dtypes is None:
        return None
    char_dtype = {"E": np.dtype(ml_dtypes.bfloat16)} if ml_dtypes is not None else {}
    ins, outs = signature.split("->")
    return Loop(*(tuple(char_dtype.get(c) or np.dtype(c) for c in chars) for chars in (ins, outs)))


class Operand(NamedTuple):
    """What CuPy sees of an argument: its dtype and, for a Python number, its weak kind (else None)."""

    dtype: np.dtype
    weak: type | None


def operand(value) -> Operand:
    """A device array's or NumPy scalar's dtype (strong), or a Python number's (cupy/_core/_scalar.pyx,
    numpy_dtype_from_pyscalar: bool strong; int int64, or uint64 from 2**63; float float64; complex)."""
    if isinstance(value, bool):
        return Operand(np.dtype(bool), None)
    if isinstance(value, int):
        return Operand(np.dtype(np.uint64 if value >= 2**63 else np.int64), int)
    if isinstance(value, (float, complex)):
        return Operand(np.dtype(type(value)), type(value))
    return Operand(np.asarray(value).dtype, None)


def _kind_score(kind: type) -> int:
    """cupy/_core/_kernel.pyx, _get_kind_score: bool 0, integers 1, inexact 2, anything else (bfloat16) 3."""
    if issubclass(kind, np.bool_):
        return 0
    if issubclass(kind, (np.integer, int)):
        return 1
    if issubclass(kind, (np.inexact, float, complex)):
        return 2
    return 3


def _weak_scalars_apply(operands) -> bool:
    """_check_should_use_weak_scalar: weak only beside an array (or strong scalar) of at least the scalars' kind."""
    scalar_kinds = [_kind_score(o.weak) for o in operands if o.weak is not None]
    array_kinds = [_kind_score(o.dtype.type) for o in operands if o.weak is None]
    return bool(scalar_kinds and array_kinds) and max(array_kinds) >= max(scalar_kinds)


def _fits(operand_: Operand, loop_type: np.dtype) -> bool:
    if np.can_cast(operand_.dtype, loop_type):
        return True
    if operand_.weak is None:
        return False
    try:
        return np.result_type(operand_.weak(0), loop_type) == loop_type
    except TypeError:
        return False


def resolve(name: str, operands: list[Operand]) -> Loop:
    """The loop CuPy 14.2 runs for ufunc `name` on `operands`, or the TypeError it raises."""
    if name not in LOOPS:
        raise NotImplementedError(f"cudasim's CuPy stand-in does not model cupy.{name}'s loops; add them to "
                                  "cudasim/cupy_dtypes.py from CuPy's source")
    if not _weak_scalars_apply(operands):
        operands = [Operand(o.dtype, None) for o in operands]
    elif name in WEAK_INT_PROMOTERS and len(operands) == 2:
        first, second = operands
        if first.weak is int and second.weak is None and second.dtype.kind in "iu":
            operands = [Operand(first.dtype, None), second]
        elif second.weak is int and first.weak is None and first.dtype.kind in "iu":
            operands = [first, Operand(second.dtype, None)]
    for signature in LOOPS[name]:
        loop = loop_dtypes(signature)
        if loop is not None and all(_fits(o, t) for o, t in zip(operands, loop.inputs)):
            if (name, signature) in ERROR_LOOPS:
                raise TypeError(ERROR_LOOPS[name, signature])
            return loop
    raise TypeError(f"Wrong type ({tuple(o.dtype for o in operands)}) of arguments for cupy_{name}")


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The type a loop computes in: float32 for the 16-bit floats (converted on load, rounded on store)."""
    return np.dtype(np.float32) if dtype.char in SIXTEEN_BIT_FLOATS else dtype


def run_loop(function, loop: Loop, values) -> np.ndarray:
    """function(*values) as `loop` computes it: each value cast to its loop type, 16-bit ones computed
    in float32, the result rounded once to the loop's output type."""
    cast = [np.asarray(v, dtype=t).astype(compute_dtype(t)) for v, t in zip(values, loop.inputs)]
    return np.asarray(function(*cast)).astype(loop.outputs[0])


def check_output_cast(loop: Loop, out_dtype: np.dtype) -> None:
    """An `out=` array takes the loop's result under 'same_kind' casting (cupy/_core/_kernel.pyx,
    _get_out_args_from_optionals), else TypeError as CuPy raises it."""
    if not np.can_cast(loop.outputs[0], out_dtype, "same_kind"):
        raise TypeError(f"output operand: cannot cast {loop.outputs[0]} to {out_dtype} with casting rule 'same_kind'")


def mean_dtypes(dtype: np.dtype) -> tuple[np.dtype, np.dtype]:
    """(sum dtype, result dtype) of ndarray.mean without dtype= (cupy/_core/_routines_statistics.pyx,
    _ndarray_mean): integers and bool in float64; float16 and bfloat16 summed in float32 and returned in
    their own type (NumPy sums bfloat16 in bfloat16)."""
    if dtype.kind in "iub":
        return np.dtype(np.float64), np.dtype(np.float64)
    if dtype.char in SIXTEEN_BIT_FLOATS:
        return np.dtype(np.float32), dtype
    return dtype, dtype
