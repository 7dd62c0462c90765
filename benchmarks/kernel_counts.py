"""cudasim's profiler counts of the tensor-core attention at B/16's per-tile behaviour, per request.

    python benchmarks/kernel_counts.py            # the counts and their ratios per request

One launch of attention_tc.cu's bf16 kernel on cudasim at [1, 2, 128, 64] (whole 128-row blocks
and 64-key tiles, no bias or mask: what each tile of B/16's [2, 12, 1280, 64] does), counted
under the names of the Nsight Compute metrics they stand for (docs/kernels.md, "Counting what
the profiler counts"). The ratios per request do not depend on the shape, so a GPU run's ncu
counts at B/16's shape compare with them one to one (scripts/gpu-check's profile part).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from minit2i.accelerated.kernels import (  # noqa: E402
    MMA_WARPS,
    NVRTC_OPTIONS,
    attention_shared_bytes,
    kernel_source,
    mma_rows,
)
from minit2i.cudasim import LaunchCounts, Module, counting, device_array  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
B16_TILE_SHAPE = (1, 2, 128, 64)  # batch, heads, length, head dim
# (label, numerator, denominator): what a request of each kind costs, cudasim beside ncu
PER_REQUEST = (
    ("ldmatrix wavefronts per request", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
     "smsp__inst_executed_op_ldsm.sum"),
    ("ldmatrix excess wavefronts per request", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum",
     "smsp__inst_executed_op_ldsm.sum"),
    ("cp.async global sectors per request", "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
     "smsp__inst_executed_op_ldgsts.sum"),
)


def attention_counts(text: str | None = None, seed: int = 16) -> tuple[LaunchCounts, dict[str, np.ndarray]]:
    """One counted launch of `text` (attention_tc.cu as compiled, by default)'s
    flash_attention_tc_bf16 at B16_TILE_SHAPE on random inputs in 256-byte aligned buffers (as
    cudaMalloc returns: sector counts depend on it): its counts and {q, k, v, out}."""
    batch, heads, length, head_dim = B16_TILE_SHAPE
    rng = np.random.default_rng(seed)
    q, k, v = (device_array(rng.standard_normal(B16_TILE_SHAPE).astype(BF16)) for _ in range(3))
    out, unused = device_array(np.zeros((batch, length, heads * head_dim), BF16)), device_array(np.zeros(1, np.float32))
    module = Module(text or kernel_source("attention_tc.cu"), NVRTC_OPTIONS, name="attention_tc.cu")
    with counting() as launches:
        module.get_function("flash_attention_tc_bf16")(
            (length // mma_rows(head_dim), batch * heads), (MMA_WARPS * 32,),
            (q, k, v, unused, unused, out, *map(np.int32, (heads, length, length, head_dim)),
             np.float32(head_dim**-0.5), np.int32(0), np.int32(0)),
            shared_mem=attention_shared_bytes(head_dim, BF16))
    return launches[0], {"q": q, "k": k, "v": v, "out": out}


def per_request(counts: dict[str, float]) -> dict[str, float]:
    """{label: numerator / denominator} of PER_REQUEST (from cudasim's counts or ncu's metrics)."""
    return {label: counts[top] / counts[bottom] for label, top, bottom in PER_REQUEST if counts.get(bottom)}


def main() -> int:
    counts = attention_counts()[0].counts
    for name, value in counts.items():
        print(f"{name:70s} {value:>10,}")
    for label, ratio in per_request(counts).items():
        print(f"{label:70s} {ratio:>10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
