"""CuPy twin vs the NumPy reference: every kernel, every T5/MMJiT stage, the whole sampler.

Device, error measure and bounds (from the unit roundoff): tests/gpu_parity.py. On cudasim
every kernel test runs each launch under all four schedules, which must leave bit-identical
results.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gpu_parity import (  # noqa: F401 (device, report_worst_error: autouse fixtures)
    BACKEND,
    EXAMPLES_FACTOR,
    PRECISIONS,
    RUNNER,
    STAGE_BOUND,
    UNIT_ROUNDOFF,
    collect,
    dtypes_of,
    cp,
    device,
    dtype_for,
    every_schedule,
    fails,
    first_argument_in_bf16,
    kernel_bound,
    operand_error,
    parity_settings,
    planted,
    product_scale,
    relative_error,
    report_worst_error,
    result_in_bf16,
    rounded,
    to_f64,
    within,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minit2i.accelerated import kernels
from minit2i.accelerated.mmjit import mmjit_forward, upload_mmjit
from minit2i.accelerated.sampler import sample_on_device as gpu_sample
from minit2i.accelerated.t5 import t5_encode as gpu_t5_encode
from minit2i.accelerated.t5 import upload_t5
from minit2i.core.errors import MiniT2IError
from minit2i.core.weights import nest
from minit2i.pipeline import Request, generate, load_model, make_runner
from minit2i.reference import layers as ref
from minit2i.reference.mmjit import mmjit_forward as ref_mmjit_forward
from minit2i.reference.sampler import guided_x0, time_grid
from minit2i.reference.t5 import key_mask_bias
from minit2i.reference.t5 import t5_encode as ref_t5_encode

pytestmark = pytest.mark.gpu  # on the GPU when there is one (scripts/gpu-check runs every test so marked)
PARITY = parity_settings()


def test_parity_draws_stay_random_and_a_failure_prints_its_replay_line():
    """Hypothesis loads its "ci" profile (derandomize=True: the same draws on every run, where a
    bound that some input breaks would never be found) by itself where it sees a CI variable.
    Parity settings made under it still draw randomly, and a failure's notes carry the
    `@reproduce_failure` line that replays it."""
    current = settings.get_current_profile_name()
    settings.load_profile("ci")
    try:
        chosen = parity_settings()
    finally:
        settings.load_profile(current)
    assert settings.get_profile("ci").derandomize and not chosen.derandomize
    assert chosen.max_examples == max(1, 12 * EXAMPLES_FACTOR)

    @settings(chosen, database=None)
    @given(st.integers(0, 10))
    def always_fails(n):
        assert n < 0

    with pytest.raises(AssertionError) as failure:
        always_fails()
    assert any("@reproduce_failure(" in note for note in failure.value.__notes__)


# ---------------------------------------------------------------------------------------------
# Kernels


def norm_bound(precision: str, width: int) -> float:
    """RMSNorm over `width` (test_rms_norm_any_width): (width/2 + 5.5) u_fp32 + u_dtype, doubled."""
    return kernel_bound(precision, width / 2 + 6)


@pytest.mark.parametrize("precision", PRECISIONS)
@PARITY
@given(rows=st.integers(1, 5), width=st.integers(1, 2100), seed=st.integers(0, 2**16))
@example(rows=3, width=768, seed=1)  # 16-byte packs, the row kept in registers (B/16)
@example(rows=2, width=2056, seed=2)  # 16-byte packs, wider than the registers keep: read twice
@example(rows=2, width=301, seed=3)  # value by value, kept
@example(rows=1, width=1001, seed=4)  # value by value, read twice
def test_rms_norm_any_width(precision, rows, width, seed):
    """Each element against its own |ref| (a product: nothing cancels). The n squares and their
    fp32 sum, in any order, err by n u relative (positive terms); / n, + eps (eps itself rounded
    to fp32) add 3 u: (n + 3) u, which the square root halves; it, the reciprocal and the two
    multiplies round once each: (n/2 + 5.5) u, plus the store's u_dtype. Bound: k = n/2 + 6.
    The examples take each of rmsnorm.cu's four paths (16-byte packs or single values, the row
    kept in registers or read twice)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    x, x64 = rounded(rng.standard_normal((rows, width)), dtype)
    w, w64 = rounded(rng.standard_normal(width), dtype)
    with every_schedule():
        out = kernels.rms_norm(x, w)
    assert within(relative_error(out, ref.rms_norm(x64, w64)), norm_bound(precision, width))


