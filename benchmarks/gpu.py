"""GPU benchmark: MiniT2I sampling with CFG on one GPU, CuPy twin vs PyTorch eager (SDPA) and torch.compile.

    python benchmarks/gpu.py                       # B/16, 512x512, 10 and 100 steps, fp32/fp16/bf16
    python benchmarks/gpu.py --steps 10 --precisions bf16 --no-torch

Weights are random with the real B/16 (or L/16) shapes (speed does not depend on their values),
the context is a random [1, 256, 1024] T5 output. Both backends run the same math: one batched
[cond ; uncond] forward per step, guidance and the Euler update on the device. The PyTorch
baseline is training/torch_model.py, torch ops with F.scaled_dot_product_attention (the official
code uses an einsum softmax, see shared notes); the CuPy path is accelerated.sampler.sample.

Reported: wall time per run (CUDA events), ms per step, achieved TFLOP/s of the MMJiT GEMM +
attention work against the device's peak for that precision (torch.compile of the same torch
model beside PyTorch eager), our attention kernel beside torch SDPA at the model's attention
shapes (ratio printed), the joint attention with its 64-key tiles beside the 32-key ones before
(measured and predicted speed-up), and per-kernel timings of the
fused kernels at B/16 shapes (one call between CUDA events, host time included, and 20 calls
replayed from a CUDA graph: GPU time only), each beside the prediction of
benchmarks/performance_model.py (docs/performance-model.md: the round-trip model for the fused
memory-bound kernels, the roofline for the rest) on an H200, H100 or A100. Needs CuPy and an NVIDIA GPU (and torch with
CUDA for the baseline).

    python benchmarks/gpu.py --smoke               # no GPU: every component once on cudasim, untimed

--smoke runs the same code paths (the per-kernel cases and a 2-step sampler, graph capture tried)
on cudasim at the tiny model's shapes and prints what it would time; CI runs it.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

import numpy as np

from minit2i.accelerated import kernels
from minit2i.core.errors import MiniT2IError
from minit2i.core.mmjit_config import BASE_RECIPE, MODEL_VARIANTS, VARIANT_ALIASES, MMJiTConfig, mmjit_expected_shapes
from minit2i.core.weights import nest
from minit2i.reference.layers import joint_rope
from minit2i.reference.sampler import initial_noise, step_factors

# Dense peak TFLOP/s by device-name fragment: (fp32 CUDA cores, fp16 tensor, bf16 tensor).
# fp32 runs without TF32 (parity mode), so its peak is the CUDA-core number.
PEAK_TFLOPS = {
    "H200": (67.0, 989.0, 989.0),
    "H100 SXM": (67.0, 989.0, 989.0),
    "H100 PCIe": (51.0, 756.0, 756.0),
    "H100": (67.0, 989.0, 989.0),
    "A100": (19.5, 312.0, 312.0),
    "L40S": (91.6, 362.0, 362.0),
    "RTX 4090": (82.6, 165.2, 165.2),
}
PRECISION_INDEX = {"fp32": 0, "fp16": 1, "bf16": 2}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="b16", help="b16 or l16 (default b16)")
    parser.add_argument("--size", type=int, default=512, help="square image size (default 512)")
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100], help="step counts (default 10 100)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16", "bf16"], choices=list(PRECISION_INDEX))
    parser.add_argument("--cfg-scale", type=float, default=BASE_RECIPE["cfg_scale"])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per setting (best is reported)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch baselines (eager, torch.compile, SDPA)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--no-graph", action="store_true", help="CuPy: run every step eagerly (no CUDA graph replay)")
    parser.add_argument("--smoke", action="store_true", help="no GPU: run every component once on cudasim, untimed")
    parser.add_argument("--groups", type=int, nargs="+", default=[], metavar="N",
                        help="also images per second of the sampler drawing N images a forward (minit2i batch "
                             "--batch-size N), with the runner's kept graph, beside the model's prediction")
    return parser.parse_args(argv)


def random_tensors(config: MMJiTConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights under the checkpoint's names and shapes (norm weights 1, others
    N(0, 0.02))."""
    rng = np.random.default_rng(seed)
    flat = {}
    for name, shape in mmjit_expected_shapes(config).items():
        is_norm = "norm" in name and name.endswith("weight")
        flat[name] = np.ones(shape, np.float32) if is_norm else 0.02 * rng.standard_normal(shape, dtype=np.float32)
    return flat


