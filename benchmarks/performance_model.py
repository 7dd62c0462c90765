"""Performance model on paper: FLOPs, bytes and roofline times of one MiniT2I forward, per kernel.

    python benchmarks/performance_model.py            # the tables of docs/performance-model.md

Counted from the code of `accelerated/` (CuPy twin) and `training/torch_model.py` (PyTorch eager
with SDPA) for one batched [cond ; uncond] forward, one forward of the Mean Flow student (batch 1,
guidance is an input) and one T5 encoding. A component is one kind of launch: its count
per forward, FLOPs and DRAM bytes (inputs read once, outputs written once; L2 reuse ignored).
Roofline time = max(FLOPs / peak, bytes / bandwidth); the predicted time divides it by an
achieved fraction of that roofline (EFFICIENCY) and adds per launch either the host time of a
launch (eager: the GPU waits for Python whenever that is longer) or the gap between two kernels of
a replayed CUDA graph. Every constant below is an assumption for the first GPU run to check;
`benchmarks/gpu.py` prints measured against predicted per component.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from minit2i.core.mean_flow_config import (  # noqa: E402
    MEAN_FLOW_B16,
    MEAN_FLOW_RECIPE,
    SCALAR_EMBEDDERS,
    MeanFlowConfig,
    aux_token_groups,
)
from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_L16, MMJiTConfig  # noqa: E402
from minit2i.core.t5_config import T5_FLAN_LARGE, T5Config  # noqa: E402


@dataclass(frozen=True)
class Device:
    name: str
    tensor_tflops: float  # dense fp16 / bf16 tensor-core peak
    fp32_tflops: float  # fp32 FMA on CUDA cores (no TF32: parity mode)
    bandwidth_tbs: float  # DRAM


H100 = Device("H100 SXM", 989.0, 67.0, 3.35)
H200 = Device("H200", 989.0, 67.0, 4.8)  # the H100's SMs (132) and clocks with HBM3e
A100 = Device("A100 SXM", 312.0, 19.5, 2.0)


@dataclass(frozen=True)
class Assumptions:
    """Achieved fractions of the roofline and per-launch costs (to be checked on a GPU)."""

    gemm: float = 0.70  # cuBLAS on these mid-size shapes (M = 512..2048, K, N = 768..4096)
    gemm_fp32: float = 0.80  # SGEMM without TF32 is compute-bound and well tuned
    attention_tc: float = 0.30  # the tensor-core kernel (the issue model below gives ~20 % at B/16's shape)
    attention_fp32: float = 0.40  # the CUDA-core kernel
    sdpa: float = 0.45  # PyTorch SDPA (FlashAttention-2 kernels)
    memory: float = 0.70  # bandwidth-bound elementwise / norm kernels
    cupy_launch_us: float = 12.0  # host time of one launch from Python (RawKernel, ufunc, our cublasGemmEx)
    torch_launch_us: float = 5.0  # host time of one PyTorch eager op
    graph_gap_us: float = 1.5  # GPU time between two kernels (replayed, or queued ahead by the host)


@dataclass(frozen=True)
class Component:
    """One kind of launch in one forward."""

    name: str
    kind: str  # "gemm", "attention", "sdpa", "memory"
    launches: int
    flops: float
    bytes: float


def gemm_component(name: str, rows: int, k: int, n: int, count: int, item: int) -> Component:
    """`count` GEMMs [rows, k] @ [k, n]: 2 rows k n FLOPs each, A and B read and C written once."""
    return Component(name, "gemm", count, 2.0 * rows * k * n * count, item * (rows * k + k * n + rows * n) * count)


def memory_component(name: str, elements: float, count: int, item: int) -> Component:
    """`count` memory-bound launches that read + write `elements` elements in all."""
    return Component(name, "memory", count, 0.0, item * elements)


def forward_batch(config: MMJiTConfig) -> int:
    """Images per forward for one image: [cond ; uncond] for MMJiT, 1 for the student."""
    return 1 if isinstance(config, MeanFlowConfig) else 2


def forward_components(config: MMJiTConfig, size: int, item: int, batch: int = 2) -> list[Component]:
    """The CuPy twin's launches in one forward of `batch` images (item: bytes per element). The Mean
    Flow student's text stream is its A prefix tokens and the L prompt tokens, and its prefix adds
    `prefix_components`."""
    d, hidden, heads, head_dim = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    student = isinstance(config, MeanFlowConfig)
    text = config.prompt_length + (config.num_aux_tokens if student else 0)
    n_img, n_txt, n_prompt = batch * (size // config.patch_size) ** 2, batch * text, batch * config.prompt_length
    joint = text + (size // config.patch_size) ** 2
    pre, dbl = config.txt_preamble_depth, config.depth_double
    padded = -(-head_dim // 16) * 16 if item == 2 else head_dim  # tensor cores work on whole 16-wide tiles
    streams = ((n_txt, pre + dbl), (n_img, dbl))  # (rows, blocks) per stream

    def gemm(name, rows, k, n, count):
        return gemm_component(name, rows, k, n, count, item)

    def memory(name, elements, count):
        return memory_component(name, elements, count, item)

    def attention(length, count):
        flops = 4.0 * batch * heads * length * length * padded * count
        return Component(f"attention L={length}", "attention", count, flops, 4.0 * item * batch * heads * length * head_dim * count)

    rows_all = sum(rows * blocks for rows, blocks in streams)
    return [
        gemm("GEMM patch proj1", n_img, config.patch_dim, config.pca_channels, 1),
        gemm("GEMM patch proj2", n_img, config.pca_channels, d, 1),
        gemm("GEMM text embedder", n_prompt, config.txt_input_size, d, 1),
        *(gemm(f"GEMM qkv ({label})", rows, d, 3 * d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM attn proj ({label})", rows, d, d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM w1|w3 ({label})", rows, d, 2 * hidden, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM w2 ({label})", rows, hidden, d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        gemm("GEMM final", n_img, d, config.patch_dim, 1),
        attention(text, pre),
        attention(joint, dbl),
        memory("rms_norm", 2 * d * (rows_all + n_img), pre + 2 * dbl + 1),  # norm1 per stream + final norm
        memory("add_rms_norm", 4 * d * rows_all, pre + 2 * dbl),
        memory("qkv_heads", 6 * d * rows_all, pre + 2 * dbl),
        memory("swiglu", 3 * hidden * rows_all, pre + 2 * dbl),
        memory("residual add (CuPy)", 3 * d * rows_all, pre + 2 * dbl),
        memory("attention output slices (CuPy copy)", 2 * d * (n_txt + n_img) * dbl, 2 * dbl),
        # patchify and unpatchify copies, proj2 and final bias adds, sin/cos add, mask compare + where
        memory("embed/final elementwise (CuPy)", 6 * n_img * config.patch_dim + 5 * n_img * d
               + 2 * n_prompt * config.txt_input_size, 7),
        *(prefix_components(config, item, batch) if student else []),
    ]


def prefix_components(config: MeanFlowConfig, item: int, batch: int) -> list[Component]:
    """The student's prefix (accelerated/mean_flow.py): 9 small GEMMs and 64 CuPy elementwise
    launches per forward. Elementwise: 1 - 1/omega (2); per scalar embedder the sinusoid (scale,
    cos, sin, concatenate, cast: 5), two bias adds and the fp32 SiLU (cast, negate, exp, add,
    divide, cast: 6), 13 x 4; the pooled prompt (cast to fp32, mean, cast: 3); one broadcast add
    per group and their concatenation (6); [prefix ; text] (1)."""
    d, dc, f, a = config.hidden_size, config.txt_input_size, config.frequency_embedding_size, config.num_aux_tokens
    scalars, groups = len(SCALAR_EMBEDDERS), len(aux_token_groups(config))
    text = batch * (a + config.prompt_length)
    launches = 2 + 13 * scalars + 3 + groups + 1 + 1
    # the pooled prompt's fp32 copy (written, read) dominates the bytes with the text concatenation
    elements = (batch * config.prompt_length * dc * (1 + 8 / item) + 2 * text * d + 4 * batch * a * d
                + 13 * scalars * 3 * batch * max(f, d) * 4 / item)
    return [
        gemm_component("GEMM prefix: pooled prompt", batch, dc, d, 1, item),
        gemm_component("GEMM prefix: scalar embedders, first", batch, f, d, scalars, item),
        gemm_component("GEMM prefix: scalar embedders, second", batch, d, d, scalars, item),
        memory_component("prefix elementwise (CuPy)", elements, launches, item),
    ]


def sampler_launches(config: MMJiTConfig) -> int:
    """Launches of a sampler step besides the forward: the factor fill and cfg_euler; the student
    fills h too and runs euler_step."""
    return 3 if isinstance(config, MeanFlowConfig) else 2


def t5_components(config: T5Config, length: int, batch: int = 1) -> list[Component]:
    """accelerated/t5.py's launches for one encoding, fp32. Per block: rms_norm, [q|k|v] GEMM,
    qkv_heads (split only), attention on CUDA cores with the position bias [H, L, L] and key mask,
    o GEMM, add_rms_norm, [wi_0|wi_1] GEMM, geglu, wo GEMM, residual add; once: the embedding
    gather, the position-bias gather and its transposed copy, the final rms_norm."""
    item, layers, rows = 4, config.num_layers, batch * length
    d, inner, ff, heads, d_kv = config.d_model, config.inner_dim, config.d_ff, config.num_heads, config.d_kv

    def gemm(name, k, n):
        return gemm_component(name, rows, k, n, layers, item)

    def memory(name, elements, count):
        return memory_component(name, elements, count, item)

    attention_bytes = (4 * batch * heads * length * d_kv + heads * length * length) * item * layers
    return [
        gemm("GEMM qkv", d, 3 * inner), gemm("GEMM o", inner, d),
        gemm("GEMM wi_0|wi_1", d, 2 * ff), gemm("GEMM wo", ff, d),
        Component(f"attention L={length}", "attention", layers, 4.0 * batch * heads * length * length * d_kv * layers,
                  attention_bytes),
        memory("rms_norm", 2 * d * rows * (layers + 1), layers + 1),
        memory("add_rms_norm", 4 * d * rows * layers, layers),
        memory("qkv_heads", 6 * inner * rows * layers, layers),
        memory("geglu", 3 * ff * rows * layers, layers),
        memory("residual add (CuPy)", 3 * d * rows * layers, layers),
        memory("embedding and position-bias gathers (CuPy)", 2 * rows * d + 4 * heads * length * length, 3),
    ]


def torch_components(config: MMJiTConfig, size: int, item: int, batch: int = 2) -> list[Component]:
    """PyTorch eager (training/torch_model.py): the same GEMMs, SDPA, and the elementwise work
    unfused: an RMSNorm is 6 ops and ~8 passes over its tensor where ours is 1 op and 2, the
    per-head q/k norms + RoPE + concatenations ~9 passes where qkv_heads makes 2 (docs/kernels.md);
    the projection biases ride in cuBLAS (F.linear), so the GEMMs are the same."""
    ours = {c.name: c for c in forward_components(config, size, item, batch)}
    gemms = [c for c in ours.values() if c.kind == "gemm"]
    attention = [replace(c, kind="sdpa") for c in ours.values() if c.kind == "attention"]
    unfused = [
        ("rms_norm (6 ops)", ours["rms_norm"], 4.0, 6),
        ("residual add + norm2 (7 ops)", ours["add_rms_norm"], 3.5, 7),
        ("q/k norms, RoPE, concatenations (~20 ops per stream)", ours["qkv_heads"], 9.0, 20),
        ("silu * up (2 ops)", ours["swiglu"], 5 / 3, 2),
        ("residual add", ours["residual add (CuPy)"], 1.0, 1),
        ("merge heads + slices (copies)", ours["attention output slices (CuPy copy)"], 1.5, 2),
        ("embed/final elementwise", ours["embed/final elementwise (CuPy)"], 1.0, 1),
    ]
    memory = [Component(name, "memory", c.launches * ops, 0.0, c.bytes * factor) for name, c, factor, ops in unfused]
    return gemms + attention + memory


def roofline_ms(c: Component, device: Device, item: int) -> float:
    peak = device.tensor_tflops if item == 2 else device.fp32_tflops
    return max(c.flops / (peak * 1e9), c.bytes / (device.bandwidth_tbs * 1e9))


def efficiency(c: Component, item: int, a: Assumptions) -> float:
    if c.kind == "gemm":
        return a.gemm if item == 2 else a.gemm_fp32
    if c.kind == "attention":
        return a.attention_tc if item == 2 else a.attention_fp32
    return {"sdpa": a.sdpa, "memory": a.memory}[c.kind]


def gpu_ms(c: Component, device: Device, item: int, a: Assumptions) -> float:
    """Predicted GPU time of the component's launches (without launch gaps)."""
    return roofline_ms(c, device, item) / efficiency(c, item, a)