@pytest.mark.parametrize("precision", PRECISIONS)
@PARITY
@given(rows=st.integers(1, 4), width=st.integers(1, 2100), seed=st.integers(0, 2**16))
@example(rows=4, width=768, seed=1)
@example(rows=2, width=2056, seed=2)
@example(rows=2, width=77, seed=3)
@example(rows=1, width=1001, seed=4)
def test_add_rms_norm_updates_residual_and_normalises(precision, rows, width, seed):
    """The residual r + (d + b): two fp32 roundings, each at most u (|r| + |d| + |b|), then the
    store's u_dtype of the same scale, measured against max (|r| + |d| + |b|): the sum can
    cancel far below its operands, while the rounding of d + b stays. The norm is checked on
    the residual as stored (rounded to the dtype, which after such a cancellation may flip a
    width-1 row's sign): the bound of test_rms_norm_any_width."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    residual, r64 = rounded(rng.standard_normal((rows, width)), dtype)
    delta, d64 = rounded(rng.standard_normal((rows, width)), dtype)
    bias, b64 = rounded(rng.standard_normal(width), dtype)
    w, w64 = rounded(rng.standard_normal(width), dtype)
    with every_schedule():
        out = kernels.add_rms_norm(residual, delta, bias, w)
    scale = np.max(np.abs(r64) + np.abs(d64) + np.abs(b64))
    assert within(operand_error(residual, r64 + (d64 + b64), scale), kernel_bound(precision, 2))
    assert within(relative_error(out, ref.rms_norm(to_f64(residual), w64)), norm_bound(precision, width))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("activation, reference", [("swiglu", ref.silu), ("geglu", ref.gelu_tanh)])
@PARITY
@given(rows=st.integers(1, 7), hidden=st.integers(1, 600), seed=st.integers(0, 2**16))
@example(rows=3, hidden=512, seed=1)  # 16-byte packs in every dtype
@example(rows=2, hidden=100, seed=2)  # packs of 4 fp32; 16-bit values one by one
@example(rows=5, hidden=101, seed=3)  # value by value
def test_gated_activation(precision, activation, reference, rows, hidden, seed):
    """Error against max |gate * up|, not max |ref|: for gate << 0, tanh-GELU's 1 + tanh(z)
    cancels in fp32 (absolute error ~u_fp32 |gate * up|), and a one-element draw with gate < -3
    has a near-zero max |ref|. |act(a)| <= |a|, so every term below fits that scale. expf and
    tanhf err by up to 2 ulp (4 u). SiLU a / (1 + e^-a): 4 u, the add (its relative error at most
    e's) 4 u + u, the divide u: 6 u of |silu(a)|. tanh-GELU 0.5 a (1 + tanh z): z = k (a + c a^3)
    has no cancellation, 7 u relative (five roundings, k and c rounded to fp32), which tanh
    passes on as (1 - t^2) 7 u |z| <= 3.2 u; with tanhf's 4 u and the add's 2 u, 1 + t is off
    by 9.2 u absolutely, 0.5 a times it by 4.6 u |a|, plus one rounding: 5.6 u |a|. Times up and
    the store: at most u_dtype + 7 u, within kernel_bound(dtype, 8)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    packed, p64 = rounded(3 * rng.standard_normal((rows, 2 * hidden)), dtype)
    gate, up = p64[:, :hidden], p64[:, hidden:]
    with every_schedule():
        out = kernels.gated_activation(packed, activation)
    assert within(operand_error(out, reference(gate) * up, np.max(np.abs(gate * up))), kernel_bound(precision, 8))


@pytest.mark.parametrize("precision", PRECISIONS)
def test_rows_one_value_off_16_bytes_take_the_value_by_value_path(precision):
    """Rows of 768 and a hidden of 512 would move in 16-byte packs, but a C-contiguous view that
    starts one value into its buffer is not 16-byte aligned (a GPU faults on such a vector
    access, and the detectors report it): rms_norm and swiglu go value by value there and keep
    the bounds of test_rms_norm_any_width and test_gated_activation."""
    dtype, rng = dtype_for(precision), np.random.default_rng(5)
    rows, width, hidden = 3, 768, 512
    buffer, buffer64 = rounded(rng.standard_normal(1 + rows * 2 * hidden), dtype)
    x, x64 = buffer[1:1 + rows * width].reshape(rows, width), buffer64[1:1 + rows * width].reshape(rows, width)
    address = x.ctypes.data if isinstance(x, np.ndarray) else x.data.ptr  # cudasim, CuPy
    assert x.flags.c_contiguous and address % 16
    w, w64 = rounded(rng.standard_normal(width), dtype)
    with every_schedule():
        out = kernels.rms_norm(x, w)
    assert within(relative_error(out, ref.rms_norm(x64, w64)), norm_bound(precision, width))
    packed, p64 = buffer[1:].reshape(rows, 2 * hidden), buffer64[1:].reshape(rows, 2 * hidden)
    gate, up = p64[:, :hidden], p64[:, hidden:]
    with every_schedule():
        out = kernels.gated_activation(packed, "swiglu")
    assert within(operand_error(out, ref.silu(gate) * up, np.max(np.abs(gate * up))), kernel_bound(precision, 8))


@pytest.mark.parametrize("precision", PRECISIONS)
@PARITY
@given(batch=st.integers(1, 2), length=st.integers(1, 9), extra=st.integers(0, 5), heads=st.integers(1, 3),
       head_dim=st.sampled_from([8, 52, 64, 128]), norm=st.booleans(), rope=st.booleans(), seed=st.integers(0, 2**16))
@example(batch=2, length=9, extra=3, heads=3, head_dim=64, norm=True, rope=True, seed=1)  # 16-byte packs (B/16)
@example(batch=1, length=5, extra=2, heads=2, head_dim=52, norm=True, rope=True, seed=2)  # value by value (L/16)
def test_qkv_heads_writes_normed_rotated_rows(precision, batch, length, extra, heads, head_dim, norm, rope, seed):
    """Against max |ref| of each buffer. a = qkv + bias: one rounding of exact operands, u of
    itself. The per-head RMSNorm of a (test_rms_norm_any_width's count, with a's own error twice
    in the squares and once on the product): (Dh/2 + 7.5) u of each element. RoPE turns the pair
    (a, b) into (a c - b s, b c + a s): two products and a sum, so each output is off by
    (Dh/2 + 9.5) u |(a, b)|, and the rotation keeps |(a, b)| <= sqrt(2) max |ref|: with the store,
    u_dtype + sqrt(2) (Dh/2 + 9.5) u, within kernel_bound(dtype, Dh + 3) for every Dh >= 8 drawn
    (fp32, Dh = 8: 20.1 u of 24 u)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    offset, total = extra, length + 2 * extra  # rows before and after stay untouched
    qkv, qkv64 = rounded(rng.standard_normal((batch, length, 3 * heads * head_dim)), dtype)
    bias, b64 = rounded(rng.standard_normal(3 * heads * head_dim), dtype)
    qn, qn64 = rounded(rng.standard_normal(head_dim), dtype)
    kn, kn64 = rounded(rng.standard_normal(head_dim), dtype)
    cos, sin = (cp.asarray(t) for t in ref.text_rope(total, head_dim, np.float32))
    buffers = [cp.full((batch, heads, total, head_dim), np.nan, dtype) for _ in range(3)]
    with every_schedule():
        kernels.qkv_heads(qkv, bias, heads, *buffers, offset=offset, norms=(qn, kn) if norm else None,
                          rope=(cos, sin) if rope else None)
    cos64, sin64 = (cp.asnumpy(t).astype(np.float64)[offset:offset + length] for t in (cos, sin))
    for index, (buffer, weight) in enumerate(zip(buffers, (qn64, kn64, None))):
        part = ref.split_heads((qkv64 + b64)[..., index * heads * head_dim:(index + 1) * heads * head_dim], heads)
        if weight is not None and norm:
            part = ref.rms_norm(part, weight)
        if weight is not None and rope:
            part = ref.apply_rope(part, cos64, sin64)
        host = to_f64(buffer)
        assert within(relative_error(buffer[:, :, offset:offset + length], part), kernel_bound(precision, head_dim + 3))
        assert np.isnan(np.delete(host, np.s_[offset:offset + length], axis=2)).all()


@PARITY
@given(batch=st.integers(1, 2), heads=st.integers(1, 3), lq=st.integers(1, 90), lk=st.integers(1, 90),
       head_dim=st.sampled_from([16, 52, 64, 128]), with_bias=st.booleans(), with_mask=st.booleans(),
       seed=st.integers(0, 2**16))
def test_flash_attention_matches_softmax_attention(batch, heads, lq, lk, head_dim, with_bias, with_mask, seed):
    """The fp32 kernel (CUDA cores; fp16 and bf16 go to the tensor-core kernel, tested below),
    against max |v|: the output is a convex combination of value rows, which can average out far
    below them; bound: kernel_bound(fp32, attention_roundings(...))."""
    precision = "fp32"
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    q, q64 = rounded(rng.standard_normal((batch, heads, lq, head_dim)), dtype)
    k, k64 = rounded(rng.standard_normal((batch, heads, lk, head_dim)), dtype)
    v, v64 = rounded(rng.standard_normal((batch, heads, lk, head_dim)), dtype)
    bias64 = rng.standard_normal((heads, lq, lk)) if with_bias else np.zeros((heads, lq, lk))
    mask = (rng.random((batch, lk)) > 0.4).astype(np.float32)
    mask[:, 0] = 1.0  # a fully padded key row is not a case the model produces
    mask = mask if with_mask else np.ones_like(mask)
    scale = head_dim**-0.5
    with every_schedule():
        out = kernels.attention(q, k, v, scale, bias=cp.asarray(bias64, np.float32) if with_bias else None,
                                key_mask=cp.asarray(mask) if with_mask else None)
    expected = ref.merge_heads(ref.attention(q64, k64, v64, scale, bias64[None] + key_mask_bias(mask, np.float64)))
    assert out.shape == (batch, lq, heads * head_dim)
    assert within(operand_error(out, expected, np.max(np.abs(v64))),
                  kernel_bound(precision, attention_roundings(q64, k64, bias64, scale)))


def attention_roundings(q64, k64, bias64, scale: float, score_roundings: int = 3) -> float:
    """k of an attention bound against V = max |v|: (Dh + 3) A + 2 Lk + 4 fp32 roundings, where
    A = max over query and key of scale sum_d |q_d k_d| + |bias| bounds the scores' terms.

    q [B, H, Lq, Dh], k [B, H, Lk, Dh], bias [H, Lq, Lk] (float64). A score's fp32 dot product
    errs by Dh u scale sum |q k|, the scale (rounded to fp32), its product, the bias (rounded to
    fp32) and its add by u A more: (Dh + 3) u A. An error d_j in score j moves weight w_j by
    w_j (d_j - sum w d), the output by at most 2 (Dh + 3) u A V. Each p_j = expf(s_j - m): 4 u
    (2 ulp), and the subtraction's rounding u |s_j - m| weighs p_j |s_j - m| <= 1/e (sum p >= 1):
    4 u V + Lk u V / e. The weighted values summed in fp32 over Lk keys (and their products):
    (Lk + 1) u V; the row sum of Lk positive terms (Lk - 1) u; each key tile's rescaling of both
    by the same correction rounds twice (its own error cancels in the ratio): 2 ceil(Lk / 32) u;
    the reciprocal and the product 2 u. In all at most
    u_dtype + (2 (Dh + 3) A + 2.4 Lk + 2 ceil(Lk / 32) + 6) u, within kernel_bound's doubling of
    u_dtype + k u_fp32. Masked keys have p = 0 in both. score_roundings: the 3 roundings after
    the dot product, more where a kernel has more."""
    magnitudes = scale * np.abs(q64) @ np.swapaxes(np.abs(k64), -1, -2) + np.abs(bias64)
    return (q64.shape[-1] + score_roundings) * float(np.max(magnitudes)) + 2 * k64.shape[-2] + 4


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@parity_settings(max_examples=4)
@given(batch=st.integers(1, 2), heads=st.integers(1, 24), lq=st.integers(1, 140), lk=st.integers(1, 140),
       head_dim=st.sampled_from([52, 64, 16, 128]), with_bias=st.booleans(), mask_kind=st.sampled_from(["none", "part", "all"]),
       seed=st.integers(0, 2**16))
@example(batch=2, heads=2, lq=17, lk=70, head_dim=52, with_bias=True, mask_kind="all", seed=52)
@example(batch=1, heads=24, lq=65, lk=129, head_dim=64, with_bias=False, mask_kind="none", seed=64)
def test_tensor_core_attention_matches_softmax_attention(precision, batch, heads, lq, lk, head_dim, with_bias,
                                                         mask_kind, seed):
    """fp16 / bf16 attention on tensor cores (attention_tc.cu: mma.sync, ldmatrix, cp.async)
    against float64 softmax attention, over drawn shapes: lengths that are not multiples of the
    128-row and 64-key tiles (64 rows and 32 keys at Dp 128; padded query rows, key columns past
    lk at -inf), 1-24 heads, head
    dims 52 and 64 (zero-padded to 64), 16 and 128 (the d128 entry point), T5's position bias,
    a partly masked batch row, and ("all") batch row 0 with every key masked (every key at
    finfo.min: the reference and the kernel both average all values).
    Bound, relative to max|v| (the output is a convex combination of value rows, so |out| <=
    max|v|; relative to max|out| the bound would depend on how much the weights average out):
    P is rounded to the storage dtype before P V (<= u max|v|, the row sum uses the fp32 values)
    and the store rounds once more (<= u |out|): 2 u_dtype; the scores are exact 16-bit products
    summed in fp32; the fp32 work is the fp32 kernel's (`attention_roundings`) with the scores
    in log2 units: scale log2(e) and bias log2(e) round twice more (5 score roundings, not 3;
    an error d in log2 units moves the weights by ln(2) d), exp2f errs by 2 ulp as expf does, and
    tiles of 64 keys (32 at Dp 128) rescale no more often than the fp32 kernel's 32-key tiles;
    doubled.
    """
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    q, q64 = rounded(rng.standard_normal((batch, heads, lq, head_dim)), dtype)
    k, k64 = rounded(rng.standard_normal((batch, heads, lk, head_dim)), dtype)
    v, v64 = rounded(rng.standard_normal((batch, heads, lk, head_dim)), dtype)
    bias64 = rng.standard_normal((heads, lq, lk)) if with_bias else np.zeros((heads, lq, lk))
    mask = (rng.random((batch, lk)) > 0.4).astype(np.float32)
    mask[:, 0] = 1.0
    if mask_kind == "all":
        mask[0] = 0.0
    scale = head_dim**-0.5
    kernels.launch_counts.clear()
    with every_schedule():
        out = kernels.attention(q, k, v, scale, bias=cp.asarray(bias64, np.float32) if with_bias else None,
                                key_mask=None if mask_kind == "none" else cp.asarray(mask))
    assert dict(kernels.launch_counts) == {"flash_attention_tc" if head_dim <= 64 else "flash_attention_tc_d128": 1}
    key_bias = key_mask_bias(mask, np.float64) if mask_kind != "none" else np.zeros((batch, 1, 1, lk))
    expected = ref.merge_heads(ref.attention(q64, k64, v64, scale, bias64[None] + key_bias))
    roundings = attention_roundings(q64, k64, bias64, scale, score_roundings=5)
    assert out.shape == (batch, lq, heads * head_dim)
    assert within(operand_error(out, expected, np.max(np.abs(v64))), kernel_bound(precision, roundings) + 2 * UNIT_ROUNDOFF[precision])


def test_tensor_core_attention_refuses_a_head_dim_it_cannot_copy():
    """Rows of the 16-bit kernel are copied in 8-byte pieces at least: head_dim % 4 == 0."""
    q = cp.zeros((1, 1, 4, 18), dtype_for("fp16"))
    with pytest.raises(MiniT2IError, match="fp16/bf16 attention needs a head_dim that is a multiple of 4, not 18; use fp32"):
        kernels.attention(q, q, q, 1.0)


@pytest.mark.parametrize("precision", PRECISIONS)
@PARITY
@given(batch=st.integers(1, 3), size=st.integers(1, 300), cfg=st.floats(0, 9), factor=st.floats(0, 1),
       seed=st.integers(0, 2**16))
@example(batch=1, size=1, cfg=0.0, factor=0.75, seed=499)  # x + f (g - x) cancels: broke a bound on the result
def test_cfg_euler_step(precision, batch, size, cfg, factor, seed):
    """g = n + s (c - n) (c, n: the cond and uncond x0), x' = x + f (g - x), in fp32 on the fp32
    state x and dtype-rounded c, n; s and f reach the kernel as fp32 (the reference takes the same
    values). Measured against the operands' scale: g and x' can cancel far below the operands,
    whose rounding errors stay (the example kept below: x' = 0.25 x + 0.75 n, small).
    g: c - n rounds by at most u (|c| + |n|), which s multiplies; the product rounds by
    u s (|c| + |n|), the sum by u |g|: at most 3 u G, G = max(|n| + s (|c| + |n|)) (k = 2, the
    last rounding being the store). x': g's error (f <= 1) and the roundings of g - x, of f times
    it and of the sum, each at most u X, X = max(|x| + |n| + s (|c| + |n|)) >= |x| + |g|:
    3 u G + 3 u X <= 6 u X (k = 5). The next input rounds x' (|x'| <= X) to the dtype:
    u_dtype + 6 u (k = 6)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(seed)
    state64 = rng.standard_normal((batch, size)).astype(np.float32).astype(np.float64)
    state = cp.asarray(state64, np.float32)
    x0_both, x064 = rounded(rng.standard_normal((2 * batch, size)), dtype)
    next_input, guided = cp.empty_like(x0_both), cp.empty_like(state)
    with every_schedule():
        kernels.cfg_euler(state, next_input, x0_both, guided, cfg, cp.asarray([factor], np.float32))
    cond, uncond = x064[:batch], x064[batch:]
    s, f = (np.float64(np.float32(value)) for value in (cfg, factor))
    g = guided_x0(cond, uncond, s)
    expected = state64 + f * (g - state64)
    guided_scale = np.abs(uncond) + s * (np.abs(cond) + np.abs(uncond))
    state_scale = np.max(np.abs(state64) + guided_scale)
    assert within(operand_error(guided, g, np.max(guided_scale)), kernel_bound("fp32", 2))
    assert within(operand_error(state, expected, state_scale), kernel_bound("fp32", 5))
    assert within(operand_error(next_input, np.concatenate([expected, expected]), state_scale),
                  kernel_bound(precision, 6))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (7, 33, 5), (64, 96, 288), (130, 257, 3)])