def forward_flops(config: MMJiTConfig, size: int, batch: int) -> float:
    """GEMM + attention FLOPs of one forward on `batch` images (norms and elementwise ignored)."""
    d, hid, length = config.hidden_size, config.mlp_hidden, config.prompt_length
    tokens = (size // config.patch_size) ** 2
    per_token_block = 2 * (3 * d * d + d * d + 3 * d * hid)  # qkv, proj, w1|w3 and w2
    preamble = config.txt_preamble_depth * (length * per_token_block + 4 * length * length * d)
    joint = length + tokens
    double = config.depth_double * (joint * per_token_block + 4 * joint * joint * d)
    embed = 2 * tokens * (config.patch_dim * config.pca_channels + config.pca_channels * d)
    embed += 2 * length * config.txt_input_size * d + 2 * tokens * d * config.patch_dim
    return float(batch * (preamble + double + embed))


def peak_tflops(device_name: str, precision: str) -> float | None:
    for fragment, peaks in PEAK_TFLOPS.items():
        if fragment in device_name:
            return peaks[PRECISION_INDEX[precision]]
    return None


# ---------------------------------------------------------------------------------------------
# Timing helpers (CUDA events: wall time on the GPU, not Python launch time)


def time_cupy(cp, fn, repeats: int) -> float:
    """Best of `repeats` runs of fn(), in ms, after one warm-up run."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(start, end))
    return best


def replayed(fn, launches: int):
    """`launches` calls of fn() captured in one CUDA graph on a stream of its own: (graph, stream).
    fn runs once before, eagerly (it compiles)."""
    from minit2i.accelerated.sampler import capture, capture_stream

    fn()
    stream = capture_stream()
    return capture(lambda: [fn() for _ in range(launches)], stream), stream


def time_replayed(cp, fn, launches: int = 20) -> float:
    """GPU time of one fn() in ms: `launches` calls replayed from a CUDA graph between two CUDA
    events, no Python between them (time_cupy's events also hold the call's host time)."""
    graph, stream = replayed(fn, launches)
    graph.launch(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    graph.launch(stream)
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / launches


def cupy_sampler(cp, params, config, size, steps, precision, cfg_scale, use_graph, images: int = 1):
    """A run of the twin's sampler over `images` images at once; with `images` > 1 through one
    runner's kept graphs (`StepGraphs`), as a batch run's later groups draw."""
    from minit2i.accelerated.mmjit import denoise_embedded, embed_prompt, upload_mmjit
    from minit2i.accelerated.pipeline import precision_dtype
    from minit2i.accelerated.sampler import StepGraphs, sample_on_device

    dtype = precision_dtype(precision)
    device_params = upload_mmjit(params, config, dtype)
    rng = np.random.default_rng(1)
    context = cp.asarray(rng.standard_normal((images, config.prompt_length, config.txt_input_size),
                                             dtype=np.float32)).astype(dtype)
    mask = cp.ones((images, config.prompt_length), dtype)
    noise = initial_noise(0, images, config.in_channels, size, size)
    graphs = StepGraphs() if images > 1 else None

    def embed(ctx, m):
        return embed_prompt(device_params, config, ctx, m)

    def denoise(x, prompt):
        return denoise_embedded(device_params, config, x, prompt)

    return lambda: sample_on_device(embed, denoise, noise, context, mask, steps, cfg_scale, 0.001,
                                    use_graph=use_graph, graphs=graphs)


def print_groups(cp, params, config, size: int, steps: int, precision: str, cfg_scale: float, groups, device,
                 repeats: int) -> None:
    """Images per second of the sampler at each group size (T5 aside), measured and predicted
    (`performance_model.group_ms` without T5: every step replayed from the kept graph, bf16 and
    fp16 on an H200 or H100)."""
    import performance_model

    chip = model_chip(device) if precision != "fp32" else None
    attention = model_attention() if chip else None
    print(f"\n{'group N':<10}{'precision':<10}{'steps':>6}{'ms':>10}{'images/s':>10}{'predicted':>11}")
    for images in groups:
        ms = time_cupy(cp, cupy_sampler(cp, params, config, size, steps, precision, cfg_scale, True, images), repeats)
        group_ms = (performance_model.group_ms(config, size, steps, images, performance_model.Trunk(attention),
                                               t5=None, chip=chip[0], device=chip[1]) if attention else 0)
        predicted = f"{images / group_ms * 1e3:.1f}" if attention else "?"
        print(f"{images:<10}{precision:<10}{steps:>6}{ms:>10.1f}{images / ms * 1e3:>10.2f}{predicted:>11}")


def kernel_cases(cp, config: MMJiTConfig, size: int, precision: str) -> dict:
    """{name: (run, Component)}: each fused kernel and one GEMM at the shapes of one batched CFG
    forward, with the FLOPs and bytes the performance model charges for that one launch."""
    from performance_model import Component  # a sibling file, like torch_peer

    from minit2i.accelerated.pipeline import precision_dtype

    dtype = precision_dtype(precision)
    d, heads, dh = config.hidden_size, config.num_heads, config.head_dim
    tokens, length = (size // config.patch_size) ** 2, config.prompt_length
    joint, batch = tokens + length, 2
    item = np.dtype(dtype).itemsize
    padded = -(-dh // 16) * 16 if item == 2 else dh
    x = cp.ones((batch, tokens, d), dtype)
    zeros, w, bias = cp.zeros_like(x), cp.ones(d, dtype), cp.zeros(d, dtype)
    packed = cp.ones((batch, tokens, 2 * config.mlp_hidden), dtype)
    qkv = cp.ones((batch, tokens, 3 * d), dtype)
    q, k, v = (cp.zeros((batch, heads, joint, dh), dtype) for _ in range(3))
    cos, sin = (cp.asarray(t) for t in joint_rope(length, size // config.patch_size, size // config.patch_size, dh, np.float32))
    state = cp.zeros((1, 3, size, size), np.float32)
    x0_both = cp.zeros((2, 3, size, size), dtype)
    next_input, guided, factor = cp.empty_like(x0_both), cp.empty_like(state), cp.ones(1, np.float32)
    gemm_a, gemm_b = cp.ones((batch * tokens, d), dtype), cp.ones((d, 3 * d), dtype)

    def memory(name, bytes_moved):
        return Component(name, "memory", 1, 0.0, bytes_moved)

    return {
        "rms_norm": (lambda: kernels.rms_norm(x, w), memory("rms_norm", 2 * x.size * item)),
        "add_rms_norm": (lambda: kernels.add_rms_norm(x, zeros, bias, w), memory("add_rms_norm", 4 * x.size * item)),
        "swiglu": (lambda: kernels.gated_activation(packed, "swiglu"), memory("swiglu", 1.5 * packed.size * item)),
        "geglu": (lambda: kernels.gated_activation(packed, "geglu"), memory("geglu", 1.5 * packed.size * item)),
        "qkv_heads (img)": (lambda: kernels.qkv_heads(qkv, cp.zeros(3 * d, dtype), heads, q, k, v, length, (w[:dh], w[:dh]), (cos, sin)),
                            memory("qkv_heads", 2 * qkv.size * item)),
        "attention": (lambda: kernels.attention(q, k, v, dh**-0.5),
                      Component("attention", "attention", 1, 4.0 * batch * heads * joint * joint * padded, 4 * q.size * item)),
        "cfg_euler": (lambda: kernels.cfg_euler(state, next_input, x0_both, guided, 6.0, factor),
                      memory("cfg_euler", state.size * (8 + 4 * item))),
        "euler_step": (lambda: kernels.student_euler(state, next_input[:1], x0_both[:1], factor),
                       memory("euler_step", state.size * (8 + 2 * item))),
        "GEMM qkv (cuBLAS)": (lambda: kernels.gemm(gemm_a, gemm_b),
                              Component("GEMM", "gemm", 1, 2.0 * batch * tokens * d * 3 * d,
                                        item * (gemm_a.size + gemm_b.size + batch * tokens * 3 * d))),
    }


def model_device(device_name: str):
    """The performance model's description of this GPU (H200, H100 or A100), or None."""
    import performance_model

    return next((device for device in (performance_model.H200, performance_model.H100, performance_model.A100)
                 if device.name.split()[0] in device_name), None)


def predicted_us(name: str, component, device, item: int, config: MMJiTConfig, size: int) -> float:
    """The model's prediction for one case of kernel_cases on `device`: GPU time by the round-trip
    model for the fused memory-bound kernels on an H200 or H100 (their SMs), the roofline's
    otherwise."""
    import performance_model

    launch = performance_model.fused_kernel_launches(config, size, item).get(name.split()[0])
    if launch is not None and device in (performance_model.H200, performance_model.H100):
        return performance_model.memory_launch_us(launch, device=device)
    return 1e3 * performance_model.gpu_ms(component, device, item, performance_model.Assumptions())


def print_components(cp, config: MMJiTConfig, size: int, precision: str, device_name: str, timed: bool) -> None:
    """Each component's measured time beside the model's prediction: one call between CUDA events
    (its host time included) and 20 calls replayed from a CUDA graph (GPU time only; '-' when
    untimed, and then the graph is still captured and launched once)."""
    device = model_device(device_name)
    item = 2 if precision != "fp32" else 4
    print(f"\n{precision}, shapes of one batched CFG forward ({size}x{size}):")
    print(f"  {'component':<20}{'measured us':>12}{'replayed us':>13}{'predicted us':>14}{'achieved':>16}")
    for name, (run, component) in kernel_cases(cp, config, size, precision).items():
        predicted = f"{predicted_us(name, component, device, item, config, size):.2f}" if device else "?"
        if timed:
            ms, replay_ms = time_cupy(cp, run, 20), time_replayed(cp, run)
            rate = (f"{component.flops / replay_ms / 1e9:.1f} TFLOP/s" if component.flops
                    else f"{component.bytes / replay_ms / 1e6:.0f} GB/s")
            print(f"  {name:<20}{1000 * ms:>12.1f}{1000 * replay_ms:>13.1f}{predicted:>14}{rate:>16}")
        else:
            graph, stream = replayed(run, 1)
            graph.launch(stream)
            print(f"  {name:<20}{'-':>12}{'-':>13}{predicted:>14}{'-':>16}")


GEMM_LAUNCHES = 20  # launches of one GEMM captured in a graph and replayed between two events


def model_chip(device) -> tuple | None:
    """(Chip, Device) of the performance model's GEMM and sampler terms for `device` (the H200's
    SMs, also the H100's), or None."""
    import performance_model

    return (performance_model.H200_CHIP, device) if device in (performance_model.H200, performance_model.H100) else None


def gemm_shape_cases(cp, config: MMJiTConfig, size: int, precision: str) -> dict:
    """{name: (run, (M, K, N))}: the trunk's eight GEMM shapes of one batched CFG forward (4 a
    stream: qkv, attention projection, w1|w3, w2), each one kernels.gemm on arrays of ones."""
    import performance_model

    from minit2i.accelerated.pipeline import precision_dtype

    dtype, cases = precision_dtype(precision), {}
    for name, (m, k, n) in performance_model.forward_gemm_shapes(config, size).items():
        x, w = cp.ones((m, k), dtype), cp.ones((k, n), dtype)
        cases[name] = ((lambda x=x, w=w: kernels.gemm(x, w)), (m, k, n))
    return cases


def print_gemm_shapes(cp, config: MMJiTConfig, size: int, precision: str, device, timed: bool) -> None:
    """Each GEMM shape of a forward: GEMM_LAUNCHES launches captured in one CUDA graph and replayed
    between two events (GPU time only), beside the performance model's cuBLAS plan (its tile, its
    time; tensor-core precisions on an H200 or H100). Untimed, each graph is captured and launched
    once."""
    import performance_model

    chip = model_chip(device) if precision != "fp32" else None
    print(f"\nGEMM shapes of one {precision} forward ({size}x{size}), {GEMM_LAUNCHES} launches replayed from a graph:")
    print(f"{'gemm':<22}{'M x K x N':>17}{'tile':>9}{'measured us':>13}{'TFLOP/s':>9}"
          f"{'predicted us':>14}{'TFLOP/s':>9}")
    for name, (run, (m, k, n)) in gemm_shape_cases(cp, config, size, precision).items():
        flops = 2.0 * m * k * n
        plan = performance_model.cublas_plan(m, k, n, 2, False, *chip) if chip else None
        tile = f"{plan.tile[0]}x{plan.tile[1]}" if plan else "?"
        predicted = f"{plan.us:>14.1f}{flops / plan.us / 1e6:>9.0f}" if plan else f"{'?':>14}{'?':>9}"
        if timed:
            us = 1e3 * time_replayed(cp, run, GEMM_LAUNCHES)
            measured = f"{us:>13.1f}{flops / us / 1e6:>9.0f}"
        else:
            graph, stream = replayed(run, 1)
            graph.launch(stream)
            measured = f"{'-':>13}{'-':>9}"
        print(f"gemm {name:<17}{f'{m}x{k}x{n}':>17}{tile:>9}{measured}{predicted}")


def model_attention():
    """The attention kernel as the performance model reads it from its SASS (the [compile] tools:
    NVRTC, ptxas, cuobjdump), or None with the reason printed."""
    import performance_model

    try:
        return performance_model.mma_attention_kernel(performance_model.b16_attention_trip())
    except Exception as err:  # no ptxas or cuobjdump here: the measurements without the prediction
        print(f"(no sampler prediction: the attention kernel's SASS could not be read: {type(err).__name__})")
        return None


def random_runner(runner_class, config: MMJiTConfig, tensors: dict, precision: str, fork: bool):
    """A runner on `tensors` (random B/16 or tiny weights) with a tiny random T5 (the sampler is
    given its context), its graph kept across calls, its text stream forked or not (`fork`)."""
    from minit2i.core.t5_config import T5_TINY
    from minit2i.core.weights import LoadedWeights
    from minit2i.demo_models import random_t5_weights

    def loaded(model_config, model_tensors):
        return LoadedWeights(model_config, model_tensors, [], "", ["F32"], "random weights")

    return runner_class(loaded(config, tensors), loaded(T5_TINY, random_t5_weights(T5_TINY, 1)), precision,
                        use_graph=True, fork_streams=fork)


def print_stream_fork(runner_class, config: MMJiTConfig, tensors: dict, size: int, steps: int, precision: str,
                      cfg_scale: float, device, timed: bool) -> None:
    """The sampler through a runner: its first call (step 0 eager, the graph captured) and its
    second (the kept graph), each call's wall time (the image copied back included), with the text
    stream forked beside the image stream and without, beside the performance model's
    `sampler_call_ms` (bf16 and fp16 on an H200 or H100). Untimed, both calls run and no
    prediction is made (reading the attention kernel's SASS takes a while)."""
    import time

    import performance_model

    chip = model_chip(device) if timed and precision != "fp32" else None
    attention = model_attention() if chip else None
    rng = np.random.default_rng(1)
    context = rng.standard_normal((1, config.prompt_length, config.txt_input_size), dtype=np.float32)
    mask, noise = np.ones((1, config.prompt_length), np.float32), initial_noise(0, 1, config.in_channels, size, size)
    for fork in (True, False):
        runner = random_runner(runner_class, config, tensors, precision, fork)
        calls = []
        for _ in range(2):
            start = time.perf_counter()
            runner.sample(noise, context, mask, steps, cfg_scale, 0.001)
            calls.append(1e3 * (time.perf_counter() - start))
        trunk = performance_model.Trunk(attention, fork=fork) if attention else None
        predicted = [f"{performance_model.sampler_call_ms(config, size, steps, trunk, first, 1, *chip):.1f}"
                     if trunk else "?" for first in (True, False)]
        label = "stream fork on" if fork else "stream fork off"
        if timed:
            print(f"sampler {steps} steps {precision}, {label}: first call {calls[0]:.1f} ms (predicted "
                  f"{predicted[0]}), second call {calls[1]:.1f} ms (predicted {predicted[1]}, the kept graph)")
        else:
            print(f"sampler {steps} steps {precision}, {label}: a first and a second call ran (untimed)")


# ---------------------------------------------------------------------------------------------
# PyTorch eager baseline: training/torch_model.py (the reference math in torch ops, SDPA)


def torch_sampler(torch, params, config: MMJiTConfig, size, steps, precision, cfg_scale, dev="cuda", compiled=False):
    """A closure running the whole sampler in torch eager (or with the forward under
    torch.compile, compiled on the first call: the warm-up); returns the final state [1, C, H, W]."""
    from minit2i.training import torch_model as torch_peer  # here, because torch is optional for this script

    forward = torch.compile(torch_peer.mmjit_forward) if compiled else torch_peer.mmjit_forward
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    tree = torch_peer.to_torch_tree(params, dev, dtype)
    length = config.prompt_length
    gen = np.random.default_rng(1)
    context = torch.as_tensor(gen.standard_normal((1, length, config.txt_input_size), dtype=np.float32), device=dev, dtype=dtype)
    both_context = torch.cat([context, context])
    both_mask = torch.cat([torch.ones(1, length, device=dev, dtype=dtype), torch.zeros(1, length, device=dev, dtype=dtype)])
    noise = torch.as_tensor(initial_noise(0, 1, config.in_channels, size, size), device=dev)
    factors = step_factors(steps, 0.001)

    @torch.inference_mode()
    def run():
        x = noise.clone()
        for f in factors:
            x0 = forward(tree, config, torch.cat([x, x]).to(dtype), both_context, both_mask).float()
            guided = x0[1:] + cfg_scale * (x0[:1] - x0[1:])
            x = x + float(f) * (guided - x)
        return x

    return run


def time_torch(torch, fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def attention_shapes(config: MMJiTConfig, size: int) -> list[tuple[int, int, int, int]]:
    """[B, H, L, Dh] of the model's attentions in one CFG forward: the joint text + image one (at
    `size` and at half of it) and the text preamble's."""
    text, patches = config.prompt_length, (size // config.patch_size) ** 2
    return [(2, config.num_heads, length, config.head_dim) for length in (text + patches, text + patches // 4, text)]


def time_attention(cp, torch, shape, precision: str, launches: int = 20) -> tuple[float, float | None]:
    """µs per launch of kernels.attention and (with torch) of torch SDPA on the same random
    q, k, v [B, H, L, Dh], each timed over `launches` launches with CUDA events."""
    from minit2i.accelerated.pipeline import precision_dtype

    dtype = precision_dtype(precision)
    q, k, v = (cp.asarray(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)).astype(dtype)
               for seed in range(3))
    scale = shape[-1] ** -0.5
    ours = time_cupy(cp, lambda: [kernels.attention(q, k, v, scale) for _ in range(launches)], 3) * 1e3 / launches
    if torch is None:
        return ours, None
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    tq, tk, tv = (torch.as_tensor(cp.asnumpy(a.astype(np.float32)), device="cuda", dtype=torch_dtype) for a in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    theirs = time_torch(torch, lambda: [sdpa(tq, tk, tv, scale=scale) for _ in range(launches)], 3) * 1e3 / launches
    return ours, theirs


def print_attention(cp, torch, config: MMJiTConfig, size: int, precision: str) -> None:
    for shape in attention_shapes(config, size):
        ours, sdpa = time_attention(cp, torch, shape, precision)
        beside = f", torch SDPA {sdpa:.1f} µs, ours / SDPA {ours / sdpa:.2f}" if sdpa else ""
        print(f"attention {list(shape)} {precision}: ours {ours:.1f} µs{beside}")


@contextmanager
def key_tile_at_64(keys: int):
    """attention_tc.cu's key tile at padded head dim 64 set to `keys` while inside (its source's
    #define, the launch's shared memory and the model's reading of it follow the constant), the
    shipped one restored after: the planted slower version, built and timed beside the shipped one."""
    shipped = kernels.MMA_KEY_TILES[64]
    kernels.MMA_KEY_TILES[64] = kernels.KERNEL_CONSTANTS["MMA_KEY_TILE_D64"] = keys
    kernels.clear_device_caches()
    try:
        yield
    finally:
        kernels.MMA_KEY_TILES[64] = kernels.KERNEL_CONSTANTS["MMA_KEY_TILE_D64"] = shipped
        kernels.clear_device_caches()


def print_key_tiles(cp, config: MMJiTConfig, size: int, precision: str, images=(1, 16)) -> None:
    """The joint attention with the shipped 64-key tiles and with 32-key ones (before), each timed
    and beside the pipe model's prediction from its own SASS, at `images` CFG images a forward: the
    speed-up measured against the one predicted."""
    import performance_model

    if precision == "fp32" or config.head_dim > 64:
        return
    shape = attention_shapes(config, size)[0]
    shapes = [(2 * count, *shape[1:]) for count in images]

    def timed_and_predicted(keys: int) -> list[tuple[float, float | None]]:
        """(measured µs, predicted µs or None) at each shape, the version built once."""
        with key_tile_at_64(keys):
            kernel = model_attention()
            return [(time_attention(cp, None, batched, precision)[0],
                     performance_model.attention_kernel_us(kernel, *batched[:3]) if kernel else None)
                    for batched in shapes]

    shipped = kernels.MMA_KEY_TILES[64]
    for batched, (new, new_model), (old, old_model) in zip(shapes, timed_and_predicted(shipped),
                                                           timed_and_predicted(32)):
        predicted = f"{old_model / new_model:.2f}" if new_model else "?"
        print(f"attention {list(batched)} {precision}: {shipped}-key tiles {new:.1f} µs, 32-key tiles {old:.1f} µs; "
              f"32-key / {shipped}-key measured {old / new:.2f}, predicted {predicted}")


# ---------------------------------------------------------------------------------------------


def load_torch(skip: bool):
    """torch with CUDA, or None (with the reason printed) when the baseline cannot run."""
    if skip:
        return None
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed: skipping the eager baseline", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("PyTorch has no CUDA device: skipping the eager baseline", file=sys.stderr)
        return None
    return torch


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.smoke:
        return smoke(args)
    try:
        cp = kernels.require_gpu()
        config = MODEL_VARIANTS[VARIANT_ALIASES.get(args.variant, args.variant)]
    except MiniT2IError as err:
        print(f"benchmarks/gpu.py: {err}", file=sys.stderr)
        return 2
    except KeyError:
        print(f"benchmarks/gpu.py: unknown --variant {args.variant}; use b16 or l16", file=sys.stderr)
        return 2
    import performance_model

    torch = load_torch(args.no_torch)
    device_name = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())["name"].decode()
    device, assumptions = model_device(device_name), performance_model.Assumptions()
    tensors = random_tensors(config)
    params = nest(tensors)
    flops_per_step = forward_flops(config, args.size, batch=2)
    graph = not args.no_graph
    print(f"device: {device_name}; {args.variant} {args.size}x{args.size}, CFG {args.cfg_scale}, "
          f"{flops_per_step / 1e12:.2f} TFLOP per step (GEMM + attention)")
    print(f"{'backend':<14}{'precision':<10}{'steps':>6}{'total ms':>11}{'predicted':>11}{'ms/step':>9}{'TFLOP/s':>9}{'% peak':>8}")
    for precision in args.precisions:
        item = 4 if precision == "fp32" else 2
        for steps in args.steps:
            runs = [("cupy" + ("+graph" if graph else ""),
                     lambda: time_cupy(cp, cupy_sampler(cp, params, config, args.size, steps, precision,
                                                        args.cfg_scale, graph), args.repeats),
                     lambda: performance_model.cupy_run_ms(config, args.size, steps, device, item, assumptions, graph))]
            if torch is not None:
                runs.append(("torch eager", lambda: time_torch(torch, torch_sampler(
                    torch, params, config, args.size, steps, precision, args.cfg_scale), args.repeats),
                    lambda: performance_model.torch_run_ms(config, args.size, steps, device, item, assumptions)))
            if torch is not None and not args.no_compile:
                runs.append(("torch.compile", lambda: time_torch(torch, torch_sampler(
                    torch, params, config, args.size, steps, precision, args.cfg_scale, compiled=True), args.repeats),
                    lambda: None))
            for backend, timed, predict in runs:
                ms = timed()
                predicted = f"{predict():.1f}" if device and predict() is not None else "?"
                tflops = flops_per_step * steps / ms / 1e9
                peak = peak_tflops(device_name, precision)
                share = f"{100 * tflops / peak:.1f}" if peak else "?"
                print(f"{backend:<14}{precision:<10}{steps:>6}{ms:>11.1f}{predicted:>11}{ms / steps:>9.2f}{tflops:>9.1f}{share:>8}")
    from minit2i.accelerated.pipeline import CupyRunner

    for precision in args.precisions:
        print_gemm_shapes(cp, config, args.size, precision, device, timed=True)
        print_stream_fork(CupyRunner, config, tensors, args.size, args.steps[0], precision, args.cfg_scale, device,
                          timed=True)
    for precision in args.precisions:
        if args.groups:
            print_groups(cp, params, config, args.size, args.steps[0], precision, args.cfg_scale, args.groups, device,
                         args.repeats)
    for precision in args.precisions:
        print_attention(cp, torch, config, args.size, precision)
        print_key_tiles(cp, config, args.size, precision)
    for precision in args.precisions:
        print_components(cp, config, args.size, precision, device_name, timed=True)
    return 0


def smoke(args) -> int:
    """No GPU: every component once and a 2-step sampler (graph capture tried), on cudasim at the tiny
    model's shapes; nothing is timed (the predictions shown are the model's, for an H100)."""
    from minit2i.accelerated.pipeline import CudasimRunner, precision_dtype
    from minit2i.core.mmjit_config import MMJIT_TINY

    import performance_model

    cp = CudasimRunner.array_module()
    config, size = MMJIT_TINY, 32
    tensors = random_tensors(config)
    params = nest(tensors)
    print(f"smoke run on cudasim, no timings: tiny model, {size}x{size}")
    for precision in args.precisions:
        cupy_sampler(cp, params, config, size, 2, precision, args.cfg_scale, use_graph=not args.no_graph)()
        print(f"sampler, {precision}: 2 steps ran")
        for images in args.groups:
            cupy_sampler(cp, params, config, size, 2, precision, args.cfg_scale, not args.no_graph, images)()
            print(f"sampler, {precision}: 2 steps of a group of {images} ran")
        for shape in attention_shapes(config, size):
            q = cp.zeros(shape, np.float32).astype(precision_dtype(precision))
            kernels.attention(q, q, q, 1.0)
        print(f"attention, {precision}: {len(attention_shapes(config, size))} shapes ran (untimed; SDPA needs a GPU)")
        if precision != "fp32":
            with key_tile_at_64(32):
                kernels.attention(q, q, q, 1.0)
            print(f"attention, {precision}: the 32-key tiles ran too (timed beside the shipped ones on a GPU)")
        print_components(cp, config, size, precision, "H100 (predicted only)", timed=False)
        print_gemm_shapes(cp, config, size, precision, performance_model.H100, timed=False)
        print_stream_fork(CudasimRunner, config, tensors, size, 2, precision, args.cfg_scale, None, timed=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
