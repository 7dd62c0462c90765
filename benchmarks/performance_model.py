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


# ---------------------------------------------------------------------------------------------
# The attention kernels, pipe by pipe (an H200: the GPU they were measured on)


@dataclass(frozen=True)
class Chip:
    """What the issue and pipe models need of a GPU. `clock_ghz` is the SM clock of the run
    being modelled, a parameter: scripts/gpu-check logs it during its timed runs, and Nsight
    Compute locks it to the base clock (NCU_CLOCK_GHZ) unless run with --clock-control none.
    Pipe rates are per SM and cycle, latencies in cycles (all assumptions, none measured here):
    mma.sync m16n8k16 (4,096 FLOP) at two thirds of one per cycle, the rate wgmma's dense peak
    implies (989 TFLOP/s = 132 SMs x 1.83 GHz x 4,096; Hopper microbenchmarks, arXiv 2402.13499,
    put mma.sync at 60-70 % of it); 16 MUFU lanes (a warp's MUFU.EX2 takes 2 SM cycles); one
    shared-memory wavefront (128 bytes); 40 bytes from L2 (10 TB/s over 132 SMs at 1.98 GHz); a
    dependent HMMA ~33 cycles, a barrier once every warp is there ~30, a shuffle ~30, an L2 hit
    ~270; a DRAM round trip ~505 ns (1,000 cycles at 1.98 GHz; within the 450-600 ns
    pointer-chasing microbenchmarks report for A100 and H100 HBM, loaded), in time, not cycles:
    memory does not slow down with the SM clock."""

    name: str
    sms: int
    schedulers: int
    clock_ghz: float
    l2_latency_cycles: int
    dram_latency_ns: float
    shuffle_cycles: int
    hmma_per_cycle: float = 2 / 3
    mufu_lanes_per_cycle: int = 16
    shared_wavefronts_per_cycle: int = 1
    l2_bytes_per_cycle: float = 40.0
    hmma_cycles: int = 33
    barrier_cycles: int = 30

    @property
    def dram_latency_cycles(self) -> float:
        return self.dram_latency_ns * self.clock_ghz


# The H100 SXM has the same SMs and clock, so the same attention prediction.
H200_CHIP = Chip("H200 SXM", 132, 4, 1.98, 270, dram_latency_ns=505, shuffle_cycles=30)
NCU_CLOCK_GHZ = 1.35  # the H200's SM clock under ncu's default clock control (its report: "SM Frequency 1.35 GHz")


@dataclass(frozen=True)
class AttentionKernel:
    """One attention kernel: its launch geometry (`blocks_per_sm` resident at most), per warp and
    key tile the instructions it issues by class (HMMA, LDSM, LDGSTS, MUFU, rest, total), per
    block and tile the shared-memory wavefronts and the bytes it reads from L2 (K and V of the
    head: every query block re-reads them), and the latency of a tile that no other warp covers
    (`exposed_cycles`: every warp of a block goes through the same phases between its barriers)."""

    name: str
    rows_per_block: int
    key_tile: int
    warps: int
    blocks_per_sm: int
    per_warp_tile: dict[str, float]
    shared_wavefronts: float
    l2_bytes: float
    exposed_cycles: float