def test_gemm_matches_the_float64_product(precision, m, k, n):
    """kernels.gemm (cublasGemmEx on a GPU): fp32 accumulation over k, rounded to the dtype,
    against `product_scale` (a sum can cancel below its terms): the products and their sum in
    any order err by k u_fp32 of it, the store by u_dtype; in the default math mode (as CuPy's)
    cuBLAS may add split-K partial sums in the output dtype, one more u_dtype. Doubled."""
    dtype, rng = dtype_for(precision), np.random.default_rng(m + k + n)
    x, x64 = rounded(rng.standard_normal((m, k)), dtype)
    w_t, w64 = rounded(rng.standard_normal((k, n)), dtype)
    out = kernels.gemm(x, w_t)
    assert out.dtype == dtype and out.shape == (m, n)
    assert within(operand_error(out, x64 @ w64, product_scale(x64, w64)),
                  kernel_bound(precision, k) + 2 * UNIT_ROUNDOFF[precision])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_gemm_reads_one_streams_rows_by_stride(precision):
    """x = rows 3..8 of each sample of a [2, 9, 40] array (the image rows of a joint attention
    output): one strided batched GEMM, each sample's rows within the same bound as a plain GEMM."""
    dtype, rng = dtype_for(precision), np.random.default_rng(17)
    joint, joint64 = rounded(rng.standard_normal((2, 9, 40)), dtype)
    w_t, w64 = rounded(rng.standard_normal((40, 24)), dtype)
    out = kernels.gemm(joint[:, 3:], w_t)
    assert out.shape == (2, 6, 24) and out.flags.c_contiguous
    expected = joint64[:, 3:] @ w64
    assert within(operand_error(out, expected, product_scale(joint64[:, 3:], w64)),
                  kernel_bound(precision, 40) + 2 * UNIT_ROUNDOFF[precision])


