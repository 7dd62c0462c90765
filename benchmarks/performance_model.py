"""Performance model on paper: FLOPs, bytes and roofline times of one MiniT2I forward, per kernel.

    python benchmarks/performance_model.py            # the tables of docs/performance-model.md

Counted from the code of `accelerated/` (CuPy twin) and `training/torch_model.py` (PyTorch eager
with SDPA) for one batched [cond ; uncond] forward. A component is one kind of launch: its count
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

from minit2i.core.mmjit_config import MMJIT_B16, MMJIT_L16, MMJiTConfig  # noqa: E402


@dataclass(frozen=True)
class Device:
    name: str
    tensor_tflops: float  # dense fp16 / bf16 tensor-core peak
    fp32_tflops: float  # fp32 FMA on CUDA cores (no TF32: parity mode)
    bandwidth_tbs: float  # DRAM


H100 = Device("H100 SXM", 989.0, 67.0, 3.35)
A100 = Device("A100 SXM", 312.0, 19.5, 2.0)


@dataclass(frozen=True)
class Assumptions:
    """Achieved fractions of the roofline and per-launch costs (to be checked on a GPU)."""

    gemm: float = 0.70  # cuBLAS on these mid-size shapes (M = 512..2048, K, N = 768..4096)
    gemm_fp32: float = 0.80  # SGEMM without TF32 is compute-bound and well tuned
    attention_tc: float = 0.30  # our WMMA kernel: no async copies, O round trip through shared memory
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


def forward_components(config: MMJiTConfig, size: int, item: int, batch: int = 2) -> list[Component]:
    """The CuPy twin's launches in one forward of `batch` images (item: bytes per element)."""
    d, hidden, heads, head_dim = config.hidden_size, config.mlp_hidden, config.num_heads, config.head_dim
    n_img, n_txt = batch * (size // config.patch_size) ** 2, batch * config.prompt_length
    joint = config.prompt_length + (size // config.patch_size) ** 2
    pre, dbl = config.txt_preamble_depth, config.depth_double
    padded = -(-head_dim // 16) * 16 if item == 2 else head_dim  # tensor cores work on whole 16-wide tiles
    streams = ((n_txt, pre + dbl), (n_img, dbl))  # (rows, blocks) per stream

    def gemm(name, rows, k, n, count):
        return Component(name, "gemm", count, 2.0 * rows * k * n * count, item * (rows * k + k * n + rows * n) * count)

    def memory(name, elements, count):  # elements read + written by all `count` launches together
        return Component(name, "memory", count, 0.0, item * elements)

    def attention(length, count):
        flops = 4.0 * batch * heads * length * length * padded * count
        return Component(f"attention L={length}", "attention", count, flops, 4.0 * item * batch * heads * length * head_dim * count)

    rows_all = sum(rows * blocks for rows, blocks in streams)
    return [
        gemm("GEMM patch proj1", n_img, config.patch_dim, config.pca_channels, 1),
        gemm("GEMM patch proj2", n_img, config.pca_channels, d, 1),
        gemm("GEMM text embedder", n_txt, config.txt_input_size, d, 1),
        *(gemm(f"GEMM qkv ({label})", rows, d, 3 * d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM attn proj ({label})", rows, d, d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM w1|w3 ({label})", rows, d, 2 * hidden, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        *(gemm(f"GEMM w2 ({label})", rows, hidden, d, blocks) for label, (rows, blocks) in zip(("txt", "img"), streams)),
        gemm("GEMM final", n_img, d, config.patch_dim, 1),
        attention(config.prompt_length, pre),
        attention(joint, dbl),
        memory("rms_norm", 2 * d * (rows_all + n_img), pre + 2 * dbl + 1),  # norm1 per stream + final norm
        memory("add_rms_norm", 4 * d * rows_all, pre + 2 * dbl),
        memory("qkv_heads", 6 * d * rows_all, pre + 2 * dbl),
        memory("swiglu", 3 * hidden * rows_all, pre + 2 * dbl),
        memory("residual add (CuPy)", 3 * d * rows_all, pre + 2 * dbl),
        memory("attention output slices (CuPy copy)", 2 * d * (n_txt + n_img) * dbl, 2 * dbl),
        # patchify and unpatchify copies, proj2 and final bias adds, sin/cos add, mask compare + where
        memory("embed/final elementwise (CuPy)", 6 * n_img * config.patch_dim + 5 * n_img * d
               + 2 * n_txt * config.txt_input_size, 7),
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


def step_ms(components, device: Device, item: int, a: Assumptions, launch_us: float, replayed: bool) -> float:
    """One sampler step (forward + cfg_euler and the factor fill): GPU time with the gaps between
    kernels; eagerly, the longer of that and the host time (the host queues launches ahead)."""
    launches = sum(c.launches for c in components) + 2
    gpu = sum(gpu_ms(c, device, item, a) for c in components) + launches * a.graph_gap_us / 1e3
    return gpu if replayed else max(gpu, launches * launch_us / 1e3)


def cupy_run_ms(config, size, steps, device, item, a: Assumptions, graph: bool = True) -> float:
    """accelerated.sampler.sample: step 0 eager, step 1 captured (recorded at host speed, then
    launched), steps 2.. replayed; without graphs every step is eager."""
    components = forward_components(config, size, item)
    eager = step_ms(components, device, item, a, a.cupy_launch_us, replayed=False)
    if not graph or steps < 2:
        return steps * eager
    replay = step_ms(components, device, item, a, a.cupy_launch_us, replayed=True)
    capture_host = (sum(c.launches for c in components) + 2) * a.cupy_launch_us / 1e3
    return eager + capture_host + (steps - 1) * replay


def torch_run_ms(config, size, steps, device, item, a: Assumptions) -> float:
    components = torch_components(config, size, item)
    return steps * step_ms(components, device, item, a, a.torch_launch_us, replayed=False)


# ---------------------------------------------------------------------------------------------
# Markdown tables


def component_table(config: MMJiTConfig, size: int, item: int, a: Assumptions = Assumptions()) -> list[str]:
    rows = ["| component | launches | GFLOP | MB | H100 roofline µs | H100 predicted µs | A100 roofline µs | A100 predicted µs |",
            "|---|---|---|---|---|---|---|---|"]
    for c in forward_components(config, size, item):
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


def tables() -> dict[str, list[str]]:
    """Every generated table of docs/performance-model.md, by heading."""
    return {
        "B/16, 512x512, bf16: one CFG forward (batch 2)": component_table(MMJIT_B16, 512, 2),
        "B/16, 512x512, fp32: one CFG forward (batch 2)": component_table(MMJIT_B16, 512, 4),
        "L/16, 512x512, bf16: one CFG forward (batch 2)": component_table(MMJIT_L16, 512, 2),
        "10 steps, 512x512, predicted": summary_table(),
        "Sensitivity of the B/16 bf16 H100 prediction": sensitivity_table(),
    }


def main() -> int:
    for heading, rows in tables().items():
        print(f"### {heading}\n")
        print("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