def step_ms(components, device: Device, item: int, a: Assumptions, launch_us: float, replayed: bool,
            extra_launches: int = 2) -> float:
    """One sampler step (forward + `extra_launches`: cfg_euler and the factor fill by default): GPU
    time with the gaps between kernels; eagerly, the longer of that and the host time (the host
    queues launches ahead)."""
    launches = sum(c.launches for c in components) + extra_launches
    gpu = sum(gpu_ms(c, device, item, a) for c in components) + launches * a.graph_gap_us / 1e3
    return gpu if replayed else max(gpu, launches * launch_us / 1e3)


def cupy_run_ms(config, size, steps, device, item, a: Assumptions, graph: bool = True) -> float:
    """accelerated.sampler.sample (or the student's sample_mean_flow, the same loop): step 0 eager,
    step 1 captured (recorded at host speed, then launched), steps 2.. replayed; without graphs
    every step is eager."""
    components, extra = forward_components(config, size, item, forward_batch(config)), sampler_launches(config)
    eager = step_ms(components, device, item, a, a.cupy_launch_us, replayed=False, extra_launches=extra)
    if not graph or steps < 2:
        return steps * eager
    replay = step_ms(components, device, item, a, a.cupy_launch_us, replayed=True, extra_launches=extra)
    capture_host = (sum(c.launches for c in components) + extra) * a.cupy_launch_us / 1e3
    return eager + capture_host + (steps - 1) * replay