def test_gemm_accumulates_with_one_rounding():
    """accumulate += x @ w_t is cuBLAS's beta = 1: the product and the old value summed in fp32,
    rounded once. bf16 (8 significant bits) at 1.0: the product 2^-8 + 2^-16 rounded alone is 2^-8,
    and 1 + 2^-8 is a tie that rounds to even, 1.0; summed first, 1 + 2^-8 + 2^-16 is above the
    tie and rounds up to 1 + 2^-7. Two roundings (a GEMM, then an add) would give 1.0."""
    dtype = dtype_for("bf16")
    x = cp.asarray(np.array([[2.0**-8, 2.0**-16]], np.float32)).astype(dtype)
    residual = cp.ones((1, 1), np.float32).astype(dtype)
    assert kernels.gemm(x, cp.ones((2, 1), np.float32).astype(dtype), residual) is residual
    assert cp.asnumpy(residual.astype(cp.float32))[0, 0] == 1 + 2.0**-7


def test_gemm_refuses_strided_inputs_and_returns_zeros_for_an_empty_sum():
    x = cp.ones((4, 8), np.float32)
    with pytest.raises(MiniT2IError, match="kernel argument x is not C-contiguous"):
        kernels.gemm(x[:, :4], cp.ones((4, 2), np.float32))
    with pytest.raises(MiniT2IError, match=r"w_t has shape \(7, 2\), expected \(8, 2\)"):
        kernels.gemm(x, cp.ones((7, 2), np.float32))
    assert np.array_equal(cp.asnumpy(kernels.gemm(cp.ones((3, 0), np.float32), cp.ones((0, 2), np.float32))),
                          np.zeros((3, 2), np.float32))