def exposed_tile_cycles(barriers: int, padded: int, key_tile: int, chip: Chip = H200_CHIP) -> float:
    """A warp's wait in a tile that its neighbours, in the same phase, do not cover: its barriers,
    S's chain of padded / 16 dependent HMMA, the quad's two max shuffles, P V's chain of
    key_tile / 16 HMMA (copies run a tile ahead: no load latency)."""
    return (barriers * chip.barrier_cycles + (padded // 16 + key_tile // 16) * chip.hmma_cycles
            + 2 * chip.shuffle_cycles)


def wavefronts_per_instruction(opcode: str) -> int:
    """Conflict-free shared-memory wavefronts of one warp instruction: ldmatrix a matrix each
    (.4, .2), a 16-byte cp.async 4 (quarter warps), an 8-byte one 2 (cudasim counts them the
    same way, and finds no excess in attention_tc.cu: tests/test_cudasim_counters.py)."""
    if opcode.startswith("LDSM"):
        return int(opcode.rsplit(".", 1)[-1])
    if opcode.startswith("LDGSTS"):
        return 4 if opcode.endswith(".128") else 2
    return 0


def mma_attention_kernel(trip, padded: int = 64, chip: Chip = H200_CHIP) -> AttentionKernel:
    """attention_tc.cu from B/16's trip through its key-tile loop (cudasim.nvrtc.loop_trip of its
    sm_90 SASS): every count comes from the machine code and kernels.py's launch constants."""
    from minit2i.accelerated import kernels

    counts, warps = trip.by_class(), kernels.MMA_WARPS
    copy_bytes = sum(16 if i.opcode.endswith(".128") else 8 for i in trip.path if i.opcode.startswith("LDGSTS"))
    return AttentionKernel(
        "mma.sync, two atoms a warp (now)", kernels.mma_rows(padded), kernels.MMA_KEY_TILES[padded], warps,
        kernels.KERNEL_CONSTANTS["MMA_MIN_BLOCKS_D64" if padded == 64 else "MMA_MIN_BLOCKS_D128"], counts,
        warps * sum(wavefronts_per_instruction(i.opcode) for i in trip.path), warps * 32 * copy_bytes,
        exposed_tile_cycles(trip.count("BAR"), padded, kernels.MMA_KEY_TILES[padded], chip))


def b16_attention_trip(arch: str = "sm_90"):
    """B/16's trip through attention_tc.cu's bf16 key-tile loop, compiled with NVRTC and ptxas (the
    [compile] extra) with the options CuPy adds that change code (-ftz=true)."""
    from minit2i.accelerated.kernels import NVRTC_OPTIONS, kernel_source
    from minit2i.cudasim import nvrtc

    ptx = nvrtc.compile_ptx(kernel_source("attention_tc.cu"), "attention_tc.cu", arch.replace("sm_", "compute_"),
                            (*NVRTC_OPTIONS, "-ftz=true"))
    code = nvrtc.sass(nvrtc.cubin(ptx, arch))["flash_attention_tc_bf16"]
    return nvrtc.loop_trip(nvrtc.key_tile_loops(code)[16])


# The WMMA kernel the H200 measured (before FlashAttention-2), from its ncu report at
# [2, 12, 1280, 64] bf16: 480 blocks of 4 warps, 4 resident per SM, 1.26 instructions per cycle
# over 1,319,587 cycles per SM, 59,166,720 shared-memory wavefronts (52 % excess). Its staging
# was synchronous: per tile 32 dependent L2 round trips a thread (a 16-bit load, its store), and
# ~1,500 cycles of shared-memory round trips (O's rescale, the scores stored and reloaded).
WMMA_NCU = {"blocks": 480, "warps": 4, "ipc": 1.26, "cycles": 1_319_587, "wavefronts": 59_166_720}


def wmma_attention_kernel(chip: Chip = H200_CHIP) -> AttentionKernel:
    m = WMMA_NCU
    tiles = 1280 // 32
    warps_per_sm = m["blocks"] * m["warps"] / chip.sms
    instructions = m["ipc"] * m["cycles"] / warps_per_sm / tiles
    hmma = (32 // 8) * (64 // 16) + (32 // 16) * (64 // 8)  # 16 rows a warp, m16n8k16 steps of S and of P V
    return AttentionKernel("WMMA (before)", 64, 32, m["warps"], 4,
                           {"HMMA": hmma, "MUFU": 32 // 2 + 2, "total": instructions},
                           m["wavefronts"] / m["blocks"] / tiles, 2 * 32 * 64 * 2,
                           32 * chip.l2_latency_cycles + 1500)


# FlashAttention-2's forward kernel at head dim 64, as PyTorch's SDPA runs it (Dao-AILab
# flash-attention, csrc/flash_attn/src: Br = Bc = 128, 4 warps of 2 m16 atoms, ~255 registers:
# 2 blocks per SM; Q re-read from shared memory every tile). Not compiled here: its instructions
# are taken as 3.5 per HMMA (the 3-4 of its SASS at this head dim), its MMAs and exponentials
# from its tile (per warp and 128-key tile: 256 HMMA; 2 atoms x (64 + 2) MUFU.EX2 a thread).
def flash_attention2_kernel(chip: Chip = H200_CHIP) -> AttentionKernel:
    hmma = 2 * ((128 // 8) * (64 // 16) + (128 // 16) * (64 // 8))
    ldsm = (128 // 8) * (64 // 32) + (128 // 16) * (64 // 16) + 2 * 64 // 16
    return AttentionKernel("FlashAttention-2 (SDPA)", 128, 128, 4, 2,
                           {"HMMA": hmma, "MUFU": 2 * (64 + 2), "total": 3.5 * hmma},
                           4 * (4 * ldsm + 2 * 128 * 64 * 2 // 128 // 4), 2 * 128 * 64 * 2,
                           exposed_tile_cycles(2, 64, 128, chip))


def attention_pipes(kernel: AttentionKernel, blocks: int, chip: Chip = H200_CHIP) -> dict[str, float]:
    """Cycles per key tile on the busiest SM, which holds `blocks` blocks, per limit: issue (an
    instruction per scheduler per cycle); the tensor pipe and MUFU together (a warp's exponentials
    wait for its S and its P V for them: FlashAttention-2 does not overlap the two, which is what
    FlashAttention-3, arXiv 2407.08608, adds); shared-memory wavefronts; L2 bytes."""
    warps, per = blocks * kernel.warps, kernel.per_warp_tile
    return {"issue": warps * per["total"] / chip.schedulers,
            "tensor + MUFU": warps * (per["HMMA"] / chip.hmma_per_cycle + per["MUFU"] * 32 / chip.mufu_lanes_per_cycle),
            "shared memory": blocks * kernel.shared_wavefronts / chip.shared_wavefronts_per_cycle,
            "L2": blocks * kernel.l2_bytes / chip.l2_bytes_per_cycle}


def attention_kernel_us(kernel: AttentionKernel, batch: int, heads: int, length: int, chip: Chip = H200_CHIP) -> float:
    """GPU time of one launch at [batch, heads, length, Dh]: the grid's waves of resident blocks;
    in each, the busiest SM's blocks (ceil(blocks / SMs), at most `blocks_per_sm`: the launch ends
    with it) take per key tile the binding pipe limit plus the exposed latency, after one DRAM
    round trip for the first tile's copies."""
    blocks = -(-length // kernel.rows_per_block) * batch * heads
    slots = chip.sms * kernel.blocks_per_sm
    waves = -(-blocks // slots)
    busiest = min(kernel.blocks_per_sm, -(-blocks // (chip.sms * waves)))
    tiles = -(-length // kernel.key_tile)
    tile = max(attention_pipes(kernel, busiest, chip).values()) + kernel.exposed_cycles
    return waves * (tiles * tile + chip.dram_latency_cycles) / (chip.clock_ghz * 1e3)


def attention_us_at(tflops: float, batch: int, heads: int, length: int, head_dim: int) -> float:
    """One attention launch [batch, heads, length, head_dim] at `tflops` (4 B H L^2 Dh FLOPs)."""
    return 4.0 * batch * heads * length**2 * head_dim / (tflops * 1e6)


def binding_pipe(kernel: AttentionKernel, batch: int, heads: int, length: int, chip: Chip = H200_CHIP) -> str:
    blocks = -(-length // kernel.rows_per_block) * batch * heads
    busiest = min(kernel.blocks_per_sm, -(-blocks // chip.sms))
    pipes = attention_pipes(kernel, busiest, chip)
    return max(pipes, key=pipes.get)


def attention_tc_efficiency(kernel: AttentionKernel, device: Device = H200) -> float:
    """The tensor-core share the model predicts for `kernel` at B/16's joint attention
    [2, 12, 1280, 64] (4 B H L^2 Dh FLOPs): what the roofline tables assume for the tensor-core
    attention (`Assumptions.attention_tc`)."""
    flops = 4.0 * 2 * 12 * 1280**2 * 64
    return flops / (device.tensor_tflops * 1e6 * attention_kernel_us(kernel, 2, 12, 1280))


@dataclass(frozen=True)
class Assumptions:
    """Achieved fractions of the roofline and per-launch costs (to be checked on a GPU)."""

    gemm: float = 0.70  # cuBLAS on these mid-size shapes (M = 512..2048, K, N = 768..4096)
    gemm_fp32: float = 0.80  # SGEMM without TF32 is compute-bound and well tuned
    attention_tc: float = 0.33  # the tensor-core kernel: the pipe model's share (attention_tc_efficiency), rounded
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
    shape: tuple[int, int, int] | None = None  # a GEMM's (M, K, N)


def gemm_component(name: str, rows: int, k: int, n: int, count: int, item: int) -> Component:
    """`count` GEMMs [rows, k] @ [k, n]: 2 rows k n FLOPs each, A and B read and C written once."""
    return Component(name, "gemm", count, 2.0 * rows * k * n * count, item * (rows * k + k * n + rows * n) * count,
                     (rows, k, n))


def memory_component(name: str, elements: float, count: int, item: int) -> Component:
    """`count` memory-bound launches that read + write `elements` elements in all."""
    return Component(name, "memory", count, 0.0, item * elements)


def forward_batch(config: MMJiTConfig) -> int:
    """Images per forward for one image: [cond ; uncond] for MMJiT, 1 for the student."""
    return 1 if isinstance(config, MeanFlowConfig) else 2


def forward_components(config: MMJiTConfig, size: int, item: int, batch: int = 2, whole: bool = False,
                       unfolded: bool = False) -> list[Component]:
    """The CuPy twin's launches in the forward of one replayed sampler step, `batch` images (item:
    bytes per element). The base model's prompt part (mask, text embedder, text-only preamble
    blocks) depends on the prompt only: the sampler runs it once per call, outside the step
    (`accelerated.mmjit.embed_prompt`; `prompt_components`); `whole` counts it in (one
    `mmjit_forward`: its FLOPs). The Mean Flow student's text stream is its A prefix tokens, which
    embed the step's h, and the L prompt tokens: its whole forward is the step, the prefix's
    launches in `prefix_components`. The last double block's text stream stops at the attention
    (the final layer reads the image tokens only); the W2 GEMM adds into the residual (beta = 1)
    and the attention output projections read each stream's rows by stride, so neither needs a
    launch of its own. `unfolded`: the forward as the first GPU run launched it, every step (the
    prompt part in, the last text stream finished, and UNFOLDED's CuPy operations)."""
    d, hidden, heads, head_dim = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    student = isinstance(config, MeanFlowConfig)
    prompt = whole or unfolded or student  # the prompt part runs in this forward
    text = text_tokens(config)
    n_img, n_txt, n_prompt = batch * (size // config.patch_size) ** 2, batch * text, batch * config.prompt_length
    joint = text + (size // config.patch_size) ** 2
    pre, dbl = (config.txt_preamble_depth if prompt else 0), config.depth_double
    last_text = 0 if unfolded else 1  # the last double block's text stream after its attention, skipped
    padded = -(-head_dim // 16) * 16 if item == 2 else head_dim  # tensor cores work on whole 16-wide tiles
    heads_in = ((n_txt, pre + dbl), (n_img, dbl))  # (rows, blocks) per stream up to the attention
    heads_out = ((n_txt, pre + dbl - last_text), (n_img, dbl))  # and after it

    def gemm(name, rows, k, n, count):
        return gemm_component(name, rows, k, n, count, item)

    def memory(name, elements, count):
        return memory_component(name, elements, count, item)

    def attention(length, count):
        flops = 4.0 * batch * heads * length * length * padded * count
        return Component(f"attention L={length}", "attention", count, flops,
                         4.0 * item * batch * heads * length * head_dim * count)

    def per_stream(name, k, n, streams):
        return [gemm(f"GEMM {name} ({label})", rows, k, n, blocks)
                for label, (rows, blocks) in zip(("txt", "img"), streams)]

    rows_in = sum(rows * blocks for rows, blocks in heads_in)
    rows_out = sum(rows * blocks for rows, blocks in heads_out)
    # patchify and unpatchify copies, proj2 and final bias adds, sin/cos add (+ the mask's compare and where)
    elementwise = 6 * n_img * config.patch_dim + 5 * n_img * d + (2 * n_prompt * config.txt_input_size if prompt else 0)
    return [
        gemm("GEMM patch proj1", n_img, config.patch_dim, config.pca_channels, 1),
        gemm("GEMM patch proj2", n_img, config.pca_channels, d, 1),
        *([gemm("GEMM text embedder", n_prompt, config.txt_input_size, d, 1)] if prompt else []),
        *per_stream("qkv", d, 3 * d, heads_in),
        *per_stream("attn proj", d, d, heads_out),
        *per_stream("w1|w3", d, 2 * hidden, heads_out),
        *per_stream("w2", hidden, d, heads_out),
        gemm("GEMM final", n_img, d, config.patch_dim, 1),
        *([attention(text, pre)] if pre else []),
        attention(joint, dbl),
        memory("rms_norm", 2 * d * (rows_in + n_img), pre + 2 * dbl + 1),  # norm1 per stream + final norm
        memory("add_rms_norm", 4 * d * rows_out, pre + 2 * dbl - last_text),
        memory("qkv_heads", 6 * d * rows_in, pre + 2 * dbl),
        memory("swiglu", 3 * hidden * rows_out, pre + 2 * dbl - last_text),
        *(unfolded_components(config, size, item, batch) if unfolded else []),
        memory("embed/final elementwise (CuPy)", elementwise, 7 if prompt else 5),
        *([] if prompt else [memory("embedded prompt copy (CuPy)", 2 * n_txt * d, 1)]),  # the step's text stream
        *(prefix_components(config, item, batch) if student else []),
    ]


def prompt_components(config: MMJiTConfig, size: int, item: int, batch: int = 2) -> list[Component]:
    """The base model's launches once per sampler call, outside the replayed step (none for the
    student): what the whole forward launches beyond the step."""
    step = {c.name: c for c in forward_components(config, size, item, batch)}
    return [replace(c, launches=c.launches - step[c.name].launches, flops=c.flops - step[c.name].flops,
                    bytes=c.bytes - step[c.name].bytes) if c.name in step else c
            for c in forward_components(config, size, item, batch, whole=True)
            if c.name not in step or c.launches > step[c.name].launches]


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
    the projection biases ride in cuBLAS (F.linear), so the GEMMs are the same. It runs the whole
    forward every step, as the twin did before its folds (`unfolded`): the residual adds after the
    MLPs and the copies of the attention output's two slices too."""
    ours = {c.name: c for c in forward_components(config, size, item, batch, unfolded=True)}
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
    """accelerated.sampler.sample (or the student's sample_mean_flow, the same loop) on a runner's
    first call: the prompt part once, step 0 eager, step 1 captured (recorded at host speed, then
    launched), steps 2.. replayed; without graphs every step is eager."""
    components, extra = forward_components(config, size, item, forward_batch(config)), sampler_launches(config)
    prompt = prompt_ms(config, size, device, item, a, forward_batch(config))
    eager = step_ms(components, device, item, a, a.cupy_launch_us, replayed=False, extra_launches=extra)
    if not graph or steps < 2:
        return prompt + steps * eager
    replay = step_ms(components, device, item, a, a.cupy_launch_us, replayed=True, extra_launches=extra)
    capture_host = (sum(c.launches for c in components) + extra) * a.cupy_launch_us / 1e3
    return prompt + eager + capture_host + (steps - 1) * replay


def prompt_ms(config: MMJiTConfig, size: int, device: Device, item: int, a: Assumptions, batch: int) -> float:
    """The base model's prompt part, once per sampler call, eager (`prompt_components`)."""
    return step_ms(prompt_components(config, size, item, batch), device, item, a, a.cupy_launch_us, replayed=False,
                   extra_launches=0)


def t5_ms(config: T5Config, length: int, device: Device, a: Assumptions) -> float:
    """One T5 encoding, eager (it runs once per prompt), fp32."""
    return step_ms(t5_components(config, length), device, 4, a, a.cupy_launch_us, replayed=False, extra_launches=0)


def image_ms(config: MMJiTConfig, size: int, steps: int, device: Device, item: int, a: Assumptions) -> float:
    """One image from its prompt: T5 once, then the sampler with graph replay."""
    return t5_ms(T5_FLAN_LARGE, config.prompt_length, device, a) + cupy_run_ms(config, size, steps, device, item, a)


def torch_run_ms(config, size, steps, device, item, a: Assumptions) -> float:
    components = torch_components(config, size, item)
    return steps * step_ms(components, device, item, a, a.torch_launch_us, replayed=False)


# Measured on one H200 (its first run): by CUDA events, side by side in one call (random B/16
# weights, 10 steps at 512 x 512, CFG 6, bf16), the sampler with the WMMA attention and the fused
# kernels before their 16-byte packs, and one attention launch at [2, 12, 1280, 64] (20 launches
# each): the WMMA kernel's and torch SDPA's (FlashAttention-2). By Nsight Compute
# (gpu__time_duration, at its locked 1.35 GHz SM clock, caches flushed before each launch; GPU
# time only) three of those fused kernels at the image stream's shapes (benchmarks/gpu.py's
# kernel_cases).
H200_MEASURED = {"sampler_ms": 151.7, "attention_us": 623.0, "sdpa_us": 29.6}
H200_NCU_US = {"rms_norm": 9.2, "swiglu": 26.3, "qkv_heads": 20.9}
# How far this model may land from each of those measurements (model / measured) for it to stand:
# attention within 30 %; the memory-bound launches, microseconds long, within 0.5-1.5x (their
# ramp-up and drain, which no term models, is a large share of them).
ATTENTION_BAND = (0.7, 1.3)
MEMORY_BAND = (0.5, 1.5)


# ---------------------------------------------------------------------------------------------
# The memory-bound kernels, round trip by round trip (an H200)


@dataclass(frozen=True)
class MemoryLaunch:
    """One launch of a memory-bound kernel as its code and SASS show it.

    blocks of `threads`, `resident` of them per SM (ptxas's registers: docs/kernels.md); one warp
    waits, in order, through `dram_trips` DRAM and `l2_trips` L2 round trips (loads issued
    together are one trip; a load whose value the next step needs before the next load issues is
    one trip each) and `shuffles` dependent shuffles or barriers, and issues `instructions`;
    `bytes` cross DRAM."""

    name: str
    blocks: int
    threads: int
    resident: int
    dram_trips: int
    l2_trips: int
    shuffles: int
    instructions: int
    bytes: float

    def chain_cycles(self, chip: Chip) -> int:
        """A warp's latency chain: its round trips and shuffles, plus one cycle per instruction."""
        return (self.dram_trips * chip.dram_latency_cycles + self.l2_trips * chip.l2_latency_cycles
                + self.shuffles * chip.shuffle_cycles + self.instructions)


def memory_launch_us(launch: MemoryLaunch, chip: Chip = H200_CHIP, device: Device = H200) -> float:
    """GPU time of one launch: the longest of three limits. Latency: the grid's waves of resident
    blocks (at least one), each as long as a warp's chain. Bandwidth: one chain (the first loads
    wait a DRAM latency before bytes stream, the last stores follow the math) plus the bytes at
    DRAM bandwidth. Issue: all warps' instructions on the SMs' schedulers. Little's law says which
    wins: bytes in flight per SM (resident warps x bytes each loads per trip) against latency x
    bandwidth per SM (4.8 TB/s x 505 ns / 132 SMs = 18 KB)."""
    waves = max(1.0, launch.blocks / (chip.sms * launch.resident))
    warps = launch.blocks * launch.threads // 32
    cycles = max(waves * launch.chain_cycles(chip),
                 launch.chain_cycles(chip) + launch.bytes / (device.bandwidth_tbs * 1e12) * chip.clock_ghz * 1e9,
                 warps * launch.instructions / (chip.sms * chip.schedulers))
    return cycles / (chip.clock_ghz * 1e3)


def dram_us(launch: MemoryLaunch, device: Device = H200) -> float:
    return launch.bytes / (device.bandwidth_tbs * 1e6)


# Before: one block of 256 threads per row (16 registers: 8 blocks per SM); each thread walks the
# row 2 bytes at a time in a loop that is not unrolled (one LDG.E.U16 per trip, its FFMA right
# after: a DRAM round trip per 256 values), block_sum (10 shuffles, 2 barriers), then a second
# loop re-reading x and weight (L2). ~190 instructions a warp at 768 (loops of 10 and 20
# instructions run 3 times each, ~100 around them).
def rms_norm_before(rows: int, width: int, item: int = 2) -> MemoryLaunch:
    trips = -(-width // 256)
    return MemoryLaunch("rms_norm (before)", rows, 256, 8, trips, trips, 12, 30 * trips + 100, 2 * rows * width * item)


# Before: the same, with a first loop adding delta and bias into the residual (3 loads issued
# together, a store: 22 instructions) and both norm passes re-reading the residual from L2.
def add_rms_norm_before(rows: int, width: int, item: int = 2) -> MemoryLaunch:
    trips = -(-width // 256)
    return MemoryLaunch("add_rms_norm (before)", rows, 256, 8, trips, 2 * trips, 12, 52 * trips + 100,
                        4 * rows * width * item)


# Before: one thread per output value over min(total / 256, 65535) blocks (38 registers: 6 per
# SM); per value a 64-bit i / hidden and i % hidden (I2F.U64.RP's fast 32-bit path), the gate's
# 2-byte load, SiLU, then the up value's load (issued after the SiLU: a second trip) and the
# store: a 79-instruction loop, ~110 instructions a warp.
def swiglu_before(rows: int, hidden: int, item: int = 2) -> MemoryLaunch:
    total = rows * hidden
    blocks = min(-(-total // 256), 65535)
    per_thread = -(-total // (blocks * 256))
    return MemoryLaunch("swiglu (before)", blocks, 256, 6, 2 * per_thread, 0, 0, 80 * per_thread + 30, 3 * total * item)


# Before: one warp per (token, head), 4 a block (40 registers: 12 blocks per SM), q, k and v one
# after another: per head its 2-byte loads (lo, hi, their biases: one trip), for q and k 5
# shuffles and the norm weight and cos/sin (an L2 trip after the sum); 64-bit divisions for the
# token and batch; ~600 straight-line instructions to the exit, ~500 on B/16's path.
def qkv_heads_before(tokens: int, heads: int, head_dim: int, item: int = 2) -> MemoryLaunch:
    return MemoryLaunch("qkv_heads (before)", -(-tokens * heads // 4), 128, 12, 3, 2, 10, 500,
                        2 * tokens * 3 * heads * head_dim * item)


# Now: a warp per row, 8 a block (96 registers on sm_90: 2 blocks per SM); each lane issues its
# up-to-8 16-byte loads at once (one trip), warp_sum (5 shuffles), then the weight (an L2 trip)
# and the stores; ~60 instructions per pack a lane holds, ~100 around them (the SASS's pass loops
# of 221 and 258 instructions hold 8 pack slots).
def rms_norm_now(rows: int, width: int, item: int = 2) -> MemoryLaunch:
    per_lane = -(-width * item // (16 * 32))
    return MemoryLaunch("rms_norm (now)", -(-rows // 8), 256, 2, 1, 1, 5, 60 * per_lane + 100, 2 * rows * width * item)


# Now: residual, delta and bias packs at once (one trip), the sum stored and kept (123 registers:
# 2 blocks per SM); the pass loop of 750 instructions holds 8 slots: ~126 per pack.
def add_rms_norm_now(rows: int, width: int, item: int = 2) -> MemoryLaunch:
    per_lane = -(-width * item // (16 * 32))
    return MemoryLaunch("add_rms_norm (now)", -(-rows // 8), 256, 2, 1, 1, 5, 126 * per_lane + 100,
                        4 * rows * width * item)


# Now: a thread per 16-byte pack of a row (grid x) and a block row per row (grid y, no division);
# gate and up packs at once (one trip), 8 SiLUs, one 16-byte store: the 247-instruction loop
# once, ~290 a warp (38 registers on sm_90: 6 blocks per SM).
def swiglu_now(rows: int, hidden: int, item: int = 2) -> MemoryLaunch:
    packs = -(-hidden * item // 16)
    return MemoryLaunch("swiglu (now)", -(-packs // 256) * rows, 256, 6, 1, 0, 0, 290, 3 * rows * hidden * item)


# Now: a group of 4 lanes per head vector at Dh 64 (one 16-byte pack pair each: 8 vectors a warp,
# 4 warps a block, 72 registers: 7 blocks per SM); qkv and bias packs at once (one trip), 2
# shuffles, norm weight and cos/sin (one L2 trip); the 679-instruction loop with its second pair
# slot skipped: ~440 a warp.
def qkv_heads_now(tokens: int, heads: int, head_dim: int, item: int = 2) -> MemoryLaunch:
    lanes = -(-head_dim * item // 32)
    return MemoryLaunch("qkv_heads (now)", -(-tokens * 3 * heads * lanes // 128), 128, 7, 1, 1, 2, 440,
                        2 * tokens * 3 * heads * head_dim * item)


def cfg_image_rows(config: MMJiTConfig, size: int) -> int:
    """The image stream's token rows in one batched CFG forward (the conditional and unconditional halves)."""
    return 2 * (size // config.patch_size) ** 2


def fused_kernel_launches(config: MMJiTConfig = MMJIT_B16, size: int = 512, item: int = 2) -> dict[str, MemoryLaunch]:
    """The fused kernels now at benchmarks/gpu.py's shapes (the image stream of one batched CFG
    forward), by the name of its case (geglu as swiglu: the same loads, tanh-GELU for SiLU); the
    blocks resident per SM are the bf16 entry points' on sm_90 (tests/test_kernels_compile.py)."""
    tokens = cfg_image_rows(config, size)
    d, hidden, heads, dh = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    return {"rms_norm": rms_norm_now(tokens, d, item), "add_rms_norm": add_rms_norm_now(tokens, d, item),
            "swiglu": swiglu_now(tokens, hidden, item),
            "geglu": replace(swiglu_now(tokens, hidden, item), name="geglu (now)", resident=8),  # 32 registers
            "qkv_heads": qkv_heads_now(tokens, heads, dh, item)}


def measured_cases(config: MMJiTConfig = MMJIT_B16, size: int = 512) -> dict[str, tuple[MemoryLaunch, MemoryLaunch]]:
    """{kernel: (before, now)} at the shapes of H200_NCU_US."""
    tokens = cfg_image_rows(config, size)
    d, hidden, heads, dh = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    now = fused_kernel_launches(config, size)
    return {"rms_norm": (rms_norm_before(tokens, d), now["rms_norm"]),
            "swiglu": (swiglu_before(tokens, hidden), now["swiglu"]),
            "qkv_heads": (qkv_heads_before(tokens, heads, dh), now["qkv_heads"])}


NCU_CHIP = replace(H200_CHIP, clock_ghz=NCU_CLOCK_GHZ)  # the H200 as Nsight Compute ran it


def text_tokens(config: MMJiTConfig) -> int:
    """Tokens of the text stream: the prompt's, and the student's prefix tokens before them."""
    return config.prompt_length + (config.num_aux_tokens if isinstance(config, MeanFlowConfig) else 0)


def fused_kernel_launches_by_stream(config: MMJiTConfig = MMJIT_B16, size: int = 512, batch: int = 2,
                                    folded: bool = True) -> list[tuple[str, MemoryLaunch, MemoryLaunch, int]]:
    """(stream, before, now, launches per forward) of the four fused kernels in one step's forward
    of `batch` images (trunk_components' structure): per block of each stream rms_norm, qkv_heads,
    add_rms_norm and swiglu, and the final norm (stream "final"). The text stream holds the prompt
    tokens and, for the student, its prefix tokens; its blocks are the preamble's (where the
    forward holds them) and the double blocks', the last one's stopping at the attention when
    `folded`."""
    d, hidden, heads, dh = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    text, image = batch * text_tokens(config), batch * (size // config.patch_size) ** 2
    launched = {c.name: c.launches for c in trunk_components(config, size, 2, batch, folded)}
    image_blocks = config.depth_double
    found = [("final", rms_norm_before(image, d), rms_norm_now(image, d), 1)]
    for stream, rows in (("txt", text), ("img", image)):
        def blocks(name, extra=0):
            return image_blocks if stream == "img" else launched[name] - image_blocks - extra
        found += [(stream, rms_norm_before(rows, d), rms_norm_now(rows, d), blocks("rms_norm", 1)),
                  (stream, qkv_heads_before(rows, heads, dh), qkv_heads_now(rows, heads, dh), blocks("qkv_heads")),
                  (stream, add_rms_norm_before(rows, d), add_rms_norm_now(rows, d), blocks("add_rms_norm")),
                  (stream, swiglu_before(rows, hidden), swiglu_now(rows, hidden), blocks("swiglu"))]
    return found


# ---------------------------------------------------------------------------------------------
# GEMMs tile by tile, and the sampler built from its parts (an H200)

# cuBLAS's CTA tiles for half-precision GEMMs (rows of M x columns of N), from the most efficient
# to the least: the sizes NVIDIA's "Matrix Multiplication Background" guide (DU-09799-001,
# sections 2.3 and 3) gives for cuBLAS, which cublasLt also names (cublasLtMatmulTile_t); CUTLASS's
# Hopper GEMMs tile the same way (128 x 128 and 128 x 256 CTAs of two consumer warpgroups). Which
# one cuBLAS's heuristic takes for a shape is not published: the model takes the fastest by its
# own arithmetic (`cublas_plan`), the optimistic end of what the heuristic aims at.
GEMM_TILES = ((256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64))
# A large GEMM's main loop at 80 % of the dense peak: the rate the floors of a set assume.
LARGE_GEMM_EFFICIENCY = 0.8


@dataclass(frozen=True)
class GemmPlan:
    """One GEMM as cuBLAS runs it: CTAs of `tile` (rows of M, columns of N), `tiles` of them in
    `waves` waves on the SMs, each wave a tile's time (`tile_us`). A last wave of fewer tiles than
    SMs leaves the rest idle (wave quantisation), a tile past the matrix's edge computes padding
    (tile quantisation)."""

    tile: tuple[int, int]
    tiles: int
    waves: int
    tile_us: float

    @property
    def us(self) -> float:
        return self.waves * self.tile_us

    @property
    def sm_us(self) -> float:
        """The SM time its tiles hold: what another stream's GEMM cannot use meanwhile."""
        return self.tiles * self.tile_us


def tile_share(tile: tuple[int, int], item: int = 2, chip: Chip = H200_CHIP, device: Device = H200) -> float:
    """Share of the dense tensor peak a tile's main loop keeps: LARGE_GEMM_EFFICIENCY, or less where
    the SM's L2 bandwidth cannot feed it. Each step of K reads (rows + columns) x item bytes of A
    and B for 2 x rows x columns FLOPs: a 128 x 256 tile does 85 FLOP a byte, and an SM's share of
    the peak (7.5 TFLOP/s) needs 95 at 40 bytes a cycle (79 GB/s at 1.98 GHz)."""
    rows, cols = tile
    per_sm = device.tensor_tflops * 1e12 / chip.sms
    fed = 2 * rows * cols / ((rows + cols) * item) * chip.l2_bytes_per_cycle * chip.clock_ghz * 1e9
    return min(LARGE_GEMM_EFFICIENCY, fed / per_sm)


def gemm_plan(m: int, k: int, n: int, tile: tuple[int, int], item: int = 2, accumulate: bool = False,
              chip: Chip = H200_CHIP, device: Device = H200) -> GemmPlan:
    """[M, K] @ [K, N] in CTAs of `tile`: ceil(M / rows) x ceil(N / columns) tiles in ceil(tiles / SMs)
    waves. A wave takes one DRAM round trip before its first operands arrive, the tile's main loop
    over K at `tile_share`, and its epilogue: the tile's outputs written (read first when
    `accumulate`: cuBLAS's beta = 1) at the SM's L2 bandwidth."""
    rows, cols = tile
    tiles = -(-m // rows) * -(-n // cols)
    l2_bytes_per_us = chip.l2_bytes_per_cycle * chip.clock_ghz * 1e3
    main = 2 * rows * cols * k / (tile_share(tile, item, chip, device) * device.tensor_tflops * 1e6 / chip.sms)
    epilogue = rows * cols * item * (2 if accumulate else 1) / l2_bytes_per_us
    return GemmPlan(tile, tiles, -(-tiles // chip.sms), chip.dram_latency_ns / 1e3 + main + epilogue)


def cublas_plan(m: int, k: int, n: int, item: int = 2, accumulate: bool = False, chip: Chip = H200_CHIP,
                device: Device = H200, tiles=GEMM_TILES) -> GemmPlan:
    """The fastest of `tiles` for the shape (cuBLAS's heuristic at its best)."""
    return min((gemm_plan(m, k, n, tile, item, accumulate, chip, device) for tile in tiles), key=lambda plan: plan.us)


def overlapped_us(first_us: float, second_us: float, shared_us: float) -> float:
    """Two streams' work between two joins, run at once: as long as the longer stream, and never
    shorter than what both need of the resources they share (`shared_us`: their GEMM tiles' SM time
    over all SMs plus their memory-bound kernels' DRAM time)."""
    return max(first_us, second_us, shared_us)


# The GEMM the first H200 run timed, [2048, 768] x [768, 2304] bf16 (benchmarks/gpu.py's "GEMM qkv
# (cuBLAS)"): one call between two CUDA events, the best of 20, 32.0-39.5 µs (183-226 TFLOP/s).
# The same method timed rms_norm at 20.3-28.0 µs in the same runs, where Nsight Compute put its GPU
# time at 9.2 µs (at 1.35 GHz: at most that at the event runs' clock): each event pair held at least
# 11.1-18.8 µs of a call's host time (Python, argument checks, the output's allocation, the
# launch), so the GEMM's GPU time was at most 20.9 µs where its call's host time was no shorter.
QKV_GEMM_SHAPE = (2048, 768, 2304)
QKV_GEMM_EVENTS_US = ((32.0, 20.3), (39.5, 28.0))  # (GEMM, rms_norm) per run, the same event method


def qkv_gemm_bounds_us() -> tuple[float, float]:
    """(lowest, highest) GPU time the first run allows the qkv GEMM: its FLOPs at the rate large
    GEMMs reach, and the event time less the host time the same method held for rms_norm."""
    m, k, n = QKV_GEMM_SHAPE
    lowest = 2.0 * m * k * n / (LARGE_GEMM_EFFICIENCY * H200.tensor_tflops * 1e6)
    return lowest, min(gemm - (norm - H200_NCU_US["rms_norm"]) for gemm, norm in QKV_GEMM_EVENTS_US)


@dataclass(frozen=True)
class Trunk:
    """How a sampler step runs: its kernels and its launch structure.

    `attention`: the joint attention's kernel (the pipe model), or `joint_attention_us` a measured
    time instead, or `joint_attention_tflops` a rate (a published kernel's); `fused`: the fused
    kernels "before" or "now" (16-byte packs); `folded`: the residual adds in the W2 GEMM (cuBLAS
    beta = 1) and the attention output read by stride, so no CuPy add or slice copy; `fork`: the text stream on a second CUDA stream inside the graph,
    joined at each joint attention; `tiles`: the CTA tiles cuBLAS may pick; `swiglu_in_gemm`: the
    SwiGLU done in the W1|W3 GEMM's epilogue, so no swiglu launch (not built: cuBLAS has no such
    epilogue, so it takes a GEMM of our own; what the set would gain)."""

    attention: AttentionKernel
    fused: str = "now"
    folded: bool = True
    fork: bool = True
    joint_attention_us: float | None = None
    tiles: tuple = GEMM_TILES
    swiglu_in_gemm: bool = False
    joint_attention_tflops: float | None = None


# The launches the first GPU run made and a folded trunk does not: the MLP's residual add after each
# W2 GEMM, and the attention output's text and image rows copied out before their projections.
UNFOLDED = ("residual add (CuPy)", "attention output slices (CuPy copy)")


def unfolded_components(config: MMJiTConfig, size: int, item: int, batch: int) -> list[Component]:
    """The CuPy operations a folded trunk does without, per forward (UNFOLDED)."""
    d, pre, dbl = config.hidden_size, config.txt_preamble_depth, config.depth_double
    n_txt, n_img = batch * text_tokens(config), batch * (size // config.patch_size) ** 2
    rows_all = n_txt * (pre + dbl) + n_img * dbl
    return [memory_component(UNFOLDED[0], 3 * d * rows_all, pre + 2 * dbl, item),
            memory_component(UNFOLDED[1], 2 * d * (n_txt + n_img) * dbl, 2 * dbl, item)]


def trunk_components(config: MMJiTConfig, size: int, item: int, batch: int, folded: bool) -> list[Component]:
    """A replayed step's forward (forward_components): folded as the twin runs it now, or unfolded
    as the first GPU run did (the prompt part every step, the UNFOLDED operations)."""
    return forward_components(config, size, item, batch, unfolded=not folded)


def sampler_update(config: MMJiTConfig, size: int, item: int, images: int) -> Component:
    """The step's update kernel (cfg_euler, or the student's euler_step): the float32 state read and
    written, the forward's input written and its output read."""
    state = images * config.in_channels * size * size
    return Component("sampler update", "memory", 1, 0.0, state * (8 + 2 * forward_batch(config) * item))


def step_launches(config: MMJiTConfig, size: int, trunk: Trunk, images: int = 1) -> int:
    """Graph nodes of one step: the forward's launches and the sampler's."""
    batch = images * forward_batch(config)
    return sum(c.launches for c in trunk_components(config, size, 2, batch, trunk.folded)
               if not (trunk.swiglu_in_gemm and c.name == "swiglu")) + sampler_launches(config)


@dataclass
class StreamBlock:
    """One stream's work in one double block, between two joint attentions: its kernels' GPU µs,
    its GEMM tiles' SM µs, its memory-bound kernels' DRAM µs and its launches."""

    us: float = 0.0
    sm_us: float = 0.0
    dram_us: float = 0.0
    launches: int = 0

    def add(self, us: float, sm_us: float = 0.0, dram: float = 0.0) -> None:
        self.us, self.sm_us, self.dram_us, self.launches = (self.us + us, self.sm_us + sm_us, self.dram_us + dram,
                                                            self.launches + 1)


FUSED_KERNELS = ("rms_norm", "add_rms_norm", "qkv_heads", "swiglu")


def step_parts(config: MMJiTConfig, size: int, trunk: Trunk, images: int = 1, chip: Chip = H200_CHIP,
               device: Device = H200, a: Assumptions = Assumptions()) -> dict[str, float]:
    """µs of one replayed bf16 step of `images` images, by part: the GEMMs (cublas_plan, W2
    accumulating into the residual when folded), the attentions (attention_kernel_us), the fused
    kernels (memory_launch_us, before or now), the other memory-bound launches (their bytes at
    `a.memory` of the bandwidth), the gaps between the graph's nodes, and with the fork what the
    text stream's double blocks take off by running beside the image stream's (a negative part:
    per double block overlapped_us of the two streams' GEMMs, fused kernels and gaps, against
    their sum)."""
    item, batch = 2, images * forward_batch(config)
    blocks = {"txt": StreamBlock(), "img": StreamBlock()}
    gemm_us = attention_us = other_us = fused_us = 0.0
    for c in trunk_components(config, size, item, batch, trunk.folded):
        if c.kind == "gemm":
            plan = cublas_plan(*c.shape, item, trunk.folded and c.name.startswith("GEMM w2"), chip, device,
                               trunk.tiles)
            gemm_us += c.launches * plan.us
            stream = next((label for label in blocks if c.name.endswith(f"({label})")), None)
            if stream:
                blocks[stream].add(plan.us, sm_us=plan.sm_us)
        elif c.kind == "attention":
            length = int(c.name.split("=")[1])
            joint = length > text_tokens(config)
            if joint and trunk.joint_attention_tflops is not None:
                us = attention_us_at(trunk.joint_attention_tflops, batch, config.num_heads, length, config.head_dim)
            elif joint and trunk.joint_attention_us is not None:
                us = trunk.joint_attention_us
            else:
                us = attention_kernel_us(trunk.attention, batch, config.num_heads, length, chip)
            attention_us += c.launches * us
        elif c.name not in FUSED_KERNELS:
            other_us += 1e3 * gpu_ms(c, device, item, a)
    other_us += 1e3 * gpu_ms(sampler_update(config, size, item, images), device, item, a)
    for stream, before, now, count in fused_kernel_launches_by_stream(config, size, batch, trunk.folded):
        launch = before if trunk.fused == "before" else now
        if trunk.swiglu_in_gemm and launch.name.startswith("swiglu"):
            continue
        fused_us += count * memory_launch_us(launch, chip, device)
        if stream in blocks:
            blocks[stream].add(memory_launch_us(launch, chip, device), dram=dram_us(launch, device))
    gap = a.graph_gap_us
    parts = {"GEMMs (cuBLAS)": gemm_us, "attention": attention_us, "fused memory-bound kernels": fused_us,
             "other memory-bound launches": other_us,
             "gaps between graph nodes": step_launches(config, size, trunk, images) * gap}
    if trunk.fork:
        txt, img = (block.us + block.launches * gap for block in blocks.values())
        shared = sum(block.sm_us for block in blocks.values()) / chip.sms + sum(b.dram_us for b in blocks.values())
        hidden = txt + img - overlapped_us(img, txt, shared)
        parts["text stream beside the image stream"] = -config.depth_double * hidden
    return parts


def sampler_parts(config: MMJiTConfig, size: int, steps: int, trunk: Trunk, first_call: bool = True,
                  images: int = 1, chip: Chip = H200_CHIP, device: Device = H200,
                  a: Assumptions = Assumptions()) -> dict[str, float]:
    """ms of one `sample` call by part: `steps` replayed steps (step_parts), the folded trunk's
    prompt part once (eager: `prompt_ms`), and on a first call (a graph not kept from an earlier
    one) step 0 run eagerly (the longer of its GPU time and its launches' host time) and step 1
    recorded at host speed, less the replay they stand for."""
    step = step_parts(config, size, trunk, images, chip, device, a)
    parts = {name: steps * us / 1e3 for name, us in step.items()}
    if trunk.folded:
        parts["prompt part, once a call"] = prompt_ms(config, size, device, 2, a, images * forward_batch(config))
    replay, host = sum(step.values()) / 1e3, step_launches(config, size, trunk, images) * a.cupy_launch_us / 1e3
    parts["eager step 0 and capture"] = max(0.0, host - replay) + host if first_call and steps > 1 else 0.0
    return parts


def sampler_call_ms(config: MMJiTConfig, size: int, steps: int, trunk: Trunk, first_call: bool = True,
                    images: int = 1, chip: Chip = H200_CHIP, device: Device = H200,
                    a: Assumptions = Assumptions()) -> float:
    return sum(sampler_parts(config, size, steps, trunk, first_call, images, chip, device, a).values())


def first_run_trunk(attention: AttentionKernel | None = None) -> Trunk:
    """The first H200 run's sampler: WMMA attention (at its measured 623 µs unless `attention` is
    given), the fused kernels before their packs, no fold, no fork (and no graph kept)."""
    return Trunk(attention or wmma_attention_kernel(), fused="before", folded=False, fork=False,
                 joint_attention_us=None if attention else H200_MEASURED["attention_us"])


# How far the model may land from the first run's 10-step sampler (model / measured) for it to stand.
# The joint attentions, at their measured 623 µs, are 70 % of it, so the total's band says little
# about the rest: the parts no measurement pins (GEMMs, fused kernels, other launches, gaps, step 0
# and the capture; the measured total less the attentions) must land within the attention's band,
# the loosest of those parts' own (GEMMs within their anchor, fused kernels 0.5-1.5x); the total
# within 15 %, a band the rest could only leave by missing its own.
SAMPLER_BAND = (0.85, 1.15)
UNPINNED_BAND = ATTENTION_BAND


def first_run_fit() -> tuple[float, float]:
    """(model / measured) of the first run's 10-step sampler, and of its parts besides attention."""
    parts = sampler_parts(MMJIT_B16, 512, 10, first_run_trunk())
    total, attention = sum(parts.values()), parts["attention"]
    return total / H200_MEASURED["sampler_ms"], (total - attention) / (H200_MEASURED["sampler_ms"] - attention)


def attention_fits(new: AttentionKernel) -> list[tuple[AttentionKernel, float | None]]:
    """(kernel, measured µs or None) of the attention table: the two measured, then the new one."""
    return [(wmma_attention_kernel(), H200_MEASURED["attention_us"]),
            (flash_attention2_kernel(), H200_MEASURED["sdpa_us"]), (new, None)]


def attention_model_table(new: AttentionKernel) -> list[str]:
    rows = ["| kernel | blocks per SM (busiest) | instructions / warp / tile | HMMA | MUFU | issue | tensor + MUFU | "
            "shared memory | L2 | exposed | binding | predicted µs | measured µs | predicted / measured |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for kernel, measured in attention_fits(new):
        blocks = -(-1280 // kernel.rows_per_block) * 24
        busiest = min(kernel.blocks_per_sm, -(-blocks // H200_CHIP.sms))
        pipes = attention_pipes(kernel, busiest)
        us = attention_kernel_us(kernel, 2, 12, 1280)
        per = kernel.per_warp_tile
        rows.append(f"| {kernel.name} | {busiest} | {per['total']:.0f} | {per['HMMA']:.0f} | {per['MUFU']:.0f} | "
                    + " | ".join(f"{pipes[name]:.0f}" for name in ("issue", "tensor + MUFU", "shared memory", "L2"))
                    + f" | {kernel.exposed_cycles:.0f} | {binding_pipe(kernel, 2, 12, 1280)} | {us:.1f} | "
                    + (f"{measured:.1f} | {us / measured:.2f} |" if measured else "not yet | - |"))
    return rows


def memory_model_table() -> list[str]:
    rows = ["| kernel | blocks (resident / SM) | DRAM + L2 trips, shuffles / warp | instructions / warp | "
            "chain cycles at 1.35 GHz | predicted µs at 1.35 GHz | ncu µs | predicted / measured | "
            "predicted µs at 1.98 GHz | DRAM time µs | GPU / DRAM time |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (before, now) in measured_cases().items():
        for launch, measured in ((before, H200_NCU_US[name]), (now, None)):
            at_ncu, gpu = memory_launch_us(launch, NCU_CHIP), memory_launch_us(launch)
            ratio = f"{at_ncu / measured:.2f}" if measured else "-"
            rows.append(f"| {launch.name} | {launch.blocks} ({launch.resident}) | "
                        f"{launch.dram_trips} + {launch.l2_trips}, {launch.shuffles} | {launch.instructions} | "
                        f"{launch.chain_cycles(NCU_CHIP):.0f} | {at_ncu:.1f} | {measured if measured else 'not yet'} | "
                        f"{ratio} | {gpu:.1f} | {dram_us(launch):.1f} | {gpu / dram_us(launch):.2f} |")
    return rows


def forward_gemm_shapes(config: MMJiTConfig = MMJIT_B16, size: int = 512, batch: int = 2) -> dict[str, tuple]:
    """{name: (M, K, N)} of the trunk's eight GEMM shapes in one forward (4 a stream)."""
    return {c.name.removeprefix("GEMM "): c.shape for c in forward_components(config, size, 2, batch)
            if c.kind == "gemm" and c.name.endswith(("(txt)", "(img)"))}


def gemm_shape_table(chip: Chip = H200_CHIP, device: Device = H200) -> list[str]:
    rows = ["| GEMM | M x K x N | tile | tiles | waves | SMs busy in the last wave | predicted µs | TFLOP/s | "
            "128 x 256 tiles only, µs |", "|---|---|---|---|---|---|---|---|---|"]
    for name, (m, k, n) in forward_gemm_shapes().items():
        accumulate = name.startswith("w2")
        plan = cublas_plan(m, k, n, 2, accumulate, chip, device)
        last = plan.tiles - (plan.waves - 1) * chip.sms
        fixed = gemm_plan(m, k, n, (128, 256), 2, accumulate, chip, device)
        rows.append(f"| {name}{' (+= residual)' if accumulate else ''} | {m} x {k} x {n} | {plan.tile[0]} x "
                    f"{plan.tile[1]} | {plan.tiles} | {plan.waves} | {last} of {chip.sms} | {plan.us:.1f} | "
                    f"{2.0 * m * k * n / plan.us / 1e6:.0f} | {fixed.us:.1f} |")
    return rows


def sampler_trunks(new: AttentionKernel) -> dict[str, tuple[Trunk, bool]]:
    """The columns of the sampler table: (trunk, first call) from the first GPU run to now."""
    return {"first H200 run (WMMA at its measured 623 µs)": (first_run_trunk(), True),
            "first H200 run (WMMA by its model)": (first_run_trunk(wmma_attention_kernel()), True),
            "kernels now, one stream": (Trunk(new, folded=False, fork=False), True),
            "+ adds folded, strided reads": (Trunk(new, fork=False), True),
            "+ stream fork": (Trunk(new), True),
            "+ kept graph (a second call)": (Trunk(new), False)}


def sampler_parts_table(new: AttentionKernel, chip: Chip = H200_CHIP, device: Device = H200) -> list[str]:
    columns = {label: sampler_parts(MMJIT_B16, 512, 10, trunk, first, chip=chip, device=device)
               for label, (trunk, first) in sampler_trunks(new).items()}
    names = list(dict.fromkeys(name for parts in columns.values() for name in parts))
    rows = ["| 10-step B/16 sampler, bf16, H200 ms | " + " | ".join(columns) + " |",
            "|---|" + "---|" * len(columns)]
    rows += [f"| {name} | " + " | ".join(f"{parts.get(name, 0.0):.1f}" for parts in columns.values()) + " |"
             for name in names]
    rows.append("| **predicted** | " + " | ".join(f"**{sum(p.values()):.1f}**" for p in columns.values()) + " |")
    rows.append("| graph nodes a step | " + " | ".join(
        str(step_launches(MMJIT_B16, 512, trunk)) for trunk, _ in sampler_trunks(new).values()) + " |")
    rows.append(f"| measured | {H200_MEASURED['sampler_ms']:.1f} |" + " |" * (len(columns) - 1))
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
        rows.append(f"| `{name}` | {value:.3g} | {worse:.3g} | {ms:.1f} | {ms - base:+.1f} |")
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
        "The fused memory-bound kernels on the H200, round trip by round trip": memory_model_table(),
        "The forward's GEMMs on the H200, tile by tile": gemm_shape_table(),
    }


def kernel_tables(new: AttentionKernel) -> dict[str, list[str]]:
    """The tables of docs/performance-model.md that need the attention kernel's machine code."""
    return {"Attention at [2, 12, 1280, 64] bf16 on the H200, pipe by pipe": attention_model_table(new),
            "The 10-step sampler on the H200, built from its parts": sampler_parts_table(new),
            "Images a second by group size on the H200, and GenEval's set": group_table(new),
            "What the base model's 1.5x takes": target_table(new)}


def main() -> int:
    for heading, rows in (tables() | kernel_tables(mma_attention_kernel(b16_attention_trip()))).items():
        print(f"### {heading}\n")
        print("\n".join(rows) + "\n")
    return 0



# ---------------------------------------------------------------------------------------------
# Batch runs: a group of N images a forward (`minit2i batch --batch-size N`), on the H200

GENEVAL_SEEDS = 4  # GenEval's images a prompt, consecutive jobs of a run
GENEVAL_IMAGES = 553 * GENEVAL_SEEDS
# The floor of a set: its FLOPs at the dense bf16 rate that large GEMMs reach, 80 % of the peak.
FLOOR_EFFICIENCY = LARGE_GEMM_EFFICIENCY
# The targets on paper: the base model's set within 1.5x its floor, the student's within 3x.
SET_TARGETS = {"B/16": 1.5, "B/16-MF": 3.0}
GROUP_SIZES = (1, 2, 4, 8, 16)


def t5_group_ms(config: MMJiTConfig, images: int, per_group: bool, images_per_prompt: int = 1,
                device: Device = H200, a: Assumptions = Assumptions()) -> float:
    """T5 (fp32, eager) for a group of `images` images: one encoding of the group's distinct
    prompts when `per_group` (`images_per_prompt` images share a prompt: GenEval's 4 seeds),
    else one encoding an image (the batch path before it encoded distinct prompts once)."""
    if per_group:
        prompts = -(-images // images_per_prompt)
        return step_ms(t5_components(T5_FLAN_LARGE, config.prompt_length, prompts), device, 4, a, a.cupy_launch_us,
                       replayed=False, extra_launches=0)
    return images * t5_ms(T5_FLAN_LARGE, config.prompt_length, device, a)


def group_ms(config: MMJiTConfig, size: int, steps: int, images: int, trunk: Trunk, t5: str | None = "group",
             images_per_prompt: int = 1, chip: Chip = H200_CHIP, device: Device = H200,
             a: Assumptions = Assumptions()) -> float:
    """One group of `images` images (rows: images x `forward_batch`) drawn by a runner that kept
    its graph from the run's earlier groups (every step replayed: `sampler_call_ms`, not a first
    call), after T5: once for the group's distinct prompts (`t5` "group"), once an image
    ("image"), or not at all (None)."""
    encoding = 0.0 if t5 is None else t5_group_ms(config, images, t5 == "group", images_per_prompt, device, a)
    return encoding + sampler_call_ms(config, size, steps, trunk, False, images, chip, device, a)


def set_seconds(config: MMJiTConfig, size: int, steps: int, images: int, count: int, trunk: Trunk,
                t5: str | None = "group", images_per_prompt: int = 1, chip: Chip = H200_CHIP, device: Device = H200,
                a: Assumptions = Assumptions()) -> float:
    """`count` images in groups of `images` (the last one what is left)."""
    whole, rest = divmod(count, images)

    def group(n):
        return group_ms(config, size, steps, n, trunk, t5, images_per_prompt, chip, device, a)

    return (whole * group(images) + (group(rest) if rest else 0.0)) / 1e3


def floor_seconds(config: MMJiTConfig, size: int, steps: int, count: int, device: Device) -> float:
    """`count` images' FLOPs (every forward, T5 left out) at FLOOR_EFFICIENCY of the bf16 peak."""
    flops = steps * sum(c.flops for c in forward_components(config, size, 2, forward_batch(config), whole=True))
    return count * flops / (FLOOR_EFFICIENCY * device.tensor_tflops * 1e12)


def group_table(attention: AttentionKernel, size: int = 512, chip: Chip = H200_CHIP,
                device: Device = H200) -> list[str]:
    """Images per second of the twin (bf16, folded trunk, stream fork, graph kept) by group size,
    and GenEval's set time, with T5 once an image and once a group for its distinct prompts."""
    trunk = Trunk(attention)
    rows = ["| model | steps | N | T5 | images/s | GenEval set (2,212 images) | floor | set / floor | target |",
            "|---|---|---|---|---|---|---|---|---|"]
    for label, (config, steps) in MODELS.items():
        floor = floor_seconds(config, size, steps, GENEVAL_IMAGES, device)
        for images in GROUP_SIZES:
            for t5, words in (("image", "once an image"), ("group", "its distinct prompts once a group")):
                seconds = set_seconds(config, size, steps, images, GENEVAL_IMAGES, trunk, t5, GENEVAL_SEEDS, chip,
                                      device)
                rate = images / (group_ms(config, size, steps, images, trunk, t5, GENEVAL_SEEDS, chip, device) / 1e3)
                rows.append(f"| {label} | {steps} | {images} | {words} | {rate:.1f} | {seconds / 60:.2f} min | "
                            f"{floor / 60:.2f} min | {seconds / floor:.2f} | {SET_TARGETS[label]:.1f}x |")
    return rows


# FlashAttention-3's forward at head dim 64 on an H100 SXM, FP16, non-causal (arXiv 2407.08608,
# its figure for head dim 64, 16k tokens a batch): 392 TFLOP/s at 1k tokens, 460 at 2k, the
# fastest kernel published at this head dim (wgmma, TMA, the softmax overlapped with the MMAs).
# The H200 has the H100's SMs and clocks; B/16's 1,280 tokens are taken at the 2k rate, the
# generous end, so that what misses the target with it misses it with the kernel as published.
FA3_DH64_TFLOPS = 460.0


def base_set_over_floor(trunk: Trunk, images: int = 16, size: int = 512) -> float:
    """The base model's GenEval set over its floor in groups of `images`, T5 once a group."""
    config, steps = MODELS["B/16"]
    seconds = set_seconds(config, size, steps, images, GENEVAL_IMAGES, trunk, "group", GENEVAL_SEEDS)
    return seconds / floor_seconds(config, size, steps, GENEVAL_IMAGES, H200)


def attention_tflops_for(trunk: Trunk, ratio: float, images: int = 16) -> float:
    """The joint attention's rate (TFLOP/s) at which the base set comes to `ratio` x its floor
    (bisection: the set time falls as the rate rises); the tensor peak if even that misses it."""
    low, high = 1.0, H200.tensor_tflops
    if base_set_over_floor(replace(trunk, joint_attention_tflops=high), images) > ratio:
        return high
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if base_set_over_floor(replace(trunk, joint_attention_tflops=middle), images) > ratio \
            else (low, middle)
    return high


def target_table(attention: AttentionKernel, images: int = 16) -> list[str]:
    """What the base model's GenEval set needs to come within SET_TARGETS["B/16"] of its floor at
    N = `images` (T5 once a group): the kernel now, FlashAttention-3's published rate, the SwiGLU
    in the GEMM's epilogue, and the attention rate that would reach the target with each."""
    target, now = SET_TARGETS["B/16"], Trunk(attention)
    shape = (images * forward_batch(MMJIT_B16), MMJIT_B16.num_heads,
             text_tokens(MMJIT_B16) + (512 // MMJIT_B16.patch_size) ** 2, MMJIT_B16.head_dim)
    now_tflops = attention_us_at(1.0, *shape) / attention_kernel_us(attention, *shape[:3])
    fa3 = replace(now, joint_attention_tflops=FA3_DH64_TFLOPS)
    cases = [("attention_tc.cu now (its pipe model)", "its own kernel", now, now_tflops),
             ("FlashAttention-3's published rate at Dh 64", "its own kernel", fa3, FA3_DH64_TFLOPS),
             ("FlashAttention-3's published rate at Dh 64", "in the W1 / W3 GEMM", replace(fa3, swiglu_in_gemm=True),
              FA3_DH64_TFLOPS)]
    for swiglu, trunk in (("its own kernel", now), ("in the W1 / W3 GEMM", replace(now, swiglu_in_gemm=True))):
        rate = attention_tflops_for(trunk, target, images)
        cases.append((f"the rate that reaches {target}x", swiglu, replace(trunk, joint_attention_tflops=rate), rate))
    rows = [f"| joint attention | SwiGLU | µs a joint attention (N = {images}) | TFLOP/s | share of the bf16 peak | "
            "GenEval set | set / floor |", "|---|---|---|---|---|---|---|"]
    floor = floor_seconds(MMJIT_B16, 512, MODELS["B/16"][1], GENEVAL_IMAGES, H200)
    for label, swiglu, trunk, tflops in cases:
        ratio = base_set_over_floor(trunk, images)
        rows.append(f"| {label} | {swiglu} | {attention_us_at(tflops, *shape):.0f} | {tflops:.0f} | "
                    f"{tflops / H200.tensor_tflops:.0%} | {ratio * floor / 60:.2f} min | {ratio:.2f} |")
    return rows


if __name__ == "__main__":
    sys.exit(main())