def t5_ms(config: T5Config, length: int, device: Device, a: Assumptions) -> float:
    """One T5 encoding, eager (it runs once per prompt), fp32."""
    return step_ms(t5_components(config, length), device, 4, a, a.cupy_launch_us, replayed=False, extra_launches=0)


def image_ms(config: MMJiTConfig, size: int, steps: int, device: Device, item: int, a: Assumptions) -> float:
    """One image from its prompt: T5 once, then the sampler with graph replay."""
    return t5_ms(T5_FLAN_LARGE, config.prompt_length, device, a) + cupy_run_ms(config, size, steps, device, item, a)


def torch_run_ms(config, size, steps, device, item, a: Assumptions) -> float:
    components = torch_components(config, size, item)
    return steps * step_ms(components, device, item, a, a.torch_launch_us, replayed=False)


# ---------------------------------------------------------------------------------------------
# The attention kernels, instruction by instruction (an H200: the GPU they were measured on)


@dataclass(frozen=True)
class Chip:
    """What an issue model needs of a GPU: SMs, warp schedulers per SM, the sustained clock, and
    the latency of a global load that hits L2 (K and V of a head are re-read from L2 by every
    query block)."""

    name: str
    sms: int
    schedulers: int
    clock_ghz: float
    l2_latency_cycles: int