def test_wrappers_reject_strided_and_mistyped_arrays():
    x = cp.ones((4, 8), np.float32)
    with pytest.raises(MiniT2IError, match="not C-contiguous"):
        kernels.rms_norm(x.T, cp.ones(4, np.float32))
    with pytest.raises(MiniT2IError, match="dtype float64, expected float32"):
        kernels.rms_norm(x, cp.ones(8, np.float64))
    with pytest.raises(MiniT2IError, match=r"shape \(7,\), expected \(8,\)"):
        kernels.rms_norm(x, cp.ones(7, np.float32))


def mean_over_one_more(arguments, result):
    """A planted RMSNorm bug: the mean of the squares taken over width + 1 (the result sqrt((n + 1)
    / n) times too large, 1/(2n) relative)."""
    width = arguments[0].shape[-1]
    return (result.astype(np.float32) * np.float32(((width + 1) / width) ** 0.5)).astype(result.dtype)


@pytest.mark.parametrize("kernel, bug, test, arguments", [
    ("rms_norm", mean_over_one_more, test_rms_norm_any_width,
     {"precision": "fp32", "rows": 2, "width": 1100, "seed": 1}),
    ("rms_norm", mean_over_one_more, test_rms_norm_any_width,
     {"precision": "bf16", "rows": 2, "width": 16, "seed": 1}),
    ("add_rms_norm", first_argument_in_bf16, test_add_rms_norm_updates_residual_and_normalises,
     {"precision": "fp32", "rows": 2, "width": 300, "seed": 1}),
    ("attention", result_in_bf16, test_flash_attention_matches_softmax_attention,
     {"batch": 1, "heads": 2, "lq": 9, "lk": 70, "head_dim": 16, "with_bias": True, "with_mask": True, "seed": 1}),
    ("gemm", result_in_bf16, test_gemm_matches_the_float64_product, {"precision": "fp32", "m": 64, "k": 96, "n": 288}),
    ("cfg_euler", first_argument_in_bf16, test_cfg_euler_step,
     {"precision": "fp32", "batch": 1, "size": 300, "cfg": 3.0, "factor": 0.5, "seed": 1}),
    ("cfg_euler", first_argument_in_bf16, test_cfg_euler_step,
     {"precision": "fp32", "batch": 1, "size": 1, "cfg": 0.0, "factor": 0.75, "seed": 499}),
], ids=["rms_norm-fp32", "rms_norm-bf16", "add_rms_norm", "attention", "gemm", "cfg_euler", "cfg_euler-cancelling"])
def test_each_bound_catches_its_planted_bug(monkeypatch, kernel, bug, test, arguments):
    """The bounds stay below a real bug: an fp32 kernel storing through bf16 (2^-9 of its result),
    the fp32 state or residual kept in bf16, an RMSNorm mean over one term too many (1/(2n):
    4.5e-4 at n = 1100, where the fp32 bound is 6.6e-5), each 4 to 6000 times its bound here.
    On the cancelling example that broke test_cfg_euler_step's old bound on the result (x' is 1 %
    of its operands) a state kept in bf16 still fails, at 1.2 times the bound."""
    planted(monkeypatch, kernel, bug)
    assert fails(test, **arguments)


