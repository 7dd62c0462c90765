"""cudasim's CuPy stand-in returns the dtypes CuPy 14.2 returns (cudasim/cupy_dtypes.py), not NumPy's.

The loop tables are checked against the real CuPy where it imports (the [compile] extra installs
it; it imports without a GPU), so a CuPy release that changes a loop fails here, not on a GPU
user's machine. The rules that pick a loop are CuPy's own (cupy/_core/_kernel.pyx), each case
below says which rule it exercises."""

from __future__ import annotations

import numpy as np
import pytest

from minit2i.cudasim import cupy_dtypes, standin

ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 needs ml_dtypes (the [test] extra)")
BF16 = np.dtype(ml_dtypes.bfloat16)


def device(values, dtype) -> standin.ndarray:
    return standin.asarray(np.asarray(values, dtype=np.float32).astype(dtype))


def test_each_loop_table_is_cupys_own():
    cupy = pytest.importorskip("cupy", reason="comparing with CuPy needs the [compile] extra")
    from cupy._sorting import search

    assert cupy.__version__.split(".")[:2] == ["14", "2"], "re-read CuPy's loops, then update this version"
    for name, loops in cupy_dtypes.LOOPS.items():
        real = search._where_ufunc if name == "where" else getattr(cupy, name)
        assert list(loops) == real.types, name


def test_where_on_bfloat16_comes_back_float32_as_on_cupy():
    """_where_ufunc has no "?EE->E" loop: the first loop bfloat16 casts to safely is "?ff->f"
    (NumPy with ml_dtypes would keep bfloat16). float16 has its own loop. Values are unchanged."""
    keep = standin.asarray(np.array([True, False, True]))
    for dtype, expected in ((BF16, np.float32), (np.float16, np.float16), (np.float32, np.float32)):
        x, y = device([1.5, 2.5, 3.5], dtype), device([-1, -2, -3], dtype)
        result = standin.where(keep, x, y)
        assert result.dtype == expected, dtype
        assert result.get().tolist() == [1.5, -2.0, 3.5]


def test_bfloat16_arithmetic_keeps_bfloat16_computing_in_float32():
    """add has "EE->E": bf16 + bf16 stays bf16, one rounding of the float32 sum (CuPy's bfloat16
    type converts to float for the operation). 1 + 2^-8 is a tie in bf16 (8 significant bits),
    rounded to even: 1; 1 + 3 * 2^-9 rounds up to 1 + 2^-7."""
    one = device([1.0, 1.0], BF16)
    small = device([2**-8, 3 * 2**-9], BF16)
    total = one + small
    assert total.dtype == BF16
    assert total.get().astype(np.float32).tolist() == [1.0, 1 + 2**-7]
    assert (-one).dtype == BF16 and standin.exp(one).dtype == BF16


@pytest.mark.parametrize("array_dtype, scalar, expected", [
    (np.float32, 2.0, np.float32),  # weak float fits "ff->f": result_type(0.0, float32) is float32
    (np.float16, 1.0, np.float16),  # and "ee->e"
    (BF16, 1.0, np.float32),  # result_type(0.0, bfloat16) is float64 with ml_dtypes: "EE->E" refused, "ff->f" taken
    (np.int32, 1.5, np.float64),  # an int array is of a lower kind than a float: the scalar is strong float64
    (np.int32, 3, np.int32),  # a weak int fits "ii->i"
    (np.float32, True, np.float32),  # a Python bool is strong, but bool casts safely to float32
])
def test_python_scalars_are_weak_as_in_cupy(array_dtype, scalar, expected):
    array = standin.asarray(np.ones(3, dtype=array_dtype))
    assert (array * scalar).dtype == expected
    assert (scalar * array).dtype == expected


def test_comparisons_give_bool_and_a_python_int_beside_an_int_array_is_strong():
    """create_comparison's promote_weak_int: int32 > 3 runs "qq->?" with the int made strong."""
    assert (device([0.2, 0.7], np.float32) > 0.5).get().tolist() == [False, True]
    assert (standin.asarray(np.arange(5, dtype=np.int32)) > 3).get().tolist() == [False] * 4 + [True]


def test_what_cupy_refuses_is_refused():
    """The bool negative is an error loop; a float result into an int output breaks 'same_kind'."""
    with pytest.raises(TypeError, match="boolean negative"):
        -standin.asarray(np.array([True]))
    out = standin.zeros(2, np.int32)
    with pytest.raises(TypeError, match="same_kind"):
        np.add(device([1, 2], np.float32), device([1, 2], np.float32), out=out)


def test_mean_sums_16_bit_floats_in_float32():
    """_ndarray_mean: bfloat16 summed in float32, returned in bfloat16. 1 followed by 255 values of
    2^-8: a bfloat16 running sum stays 1 (each addition a tie rounded to even), mean 1/256; the
    float32 sum is 1 + 255/256, mean 0.0078 (bf16: 2^-7)."""
    values = device([1.0] + [2**-8] * 255, BF16)
    mean = values.mean()
    assert mean.dtype == BF16
    assert float(mean.get()) == 2**-7
    assert standin.asarray(np.arange(4, dtype=np.int32)).mean().dtype == np.float64


def test_a_ufunc_cupy_loops_are_not_modelled_for_is_refused_with_the_fix():
    with pytest.raises(NotImplementedError, match="add them to cudasim/cupy_dtypes.py"):
        np.tanh(device([1.0], np.float32))
    with pytest.raises(TypeError, match="plain ufunc calls only"):
        np.add.reduce(device([1.0], np.float32))