H200_CHIP = Chip("H200 SXM", 132, 4, 1.98, 270)  # the H100 SXM has the same SMs and clock: the same prediction


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel as its SASS shows it (tests/test_kernels_compile.py reads the SASS).

    instructions: warp instructions one warp executes per key tile (the key-tile loop's body,
    its inner loops at their trip counts, the branches B/16 does not take left out);
    exposed_cycles: cycles per key tile in which a warp waits on a dependent long-latency result
    that no other warp of its scheduler covers (every warp of a block reaches the same phase
    between two barriers, and ~1 block per scheduler is resident)."""

    name: str
    rows_per_block: int
    key_tile: int
    warps: int
    blocks_per_sm: int
    instructions: int
    exposed_cycles: int


# attention_tc.cu before FlashAttention-2 (WMMA): a 1,780-instruction key-tile loop whose K/V
# staging loop (36 instructions: a 16-bit LDG, its STS, an integer division by Dp) runs 16 times
# for K and 16 for V, the score loop (2 x 4 x ~70, fragments through generic LD: 32 per 16 MMAs),
# the rescale of O in shared memory (16 rows x ~70) and P V (4 x 210): ~4,800 per tile. Its
# staging is synchronous: 32 dependent L2 round trips per thread per tile, plus ~1,500 cycles of
# shared-memory round trips (O's rescale, the score store and reload, generic loads before MMAs).
WMMA_ATTENTION = AttentionKernel("WMMA (before)", 64, 32, 4, 4, 4800, 32 * H200_CHIP.l2_latency_cycles + 1500)
# attention_tc.cu now: a 1,057-instruction loop of which B/16's whole tiles skip the 538 of the
# bias/mask logits, run the two cp.async loops (70 instructions, the 16- or 8-byte branch taken)
# twice each, and skip Q's loads after the first tile: ~530. Copies are asynchronous and a tile
# ahead; what stays exposed: S's 4 chains of 4 HMMA (~130 cycles), the softmax's MUFU.EX2 and 4
# shuffles (~150), P V's chains of 2 (~65), LDSM waits (~60) and 2 barriers (~200).
MMA_ATTENTION = AttentionKernel("mma.sync (FlashAttention-2)", 64, 32, 4, 4, 530, 600)


def attention_kernel_us(kernel: AttentionKernel, batch: int, heads: int, length: int, chip: Chip = H200_CHIP) -> float:
    """Issue model of one launch at [batch, heads, length, Dh <= 64]: per key tile an SM issues
    the instructions of its resident warps (one per scheduler per cycle) and, on top, a warp's
    exposed latency (not overlapped: barriers keep a block's warps in the same phase); the grid
    runs in ceil(blocks / resident slots) waves. SM time = waves x tiles x (issue + exposed)."""
    blocks = -(-length // kernel.rows_per_block) * batch * heads
    slots = chip.sms * kernel.blocks_per_sm
    waves = -(-blocks // slots)
    warps_per_sm = kernel.warps * min(kernel.blocks_per_sm, blocks / chip.sms)
    tiles = -(-length // kernel.key_tile)
    issue = warps_per_sm * kernel.instructions / chip.schedulers
    return waves * tiles * (issue + kernel.exposed_cycles) / (chip.clock_ghz * 1e3)


# Measured on one H200 with the WMMA kernel (CUDA events, each row side by side in one call,
# random B/16 weights, 10 steps at 512 x 512, CFG 6, bf16): the sampler, one attention launch at
# [2, 12, 1280, 64], and the fused kernels the model predicted 2-3.5x too fast.
H200_MEASURED = {"sampler_ms": 151.7, "attention_us": 623.0, "rms_norm_us": 9.2, "swiglu_us": 26.3, "qkv_heads_us": 20.9}


def sampler_with_attention_ms(attention_us: float, config: MMJiTConfig = MMJIT_B16, steps: int = 10,
                              small_kernels_at: float | None = None) -> float:
    """The measured H200 sampler with each joint attention (depth_double per forward) at
    `attention_us` instead of the measured one; with `small_kernels_at`, rms_norm, swiglu and
    qkv_heads also at that multiple of this model's DRAM-time prediction (H100 bandwidth, which
    the H200's 4.8 TB/s only improves) instead of their measured times."""
    per_step = config.depth_double * (attention_us - H200_MEASURED["attention_us"]) / 1e3
    if small_kernels_at is not None:
        components = {c.name: c for c in forward_components(config, 512, 2)}
        for name in ("rms_norm", "swiglu", "qkv_heads"):
            c = components[name]
            predicted_us = 1e3 * roofline_ms(c, H100, 2) / c.launches
            per_step += c.launches * (small_kernels_at * predicted_us - H200_MEASURED[f"{name}_us"]) / 1e3
    return H200_MEASURED["sampler_ms"] + steps * per_step


def attention_model_table() -> list[str]:
    rows = ["| kernel | instructions / warp / tile | exposed cycles / tile | predicted µs | measured µs |",
            "|---|---|---|---|---|"]
    for kernel, measured in ((WMMA_ATTENTION, f"{H200_MEASURED['attention_us']:.0f}"), (MMA_ATTENTION, "not yet")):
        rows.append(f"| {kernel.name} | {kernel.instructions} | {kernel.exposed_cycles} | "
                    f"{attention_kernel_us(kernel, 2, 12, 1280):.0f} | {measured} |")
    return rows


def sampler_model_table() -> list[str]:
    new = attention_kernel_us(MMA_ATTENTION, 2, 12, 1280)
    rows = ["| 10-step B/16 sampler on the H200, bf16 | ms |", "|---|---|",
            f"| measured (WMMA attention) | {H200_MEASURED['sampler_ms']:.1f} |",
            f"| with the FlashAttention-2 kernel | {sampler_with_attention_ms(new):.1f} |",
            f"| and rms_norm, swiglu, qkv_heads at 1.5x their DRAM time | {sampler_with_attention_ms(new, small_kernels_at=1.5):.1f} |"]
    return rows


# ---------------------------------------------------------------------------------------------
# Markdown tables


def component_table(components: list[Component], item: int, a: Assumptions = Assumptions()) -> list[str]:
    rows = ["| component | launches | GFLOP | MB | H100 roofline µs | H100 predicted µs | A100 roofline µs | A100 predicted µs |",
            "|---|---|---|---|---|---|---|---|"]
    for c in components:
        cells = [f"{1e3 * f(c, dev, item, *extra):.0f}" for dev in (H100, A100)
                 for f, extra in ((roofline_ms, ()), (gpu_ms, (a,)))]
        rows.append(f"| {c.name} | {c.launches} | {c.flops / 1e9:.1f} | {c.bytes / 1e6:.1f} | {' | '.join(cells)} |")
    return rows


def summary_table(a: Assumptions = Assumptions(), steps: int = 10, size: int = 512) -> list[str]:
    rows = ["| model | precision | device | CuPy + graphs ms | CuPy eager ms | PyTorch eager + SDPA ms | speed-up vs PyTorch |",
            "|---|---|---|---|---|---|---|"]
    for label, config in (("B/16", MMJIT_B16), ("L/16", MMJIT_L16)):
        for precision, item in (("bf16", 2), ("fp32", 4)):
            for device in (H100, A100):
                graph = cupy_run_ms(config, size, steps, device, item, a)
                eager = cupy_run_ms(config, size, steps, device, item, a, graph=False)
                torch = torch_run_ms(config, size, steps, device, item, a)
                rows.append(f"| {label} | {precision} | {device.name} | {graph:.1f} | {eager:.1f} | {torch:.1f} | {torch / graph:.2f}x |")
    return rows


def sensitivity_table(a: Assumptions = Assumptions(), steps: int = 10) -> list[str]:
    """How the B/16 bf16 H100 prediction moves when one assumption is 1.5x worse."""
    base = cupy_run_ms(MMJIT_B16, 512, steps, H100, 2, a)
    rows = ["| assumption | value | 1.5x worse | predicted ms | change |", "|---|---|---|---|---|"]
    for name, value in vars(a).items():
        worse = value * 1.5 if name.endswith("_us") else value / 1.5
        ms = cupy_run_ms(MMJIT_B16, 512, steps, H100, 2, replace(a, **{name: worse}))
        rows.append(f"| `{name}` | {value:g} | {worse:.3g} | {ms:.1f} | {ms - base:+.1f} |")
    return rows


MODELS = {"B/16": (MMJIT_B16, 100), "B/16-MF": (MEAN_FLOW_B16, MEAN_FLOW_RECIPE["steps"])}  # default steps


def image_table(a: Assumptions = Assumptions(), size: int = 512) -> list[str]:
    """One image with each model's default steps on an H100, T5 included."""
    rows = ["| model | steps | forward batch | text tokens | precision | T5 ms | first step + capture ms | "
            "replayed step ms | image ms |", "|---|---|---|---|---|---|---|---|---|"]
    for label, (config, steps) in MODELS.items():
        text = config.prompt_length + (config.num_aux_tokens if isinstance(config, MeanFlowConfig) else 0)
        t5 = t5_ms(T5_FLAN_LARGE, config.prompt_length, H100, a)
        for precision, item in (("bf16", 2), ("fp32", 4)):
            components, extra = forward_components(config, size, item, forward_batch(config)), sampler_launches(config)
            replay = step_ms(components, H100, item, a, a.cupy_launch_us, replayed=True, extra_launches=extra)
            first = cupy_run_ms(config, size, steps, H100, item, a) - (steps - 1) * replay
            rows.append(f"| {label} | {steps} | {forward_batch(config)} | {text} | {precision} | {t5:.1f} | "
                        f"{first:.1f} | {replay:.2f} | {image_ms(config, size, steps, H100, item, a):.1f} |")
    return rows


def tables() -> dict[str, list[str]]:
    """Every generated table of docs/performance-model.md, by heading."""
    return {
        "B/16, 512x512, bf16: one CFG forward (batch 2)": component_table(forward_components(MMJIT_B16, 512, 2), 2),
        "B/16, 512x512, fp32: one CFG forward (batch 2)": component_table(forward_components(MMJIT_B16, 512, 4), 4),
        "L/16, 512x512, bf16: one CFG forward (batch 2)": component_table(forward_components(MMJIT_L16, 512, 2), 2),
        "B/16-MF, 512x512, bf16: one student forward (batch 1)": component_table(
            forward_components(MEAN_FLOW_B16, 512, 2, batch=1), 2),
        "T5 (FLAN-T5-large), 256 tokens, fp32: one encoding": component_table(
            t5_components(T5_FLAN_LARGE, MMJIT_B16.prompt_length), 4),
        "10 steps, 512x512, predicted": summary_table(),
        "One 512x512 image with the default steps on an H100 SXM, T5 included, predicted": image_table(),
        "Sensitivity of the B/16 bf16 H100 prediction": sensitivity_table(),
        "Attention at [2, 12, 1280, 64] bf16 on the H200, issue model": attention_model_table(),
        "The 10-step sampler on the H200 with the new attention": sampler_model_table(),
    }


def main() -> int:
    for heading, rows in tables().items():
        print(f"### {heading}\n")
        print("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