# ---------------------------------------------------------------------------------------------
# Network stages, compared layer by layer through the on_layer hook


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return load_model(*tiny_model)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_mmjit_every_stage_matches_reference(tiny, precision):
    """Every stage within STAGE_BOUND. The twin folds two things the reference writes as separate
    operations, both of which only drop roundings, so the bound stands unchanged: the MLP's
    residual add rides in the W2 GEMM (cuBLAS beta = 1: r + m summed in fp32 and rounded once,
    where a GEMM then an add rounded m and then r + m, an error up to u (|m| + |r + m|) now u |r + m|),
    and the attention output projections read each stream's rows by stride (the same products,
    no copy: a copy is exact)."""
    dtype, rng = dtype_for(precision), np.random.default_rng(1)
    config = tiny.mmjit.config
    images, images64 = rounded(rng.standard_normal((2, 3, 48, 32)), dtype)  # non-square grid 3 x 2
    context, context64 = rounded(rng.standard_normal((2, config.prompt_length, config.txt_input_size)), dtype)
    mask = np.ones((2, config.prompt_length))
    mask[0, 5:], mask[1] = 0, 0  # one padded prompt, one unconditional row
    expected, actual = {}, {}
    x0_ref = ref_mmjit_forward(nest(tiny.mmjit.tensors), config, images64, context64, mask, collect(expected))
    x0 = mmjit_forward(upload_mmjit(nest(tiny.mmjit.tensors), config, dtype), config, images, context,
                       cp.asarray(mask).astype(dtype), collect(actual))
    assert list(actual) == list(expected)
    assert dtypes_of(actual | {"x0": x0}) == {name: np.dtype(dtype).name for name in [*actual, "x0"]}
    for name in expected:
        assert within(relative_error(actual[name], expected[name]), STAGE_BOUND[precision]), name
    assert within(relative_error(x0, x0_ref), STAGE_BOUND[precision])


