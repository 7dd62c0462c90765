"""CPU benchmark: the NumPy reference against the same math in PyTorch, on this machine.

    python benchmarks/cpu.py                 # MMJiT B/16 at 512x512 (batch 2) + T5-large (L=256)
                                             # + one B/16-MF image end to end (T5 + 4 student forwards)
    python benchmarks/cpu.py --quick         # 256x256, 2 double blocks, 2 T5 layers: a smoke run
    python benchmarks/cpu.py --repeats 3 --size 256

Weights are seeded random tensors in the real layout (`minit2i.demo_models`); timing does not
depend on their values. The PyTorch peers (training/torch_model.py, shared with the demo model's training) are
written from the spec, like the reference, and run the very same arrays (shared, no copy); their
outputs are compared with NumPy's so the timings compare equal work. FLOPs are counted analytically, 2*M*N*K for every matmul
(attention included); elementwise work is not counted. The roofline is the best float32 GEMM
rate of either library on a 2048^3 product.

This file lives outside tests/ on purpose: pytest never collects it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from minit2i.core.mean_flow_config import MEAN_FLOW_B16, MEAN_FLOW_RECIPE, MeanFlowConfig
from minit2i.core.mmjit_config import MMJIT_B16, MMJiTConfig
from minit2i.core.t5_config import T5_FLAN_LARGE, T5Config
from minit2i.core.threads import THREAD_VARIABLES, available_cores, blas_threads, block_product_flops, threads_for
from minit2i.core.weights import nest
from minit2i.api import MiniT2IPipeline
from minit2i.demo_models import random_mmjit_weights, random_t5_weights
from minit2i.pipeline import make_request, run_threads
from minit2i.reference.layers import attention
from minit2i.reference.mean_flow import mean_flow_forward
from minit2i.reference.mean_flow_sampler import sample_mean_flow
from minit2i.reference.mmjit import mmjit_forward
from minit2i.reference.sampler import initial_noise
from minit2i.reference.t5 import t5_encode
from minit2i.training import torch_model as torch_peer

try:  # run as a script: benchmarks/ is on sys.path
    from load import busy_processes, load_average
except ImportError:  # imported as benchmarks.cpu
    from benchmarks.load import busy_processes, load_average

BATCH = 2  # one conditional + one unconditional row, as classifier-free guidance runs them
TEXT_LENGTH = 256
ROOFLINE_SIZE = 2048
SEED = 0
DEMO_PROMPT = "a large red circle at the left on a gray background"  # the README's first command


# ---------------------------------------------------------------------------------------------
# Analytic FLOP counts (multiply-adds x 2, matmuls only)


def mmjit_flops(config: MMJiTConfig, batch: int, image_size: int, length: int) -> int:
    """Matmul FLOPs of one MMJiT forward on [batch, C, image_size, image_size] and `length` tokens."""
    d, hid = config.hidden_size, config.mlp_hidden
    tokens = (image_size // config.patch_size) ** 2
    per_token = 2 * (3 * d * d + d * d + 3 * d * hid)  # qkv, attn_proj, SwiGLU w1/w3/w2

    def attention_flops(n):  # q k^T and p v over n keys, all heads
        return 2 * 2 * n * n * d

    embed = 2 * tokens * (config.patch_dim * config.pca_channels + config.pca_channels * d)
    embed += 2 * length * config.txt_input_size * d
    preamble = config.txt_preamble_depth * (length * per_token + attention_flops(length))
    double = config.depth_double * ((tokens + length) * per_token + attention_flops(tokens + length))
    final = 2 * tokens * d * config.patch_dim
    return batch * (embed + preamble + double + final)


def t5_flops(config: T5Config, batch: int, length: int) -> int:
    """Matmul FLOPs of one T5 encoder pass over [batch, length] tokens."""
    d, inner, ff = config.d_model, config.inner_dim, config.d_ff
    per_token = 2 * (4 * d * inner + 3 * d * ff)  # q, k, v, o; wi_0, wi_1, wo
    attention_flops = 2 * 2 * length * length * inner
    return batch * config.num_layers * (length * per_token + attention_flops)


# ---------------------------------------------------------------------------------------------
# Measuring


def best_times(runs: dict, repeats: int) -> tuple[dict[str, float], dict]:
    """Fastest wall time (s) of each named call, and its last result.

    The calls take turns, one of each per repeat, so that a burst of load from elsewhere on a
    shared machine slows both sides of the comparison rather than one.
    """
    seconds = {name: float("inf") for name in runs}
    results = {}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            seconds[name] = min(seconds[name], time.perf_counter() - start)
    return seconds, results


def in_inference_mode(run):
    """`run` wrapped so that torch records no autograd state, like a deployed forward."""
    def wrapped():
        with torch.inference_mode():
            return run()
    return wrapped


def matmul_roofline(repeats: int = 20) -> dict[str, float]:
    """Best float32 GEMM GFLOP/s of numpy and torch on a ROOFLINE_SIZE^3 product.

    The best of many calls, since a busy neighbour on a shared host can halve any one of them.
    """
    n = ROOFLINE_SIZE
    a = np.random.default_rng(SEED).standard_normal((n, n), dtype=np.float32)
    ta = torch.from_numpy(a)
    seconds, _ = best_times({"numpy": lambda: a @ a, "torch": lambda: ta @ ta}, repeats)
    return {name: 2 * n**3 / s / 1e9 for name, s in seconds.items()}


def max_rel_error(reference: np.ndarray, other: torch.Tensor) -> float:
    """max |a - b| / max |a|: one number that is small only if the two outputs agree everywhere."""
    return float(np.abs(reference - other.numpy()).max() / np.abs(reference).max())


def comparison(name: str, run_numpy, run_torch, flops: int, repeats: int) -> dict:
    """One table row: both calls timed in turns, their outputs compared."""
    seconds, results = best_times({"numpy": run_numpy, "torch": in_inference_mode(run_torch)}, repeats)
    return {"name": name, "numpy_s": seconds["numpy"], "torch_s": seconds["torch"], "flops": flops,
            "rel_err": max_rel_error(results["numpy"], results["torch"])}


def bench_mmjit(config: MMJiTConfig, size: int, repeats: int) -> dict:
    params = nest(random_mmjit_weights(config, SEED))
    rng = np.random.default_rng(SEED + 1)
    images = rng.standard_normal((BATCH, config.in_channels, size, size), dtype=np.float32)
    context = rng.standard_normal((BATCH, TEXT_LENGTH, config.txt_input_size), dtype=np.float32)
    mask = np.zeros((BATCH, TEXT_LENGTH), dtype=np.float32)
    mask[0, :TEXT_LENGTH // 3] = 1.0  # a short prompt; the unconditional row is all padding
    mask[1, :1] = 1.0
    tparams = torch_peer.to_torch_tree(params)
    args = [torch.from_numpy(a) for a in (images, context, mask)]
    return comparison(f"MMJiT {size}x{size} b{BATCH} L{TEXT_LENGTH} ({config.depth_double} double blocks)",
                      lambda: mmjit_forward(params, config, images, context, mask),
                      lambda: torch_peer.mmjit_forward(tparams, config, *args),
                      mmjit_flops(config, BATCH, size, TEXT_LENGTH), repeats)


def bench_joint_attention(config: MMJiTConfig, size: int, repeats: int) -> dict:
    """The joint attention of one double block alone: reference `attention` against torch SDPA."""
    tokens = TEXT_LENGTH + (size // config.patch_size) ** 2
    rng = np.random.default_rng(SEED + 3)
    q, k, v = (rng.standard_normal((BATCH, config.num_heads, tokens, config.head_dim), dtype=np.float32)
               for _ in range(3))
    tq, tk, tv = map(torch.from_numpy, (q, k, v))
    return comparison(f"  of which: joint attention, 1 block ({tokens} tok)",
                      lambda: attention(q, k, v, config.head_dim**-0.5),
                      lambda: F.scaled_dot_product_attention(tq, tk, tv),
                      BATCH * 4 * tokens**2 * config.hidden_size, repeats)


def mean_flow_image_case(student: MeanFlowConfig, t5: T5Config, size: int):
    """(run_numpy, run_torch, FLOPs) of one Mean Flow image end to end: T5 on the prompt, then the
    student's sampler (4 forwards of batch 1 over A + L text tokens). Both sides run the
    reference's sampler loop (`sample_mean_flow`); only the networks differ."""
    params, t5_params = nest(random_mmjit_weights(student, SEED)), nest(random_t5_weights(t5, SEED))
    rng = np.random.default_rng(SEED + 4)
    ids = rng.integers(0, t5.vocab_size, (1, TEXT_LENGTH))
    mask = np.zeros((1, TEXT_LENGTH), dtype=np.float32)
    mask[0, :TEXT_LENGTH // 3] = 1.0
    noise = initial_noise(SEED, 1, student.in_channels, size, size)
    steps, omega, interval = (MEAN_FLOW_RECIPE[k] for k in ("steps", "cfg_scale", "guidance_interval"))
    prefix = student.num_aux_tokens
    tparams, tt5 = torch_peer.to_torch_tree(params), torch_peer.to_torch_tree(t5_params)

    def run_numpy():
        context = t5_encode(t5_params, t5, ids, mask)
        return sample_mean_flow(lambda x, *rest: mean_flow_forward(params, student, x, *rest), noise, context,
                                mask, steps, omega, interval)

    def torch_denoise(x, h, om, t_min, t_max, context, msk):
        scalars = [torch.from_numpy(v.astype(np.float32)) for v in (h, om, t_min, t_max)]
        return torch_peer.mean_flow_forward(tparams, student, torch.from_numpy(x), *scalars, context,
                                            torch.from_numpy(msk)).numpy()

    def run_torch():
        context = torch_peer.t5_encode(tt5, t5, torch.from_numpy(ids), torch.from_numpy(mask))
        return torch.from_numpy(sample_mean_flow(torch_denoise, noise, context, mask, steps, omega, interval))

    flops = t5_flops(t5, 1, TEXT_LENGTH) + steps * mmjit_flops(student, 1, size, prefix + TEXT_LENGTH)
    return run_numpy, run_torch, flops


def bench_mean_flow_image(student: MeanFlowConfig, t5: T5Config, size: int, repeats: int) -> dict:
    """One Mean Flow image, NumPy against PyTorch (`mean_flow_image_case`)."""
    run_numpy, run_torch, flops = mean_flow_image_case(student, t5, size)
    steps = MEAN_FLOW_RECIPE["steps"]
    return comparison(f"MF image {size}x{size}: T5 + {steps} x student b1", run_numpy, run_torch, flops, repeats)


def bench_t5(config: T5Config, repeats: int) -> dict:
    params = nest(random_t5_weights(config, SEED))
    ids = np.random.default_rng(SEED + 2).integers(0, config.vocab_size, (1, TEXT_LENGTH))
    mask = np.zeros((1, TEXT_LENGTH), dtype=np.float32)
    mask[0, :TEXT_LENGTH // 3] = 1.0
    tparams, tids, tmask = torch_peer.to_torch_tree(params), torch.from_numpy(ids), torch.from_numpy(mask)
    return comparison(f"T5 encoder b1 L{TEXT_LENGTH} ({config.num_layers} layers)",
                      lambda: t5_encode(params, config, ids, mask),
                      lambda: torch_peer.t5_encode(tparams, config, tids, tmask),
                      t5_flops(config, 1, TEXT_LENGTH), repeats)


# ---------------------------------------------------------------------------------------------
# BLAS threads: the count the project chooses against one thread and every core


def demo_image_case():
    """(run(threads), chosen count): the demo model's default image (the README's first command)
    through the Python API, in process; `threads` None lets the pipeline choose."""
    pipe = MiniT2IPipeline.from_pretrained("demo")
    pipe.set_progress_bar_config(disable=True)

    def run(threads):
        pipe.threads = threads
        return pipe(DEMO_PROMPT, generator=1, output_type="np").images

    return run, run_threads(make_request(pipe.files, DEMO_PROMPT, {}), pipe.files)


def mean_flow_threads_case(student: MeanFlowConfig, t5: T5Config, size: int):
    """(run(threads), chosen count): the B/16-MF image of `mean_flow_image_case` in NumPy."""
    run_numpy, _, _ = mean_flow_image_case(student, t5, size)
    tokens = (size // student.patch_size) ** 2 + student.num_aux_tokens + TEXT_LENGTH

    def run(threads):
        with blas_threads(threads):
            return run_numpy()

    return run, threads_for(block_product_flops(student, 1, tokens))


def mmjit_threads_case(config: MMJiTConfig, size: int):
    """(run(threads), chosen count): one guided B/16 forward (batch 2) at `size`."""
    params = nest(random_mmjit_weights(config, SEED))
    rng = np.random.default_rng(SEED + 1)
    images = rng.standard_normal((BATCH, config.in_channels, size, size), dtype=np.float32)
    context = rng.standard_normal((BATCH, TEXT_LENGTH, config.txt_input_size), dtype=np.float32)
    mask = np.ones((BATCH, TEXT_LENGTH), dtype=np.float32)
    tokens = (size // config.patch_size) ** 2 + TEXT_LENGTH

    def run(threads):
        with blas_threads(threads):
            return mmjit_forward(params, config, images, context, mask)

    return run, threads_for(block_product_flops(config, BATCH, tokens))


def thread_rows(cases: list[tuple[str, object, int]], repeats: int) -> list[dict]:
    """Each case at its chosen count, one thread and every core, the three taking turns."""
    cores = available_cores()
    rows = []
    for name, run, chosen in cases:
        seconds, _ = best_times({"chosen_s": lambda: run(chosen), "one_s": lambda: run(1),
                                 "all_s": lambda: run(cores)}, repeats)
        rows.append({"name": name, "threads": chosen, **seconds})
    return rows


def generate_command_times(repeats: int) -> dict:
    """`minit2i generate` on the demo model as a user types it, with no *_NUM_THREADS variable
    and with OPENBLAS_NUM_THREADS=1, in turns: the fastest and the median wall time of each, and
    whether their PNGs are the same bytes."""
    command = [str(Path(sys.executable).with_name("minit2i")), "generate", "-q", "-p", DEMO_PROMPT, "-s", "1"]
    plain = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    sides = {"default": plain, "OPENBLAS_NUM_THREADS=1": {**plain, "OPENBLAS_NUM_THREADS": "1"}}
    seconds = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(repeats):
            for name, env in sides.items():
                start = time.perf_counter()
                subprocess.run([*command, "-o", os.path.join(folder, f"{name}.png")], env=env, check=True,
                               capture_output=True)
                seconds[name].append(time.perf_counter() - start)
        pngs = {Path(folder, f"{name}.png").read_bytes() for name in sides}
    return {"seconds": seconds, "same_png": len(pngs) == 1}


def print_thread_table(title: str, rows: list[dict], command: dict) -> None:
    cores = available_cores()
    print(f"\n{title} (load {load_average()})")
    header = f"{'case':<40} {'chosen':>6} {'chosen s':>9} {'1 thr s':>8} {f'{cores} thr s':>8} " \
             f"{'ch / 1':>7} {'ch / all':>8}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['name']:<40} {r['threads']:6d} {r['chosen_s']:9.3f} {r['one_s']:8.3f} {r['all_s']:8.3f} "
              f"{r['chosen_s'] / r['one_s']:7.2f} {r['chosen_s'] / r['all_s']:8.2f}")
    best = {name: min(times) for name, times in command["seconds"].items()}
    median = {name: statistics.median(times) for name, times in command["seconds"].items()}
    print(f"minit2i generate (demo), fastest / median of {len(command['seconds']['default'])}: "
          f"no variable {best['default']:.2f} / {median['default']:.2f} s, OPENBLAS_NUM_THREADS=1 "
          f"{best['OPENBLAS_NUM_THREADS=1']:.2f} / {median['OPENBLAS_NUM_THREADS=1']:.2f} s, ratio "
          f"{median['default'] / median['OPENBLAS_NUM_THREADS=1']:.2f} (medians); "
          f"same PNG bytes: {'yes' if command['same_png'] else 'NO'}")


def bench_threads(student: MeanFlowConfig, mmjit: MMJiTConfig, t5: T5Config, size: int, repeats: int,
                  loads=("quiet", "busy")) -> None:
    """The thread table on a quiet machine, then under two busy processes this function starts."""
    demo, demo_chosen = demo_image_case()
    cases = [("demo image 64x64, 20 steps (API)", demo, demo_chosen),
             (f"B/16-MF image {size}x{size} (T5 + 4 steps)", *mean_flow_threads_case(student, t5, size)),
             (f"B/16 MMJiT forward {size}x{size} b{BATCH}", *mmjit_threads_case(mmjit, size))]
    settings = {"quiet": ("BLAS threads, quiet", contextlib.nullcontext),
                "busy": ("BLAS threads, two busy processes", lambda: busy_processes(2))}
    for title, load in (settings[name] for name in loads):
        with load():
            rows = thread_rows(cases, repeats)
            command = generate_command_times(max(3, repeats))
        print_thread_table(title, rows, command)


# ---------------------------------------------------------------------------------------------
# Reporting


def thread_report() -> str:
    """Thread counts of both libraries (NumPy's BLAS pool as threadpoolctl reads it) and any
    *_NUM_THREADS variable set."""
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info())
    variables = ", ".join(f"{k}={os.environ[k]}" for k in THREAD_VARIABLES if k in os.environ) or "none"
    return f"cores {available_cores()}; torch threads {torch.get_num_threads()}; numpy BLAS: {blas} " \
           f"(at start; each row sets its own); *_NUM_THREADS set: {variables}"


def print_table(rows: list[dict], roofline: float) -> None:
    """One row per component; `roofline` is the machine's best float32 GEMM rate in GFLOP/s."""
    header = (f"{'component':<48} {'numpy s':>8} {'torch s':>8} {'np/torch':>8} {'GFLOP':>8} "
              f"{'np GF/s':>8} {'th GF/s':>8} {'np %roof':>8} {'th %roof':>8} {'rel err':>8}")
    print(header)
    print("-" * len(header))
    for r in rows:
        gflop = r["flops"] / 1e9
        np_rate, th_rate = gflop / r["numpy_s"], gflop / r["torch_s"]
        print(f"{r['name']:<48} {r['numpy_s']:8.3f} {r['torch_s']:8.3f} {r['numpy_s'] / r['torch_s']:8.2f} "
              f"{gflop:8.1f} {np_rate:8.1f} {th_rate:8.1f} {100 * np_rate / roofline:7.0f}% "
              f"{100 * th_rate / roofline:7.0f}% {r['rel_err']:8.1e}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("all", "torch", "threads"), default="all",
                        help="torch: NumPy against PyTorch; threads: the chosen BLAS threads against one and all")
    parser.add_argument("--loads", nargs="+", choices=("quiet", "busy"), default=["quiet", "busy"],
                        help="threads: on the machine as it is, and/or under two busy processes this script starts")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per forward; the fastest counts")
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (multiple of 16)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 256x256, 2 double blocks, 2 T5 layers, one repeat")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    mmjit, student, t5, size, repeats = MMJIT_B16, MEAN_FLOW_B16, T5_FLAN_LARGE, args.size, args.repeats
    if args.quick:
        mmjit = dataclasses.replace(MMJIT_B16, depth_double=2)
        student = dataclasses.replace(MEAN_FLOW_B16, depth_double=2)
        t5 = dataclasses.replace(T5_FLAN_LARGE, num_layers=2)
        size, repeats = 256, 1
    print(thread_report())
    print(f"numpy {np.__version__}, torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load {load_average()}")
    if args.part in ("all", "torch"):
        bench_torch(mmjit, student, t5, size, repeats)
    if args.part in ("all", "threads"):
        bench_threads(student, mmjit, t5, size, repeats, args.loads)


def bench_torch(mmjit: MMJiTConfig, student: MeanFlowConfig, t5: T5Config, size: int, repeats: int) -> None:
    """The NumPy reference against PyTorch: the roofline, then one row per component."""
    gemm = matmul_roofline()
    roofline = max(gemm.values())  # what this machine can do; both columns are measured against it
    print(f"float32 GEMM ({ROOFLINE_SIZE}^3): numpy {gemm['numpy']:.0f} GFLOP/s, torch {gemm['torch']:.0f} GFLOP/s;"
          f" roofline {roofline:.0f} GFLOP/s")
    rows = [bench_mmjit(mmjit, size, repeats), bench_joint_attention(mmjit, size, max(repeats, 5)),
            bench_t5(t5, repeats), bench_mean_flow_image(student, t5, size, repeats)]
    print_table(rows, roofline)


if __name__ == "__main__":
    main()
