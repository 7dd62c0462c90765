"""BLAS threads sized to the work (core/threads.py): the rule, its use by every request, and the
user's overrides (`--threads`, `threads=`, the *_NUM_THREADS variables), each refused in one line
when bad. The threshold itself is measured by benchmarks/blas_threads.py, not here."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from minit2i import MiniT2IPipeline
from minit2i.cli import main
from minit2i.core.errors import MiniT2IError
from minit2i.core.mean_flow_config import MEAN_FLOW_B16
from minit2i.core import threads
from minit2i.core.mmjit_config import MMJIT_B16
from minit2i.core.threads import (
    FLOPS_PER_THREAD,
    THREAD_VARIABLES,
    blas_threads,
    block_product_flops,
    check_threads,
    current_blas_threads,
    threads_for,
)
from minit2i.pipeline import Request, run_threads

PROMPT = "a large red circle at the left on a gray background"
SMALL = {"num_inference_steps": 2, "height": 16, "width": 16}


@pytest.fixture
def no_thread_variables(monkeypatch):
    """The project's own choice: none of the user's *_NUM_THREADS variables set."""
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def model_of(config):
    """What `run_threads` reads of a model: its denoiser's config (no weights needed)."""
    return SimpleNamespace(mmjit=SimpleNamespace(config=config))


def test_one_thread_per_flops_per_thread_of_work_capped_by_the_cores():
    assert threads_for(0.0, cores=16) == 1
    assert threads_for(0.99 * FLOPS_PER_THREAD, cores=16) == 1
    assert threads_for(2.0 * FLOPS_PER_THREAD, cores=16) == 2
    assert threads_for(5.5 * FLOPS_PER_THREAD, cores=16) == 5
    assert threads_for(1000 * FLOPS_PER_THREAD, cores=16) == 16
    assert threads_for(1000 * FLOPS_PER_THREAD, cores=1) == 1


def test_block_product_is_the_swiglu_first_layer_over_all_rows_and_tokens():
    """B/16's guided step at 512 x 512: 2 rows of 1024 image + 256 text tokens, D 768, SwiGLU 2048."""
    assert block_product_flops(MMJIT_B16, 2, 1280) == 2 * 2 * 1280 * 768 * 2048


def test_the_demo_image_gets_one_thread_and_b16_at_512_every_core(no_thread_variables, monkeypatch):
    from minit2i.pipeline import open_model, make_request

    demo = open_model("demo")
    assert run_threads(make_request(demo, PROMPT, {}), demo) == 1
    monkeypatch.setattr("minit2i.core.threads.available_cores", lambda: 4)
    base = model_of(MMJIT_B16)
    assert run_threads(Request(PROMPT, width=512, height=512), base) == 4  # 8.05 GFLOP a product
    # The four-step student: one row an image (no unconditional row), 20 + 256 text tokens.
    assert run_threads(Request(PROMPT, width=512, height=512), model_of(MEAN_FLOW_B16)) == 4  # 4.2 GFLOP
    assert run_threads(Request(PROMPT, width=64, height=64), base) == 1  # 16 + 256 tokens: 1.7 GFLOP


def test_a_users_variable_or_count_overrides_the_choice(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert run_threads(Request(PROMPT, width=512, height=512), model_of(MMJIT_B16)) is None
    assert run_threads(Request(PROMPT, width=512, height=512), model_of(MMJIT_B16), threads=2) == 2


def test_the_block_sets_the_count_and_puts_the_old_one_back():
    before = current_blas_threads()
    with blas_threads(2):
        assert current_blas_threads() == 2
    assert current_blas_threads() == before
    with blas_threads(None):
        assert current_blas_threads() == before


def test_the_api_runs_on_the_count_asked_for_or_chosen(no_thread_variables):
    chosen = MiniT2IPipeline.from_pretrained("demo")
    chosen.set_progress_bar_config(disable=True)
    asked = MiniT2IPipeline.from_pretrained("demo", threads=np.int64(2))
    asked.set_progress_bar_config(disable=True)
    assert chosen(PROMPT, generator=1, **SMALL).blas_threads == 1
    output = asked(PROMPT, generator=1, **SMALL)
    assert output.blas_threads == 2
    assert output.timing_table().splitlines()[0] == "timings (numpy, fp32, BLAS threads 2):"


def test_a_users_variable_is_obeyed(monkeypatch):
    """With OPENBLAS_NUM_THREADS set, the run leaves the library's count as it is."""
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    pipe = MiniT2IPipeline.from_pretrained("demo")
    pipe.set_progress_bar_config(disable=True)
    with blas_threads(2):  # as the variable would have set it at start-up
        assert pipe(PROMPT, generator=1, **SMALL).blas_threads == 2


@pytest.mark.parametrize("threads", [0, -1, 1025, 1.5, True, "2", [2]])
def test_a_bad_count_is_one_line_before_the_model_is_opened(threads):
    with pytest.raises(MiniT2IError, match=r"^--threads \(threads\) must be an integer in \[1, 1024\], found "):
        MiniT2IPipeline.from_pretrained("no/such-model-anywhere", threads=threads)
    assert check_threads(np.int32(1)) == 1


@pytest.mark.parametrize("command", ["generate", "trace", "batch"])
def test_more_threads_than_cores_are_refused_in_one_line(command, capsys, monkeypatch, tmp_path):
    """--threads 8 on 2 busy cores drew the demo image in 95.8 s against 1.0 s with 1, and only
    learn refused it; generate, trace, batch and the API took it silently."""
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    where = [prompts, "--out", tmp_path / "run"] if command == "batch" else ["-p", PROMPT]
    code = main([command, *map(str, where), "--threads", "3"])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "minit2i: error: --threads is 3, more than the 2 cores this process may run on (more threads than cores only "
        "wait for one another); pass 2 or fewer")
    with pytest.raises(MiniT2IError, match=r"^--threads \(threads\) is 3, more than the 2 cores"):
        MiniT2IPipeline.from_pretrained("demo", threads=3)
    assert check_threads(3, "--threads", limit_to_cores=False) == 3  # a Ray actor's count, for the cluster's nodes
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["generate", "trace"])
def test_the_flag_is_refused_in_one_line_exit_2(command, capsys):
    code = main([command, "-p", PROMPT, "--model", "no/such-model-anywhere", "--t5", "x", "--threads", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "minit2i: error: --threads must be an integer in [1, 1024], found 0\n"