def test_t5_every_block_matches_reference(tiny):
    rng = np.random.default_rng(2)
    config = tiny.t5.config
    ids = rng.integers(0, config.vocab_size, (2, 13))
    mask = np.ones((2, 13))
    mask[1, 6:] = 0
    expected, actual = {}, {}
    out_ref = ref_t5_encode(ref.cast_tree(nest(tiny.t5.tensors), np.float64), config, ids, mask, collect(expected))
    out = gpu_t5_encode(upload_t5(nest(tiny.t5.tensors), config), config, ids, mask, collect(actual))
    assert list(actual) == list(expected) == [f"t5.block.{i}" for i in range(config.num_layers)]
    assert dtypes_of(actual | {"out": out}) == {name: "float32" for name in [*actual, "out"]}  # T5 runs in fp32
    for name in expected:
        assert within(relative_error(actual[name], expected[name]), 1e-4), name
    assert within(relative_error(out, out_ref), 1e-4)


@pytest.mark.parametrize("precision, attention", [("fp32", "flash_attention"), ("bf16", "flash_attention_tc")])
def test_fused_kernels_really_run(tiny, precision, attention):
    """Launch counts for one MMJiT forward: P preamble blocks, D double blocks (2 streams, but the
    last block's text stream stops at the attention: nothing reads it); 16-bit attention runs on
    the tensor-core kernel."""
    config = tiny.mmjit.config
    p, d = config.txt_preamble_depth, config.depth_double
    runner = make_runner(tiny, BACKEND, precision)
    dtype = runner.dtype
    images = cp.zeros((1, 3, 32, 32), np.float32).astype(dtype)
    context = cp.zeros((1, config.prompt_length, config.txt_input_size), np.float32).astype(dtype)
    kernels.launch_counts.clear()
    runner.denoise(images, context, cp.ones((1, config.prompt_length), np.float32))
    assert dict(kernels.launch_counts) == {
        "rms_norm": p + 2 * d + 1, "add_rms_norm": p + 2 * d - 1, "qkv_heads": p + 2 * d,
        attention: p + d, "swiglu": p + 2 * d - 1,
    }


# ---------------------------------------------------------------------------------------------
# Sampler


@pytest.mark.parametrize("precision", PRECISIONS)
def test_whole_sampler_matches_reference(tiny, precision):
    """Same seed, same prompt, 4 steps, CFG s = 4: pixels within a bound derived from u.

    The last Euler step has factor 1, so the image is the guided x0 g = u + s (c - u) of the
    [cond ; uncond] forward, whose output is stored in the network dtype: c and u carry one
    rounding plus the forward's own error, allowed 2 u relative together (measured: 1 u), and
    never less than the fp32 forward's stage bound (in fp32 the GEMM sums dominate).
    |1 - s| + s = 2s - 1 amplifies it: |dg| <= (2s - 1) 2u |g|. A pixel is 127.5 levels per
    unit, plus 1 level for the uint8 rounding: bf16 (u = 2^-8) allows ~48 levels on this model,
    where the old fixed bound of 16 failed a correct kernel at 19.
    """
    dtype_for(precision)
    cfg = 4.0
    request = Request("a red cube on a table", steps=4, cfg_scale=cfg, width=32, height=48, seed=7, batch_count=2)
    expected = generate(tiny, make_runner(tiny, "numpy", "fp32"), request)
    actual = generate(tiny, make_runner(tiny, BACKEND, precision), request)
    relative = (2 * cfg - 1) * max(2 * UNIT_ROUNDOFF[precision], STAGE_BOUND["fp32"])
    diff = np.abs(actual.pixels.astype(int) - expected.pixels.astype(int))
    assert np.max(np.abs(actual.images - expected.images)) <= relative * np.max(np.abs(expected.images))
    assert diff.max() <= 127.5 * relative * np.max(np.abs(expected.images)) + 1
    assert diff.mean() <= 127.5 * relative * np.mean(np.abs(expected.images))
    if precision == "fp32":
        assert np.max(np.abs(actual.images - expected.images)) / np.max(np.abs(expected.images)) < 1e-4


def test_only_the_final_image_comes_back_to_the_host(tiny, monkeypatch):
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    ids, mask = tiny.tokenizer(["a cat"])
    context = runner.encode(ids, mask)
    noise = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    device_mask = cp.asarray(mask, np.float32)
    runner.sample(noise, context, mask, 2, 3.0, 0.001)  # compile and cache outside the checks
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cupyx.allow_synchronize warns that it is deprecated
        if BACKEND == "cudasim":
            from minit2i.cudasim.standin import cupyx
        else:
            import cupyx

        with cupyx.allow_synchronize(False):  # any device->host copy or sync in the loop raises
            gpu_sample(runner.embed_prompt, runner.denoise_embedded, noise, context, device_mask, 3, 3.0, 0.001,
                       use_graph=False)
    copies = []
    real_asnumpy = cp.asnumpy
    monkeypatch.setattr(cp, "asnumpy", lambda *a, **k: copies.append(a[0].shape) or real_asnumpy(*a, **k))
    runner.sample(noise, context, mask, 3, 3.0, 0.001)
    assert copies == [(1, 3, 32, 32)]


def graph_replay_error(tiny) -> float:
    """max |eager - graph replay| / max |eager| over a 5-step sample."""
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32", use_graph=False)
    graph_runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")  # graph replay is the default
    ids, mask = tiny.tokenizer(["a dog"])
    context = runner.encode(ids, mask)
    noise = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    eager = runner.sample(noise, context, mask, 5, 3.0, 0.001)
    replayed = graph_runner.sample(noise, context, mask, 5, 3.0, 0.001)
    return float(np.max(np.abs(eager - replayed)) / np.max(np.abs(eager)))


def test_graph_replay_matches_eager(tiny, caplog, monkeypatch):
    """Same kernels on the same values: on cudasim bit for bit; on a GPU within 1e-6, because
    cuBLAS may pick another algorithm inside a capture (it has only the workspace we gave it).
    Steps 1..4 of 5 are replays of the captured step, and no capture failure is reported."""
    import minit2i.accelerated.sampler as sampler

    replays = []
    real_launch = sampler.CapturedStep.launch
    monkeypatch.setattr(sampler.CapturedStep, "launch",
                        lambda self, stream: replays.append(1) or real_launch(self, stream))
    with caplog.at_level("WARNING", logger="minit2i.accelerated"):
        error = graph_replay_error(tiny)
    assert error == 0 if BACKEND == "cudasim" else error <= 1e-6
    assert len(replays) == 4
    assert caplog.records == []


def test_a_gemm_is_captured_and_replayed_with_the_inputs_of_the_moment():
    """kernels.gemm inside a capture (CuPy's cp.matmul would be refused there): the replay
    computes the product of what the input buffers hold at replay time."""
    import minit2i.accelerated.sampler as sampler

    rng = np.random.default_rng(5)
    x, w_t = cp.asarray(rng.standard_normal((6, 5)), np.float32), cp.asarray(rng.standard_normal((5, 3)), np.float32)
    out = []
    stream = sampler.capture_stream()
    with stream:
        kernels.gemm(x, w_t)  # eagerly first, as the sampler's step 0: the cuBLAS handle exists
        graph = sampler.capture(lambda: out.append(kernels.gemm(x, w_t)), stream)
        new_x = rng.standard_normal((6, 5)).astype(np.float32)
        x[...] = cp.asarray(new_x)
        graph.launch(stream)
        stream.synchronize()
    w64 = cp.asnumpy(w_t).astype(np.float64)
    expected = new_x.astype(np.float64) @ w64
    assert within(operand_error(out[0], expected, product_scale(new_x, w64)), kernel_bound("fp32", 5))


def test_a_failed_capture_warns_once_and_runs_eagerly(tiny, monkeypatch, caplog):
    """A driver that refuses the capture: one warning line, then the same image as eager steps."""
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32", use_graph=False)
    ids, mask = tiny.tokenizer(["a dog"])
    context = runner.encode(ids, mask)
    noise = np.random.default_rng(3).standard_normal((1, 3, 32, 32)).astype(np.float32)
    eager = runner.sample(noise, context, mask, 3, 3.0, 0.001)

    def refuse(step, stream):  # CuPy's CUDARuntimeError is a RuntimeError
        raise RuntimeError("cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing")

    import minit2i.accelerated.sampler as sampler

    monkeypatch.setattr(sampler, "capture", refuse)
    with caplog.at_level("WARNING", logger="minit2i.accelerated"):
        fallback = RUNNER(tiny.mmjit, tiny.t5, "fp32").sample(noise, context, mask, 3, 3.0, 0.001)
    assert [record.getMessage() for record in caplog.records] == [
        "CUDA graph capture failed (cudaErrorStreamCaptureUnsupported: operation not permitted when stream is "
        "capturing); running the sampler steps eagerly"]
    assert np.array_equal(fallback, eager)


def test_a_factor_baked_in_at_capture_makes_replay_differ(tiny, monkeypatch):
    """The sampler refills a device scalar before each replay. Passing the step factor as a value
    created at capture time (cp.full: a captured fill with the value as a kernel parameter)
    freezes step 1's factor into the graph; the eager comparison must see it."""
    import minit2i.accelerated.sampler as sampler

    current = []
    real_factors, real_cfg_euler = sampler.step_factors, kernels.cfg_euler

    def recorded_factors(steps, a_min):
        for f in real_factors(steps, a_min):
            current[:] = [f]
            yield f

    monkeypatch.setattr(sampler, "step_factors", recorded_factors)
    monkeypatch.setattr(kernels, "cfg_euler", lambda state, next_input, x0_both, x0_guided, cfg_scale, factor: real_cfg_euler(
        state, next_input, x0_both, x0_guided, cfg_scale, cp.full((1,), current[0], np.float32)))
    assert graph_replay_error(tiny) > 1e-3


def test_callback_sees_device_arrays_each_step(tiny):
    runner = RUNNER(tiny.mmjit, tiny.t5, "fp32")
    ids, mask = tiny.tokenizer(["a dog"])
    seen = []
    noise = np.zeros((1, 3, 32, 32), np.float32)
    runner.sample(noise, runner.encode(ids, mask), mask, 3, 1.0, 0.001,
                  lambda info: seen.append((info.index, info.t, type(info.x), runner.to_host(info.x0).shape)))
    assert seen == [(i, time_grid(3)[i], cp.ndarray, (1, 3, 32, 32)) for i in range(3)]
