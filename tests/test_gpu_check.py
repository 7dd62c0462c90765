"""scripts/gpu-check --cudasim, run as the GPU machine runs it: from a copy of the checkout (the
files a device run receives), with no install step, in a virtual environment that has this
interpreter's third-party packages but not the project, huggingface_hub 1.x and no httpx2 (the
lent machine's image). It must pass and write a report small enough to copy back in one go."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import signal
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu-check"
MAX_FILES, MAX_FILE_BYTES = 5, 16 * 2**20
PARTS = ("versions", "parity-bf16", "parity-fp16", "parity-fp32", "replay", "user", "benchmark", "sanitizer", "profile")


@pytest.fixture(scope="module")
def gpu_check():
    """The script as a module (registered while it runs: its dataclasses look themselves up)."""
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    sys.modules["gpu_check"] = module
    loader.exec_module(module)
    yield module
    del sys.modules["gpu_check"]


def copy_checkout(copy: Path) -> Path:
    """The tracked and untracked-but-not-ignored files, as a device run carries them."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    return copy


@pytest.fixture(scope="module")
def checkout_copy(tmp_path_factory):
    return copy_checkout(tmp_path_factory.mktemp("checkout"))


def lent_machine_venv(folder: Path, hub_1x: Path) -> Path:
    """A virtual environment at `folder` as on the lent GPU machine: this interpreter's third-party
    packages (their folders on the path, so the project's editable install is not), huggingface_hub
    1.x before them, and httpx2 unimportable. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    own_site = next((folder / "lib").glob("python*/site-packages"))
    lines = [str(hub_1x), *site.getsitepackages(), "import sys; sys.modules['httpx2'] = None"]
    (own_site / "lent-machine.pth").write_text("\n".join(lines) + "\n")
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory, hub_1x) -> Path:
    return lent_machine_venv(tmp_path_factory.mktemp("lent-machine") / "venv", hub_1x)


def test_the_lent_machine_venv_lacks_the_project_and_has_the_old_hub(bare_python):
    probe = ("import importlib.util as u, importlib.metadata as m; "
             "print(u.find_spec('minit2i'), m.version('huggingface_hub'), u.find_spec('numpy') is not None)")
    result = subprocess.run([str(bare_python), "-c", probe], capture_output=True, text=True, cwd="/", timeout=60)
    found, hub_version, numpy = result.stdout.split()
    assert (found, hub_version.split(".")[0], numpy) == ("None", "1", "True"), result.stderr


def files_of(folder: Path) -> set[Path]:
    """The files under `folder`, less Python's byte-code caches."""
    return {path for path in folder.rglob("*") if "__pycache__" not in path.parts}


@pytest.fixture(scope="module")
def report(checkout_copy, bare_python, tmp_path_factory):
    """The check with a relative --out, run from a folder of its own: (result, report folder,
    the files the run added to the checkout)."""
    work = tmp_path_factory.mktemp("work")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    before = files_of(checkout_copy)
    result = subprocess.run([str(bare_python), str(checkout_copy / "scripts" / "gpu-check"), "--cudasim", "--out", "report"],
                            cwd=work, env=env, capture_output=True, text=True, timeout=1800)  # a hang guard
    return result, work / "report", files_of(checkout_copy) - before


def test_cudasim_check_passes_from_a_copy_of_the_checkout(report, checkout_copy, bare_python):
    result, out, _ = report
    summary = (out / "summary.md").read_text()
    assert result.returncode == 0, result.stdout + result.stderr
    assert summary.startswith("# gpu-check: twin PASSED; tools: sanitizer passed, profile passed (cudasim")
    assert f"minit2i imported from {checkout_copy.resolve()}" in summary  # the copy, not the installed package
    assert f" at {bare_python} (a virtual environment outside the checkout)" in summary  # which Python ran
    lines = [line for line in summary.splitlines() if line.startswith("* ")]
    assert [line.split(":")[0][2:] for line in lines] == list(PARTS)  # in the order of value
    for line in lines:
        assert ": passed (" in line and "s on a GPU" in line, line  # each with its GPU estimate
    assert "Estimated time of these parts on a GPU:" in summary


def test_report_names_every_kernel_and_dtype(report):
    _, out, _ = report
    summary = (out / "summary.md").read_text()
    for dtype in ("bf16", "fp16", "fp32"):
        parity_line = next(line for line in summary.splitlines() if line.startswith(f"* parity-{dtype}"))
        assert "passed" in parity_line.split(": ", 2)[2] and "failed" not in parity_line  # counts of 0 are left out
        assert "one drawn example a test beside its @example cases" in parity_line  # the suite draws them all
    assert "test_tensor_core_attention_matches_softmax_attention[bf16]:" in summary
    for kernel in ("rms_norm", "add_rms_norm", "swiglu", "geglu", "qkv_heads", "cfg_euler", "euler_step"):
        for suffix in ("f32", "f16", "bf16"):
            assert f"| {kernel}_{suffix} |" in summary
    assert "| flash_attention_f32 |" in summary and "| flash_attention_tc_bf16 |" in summary
    # the attention's counts on cudasim (no ncu beside them here), and no clock to log
    assert "| ldmatrix excess wavefronts per request | 0.00 | - | - |" in summary
    assert "instructions per warp and key tile" in summary  # the SASS trip's, or why it was not read
    assert "SM clock: no GPU (cudasim)" in summary


def test_the_user_part_compares_every_demo_png_and_draws_a_batch(report):
    """Both demo models in each precision on the device against the NumPy backend's PNG, each
    within its bound (the part passed), and a four-image batch."""
    _, out, _ = report
    summary = (out / "summary.md").read_text()
    for model in ("demo", "demo-mf"):
        for precision in ("fp32", "fp16", "bf16"):
            assert re.search(rf"^\| {model} \| {precision} \| \d+", summary, re.MULTILINE), (model, precision)
    assert "`minit2i batch -n 4 --backend cudasim --precision bf16`: 4 PNGs" in summary


def test_the_benchmark_part_reports_the_gemm_shapes_the_fork_and_the_kept_graph(report):
    """On cudasim the benchmark part runs benchmarks/gpu.py --smoke: each of the forward's eight
    GEMM shapes captured in a graph and launched (the model's tile beside it), and the sampler's
    first and second call through a runner (with the fork on and off), all in the summary."""
    _, out, _ = report
    summary = (out / "summary.md").read_text()
    names = ("qkv", "attn proj", "w1|w3", "w2")
    for name in names:
        for stream in ("txt", "img"):
            assert any(line.startswith(f"gemm {name} ({stream})") for line in summary.splitlines()), (name, stream)
    calls = [line for line in summary.splitlines() if "a first and a second call ran" in line]
    fork_lines = [line for line in calls if "stream fork o" in line]
    assert len(fork_lines) == len(calls) == 2


def test_report_fits_one_copy_back(report):
    _, out, _ = report
    files = list(out.rglob("*"))
    assert 0 < len(files) <= MAX_FILES and all(f.is_file() and f.stat().st_size <= MAX_FILE_BYTES for f in files)


def test_import_root_maps_every_layer_folder(gpu_check, tmp_path):
    """The links follow pyproject.toml's package-dir: each layer folder appears as minit2i.<layer>."""
    root = gpu_check.import_root(REPO, tmp_path / "import")
    package = root / "minit2i"
    for layer in ("core", "reference", "accelerated", "cudasim", "training"):
        assert (package / layer).resolve() == REPO / layer
    assert (package / "__init__.py").resolve() == REPO / "minit2i" / "__init__.py"


def test_gpu_tests_are_the_marked_files(gpu_check):
    assert gpu_check.gpu_test_files() == ["tests/test_accelerated.py", "tests/test_accelerated_mean_flow.py",
                                          "tests/test_accelerated_streams.py"]


def test_ncu_csv_is_read_per_kernel_and_metric(gpu_check):
    output = ('==PROF== Connected to process 1\n'
              '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
              '"0","rms_norm_bf16(const __nv_bfloat16 *, int)","gpu__time_duration.sum","nsecond","12,480"\n'
              '"0","rms_norm_bf16(const __nv_bfloat16 *, int)","dram__bytes.sum","byte","41943040"\n')
    assert gpu_check.ncu_metrics(output) == {"rms_norm_bf16": {"gpu__time_duration.sum": 12480.0,
                                                                   "dram__bytes.sum": 41943040.0}}


def gpu_check_process(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=120, **kwargs)


@pytest.mark.parametrize("args, message", [
    (["--parts", "versions,parity"], "argument --parts: unknown part parity; choose from " + ",".join(PARTS)),
    (["--budget", "0"], "argument --budget: 0 is not a positive, finite number of seconds (default 480)"),
    (["--budget", "-5"], "argument --budget: -5 is not a positive, finite number of seconds (default 480)"),
    (["--budget", "nan"], "argument --budget: nan is not a positive, finite number of seconds (default 480)"),
    (["--budget", "inf"], "argument --budget: inf is not a positive, finite number of seconds (default 480)"),
    (["--budget", "soon"], "argument --budget: 'soon' is not a number of seconds"),
])
def test_bad_parts_and_budgets_are_one_line_usage_errors(tmp_path, args, message):
    result = gpu_check_process(*args, "--out", str(tmp_path / "report"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"scripts/gpu-check: error: {message}\n"
    assert not (tmp_path / "report").exists()  # refused before anything is made


def test_out_folders_that_cannot_hold_a_report_are_one_line_usage_errors(tmp_path):
    """A file, a path under a file, a place nobody may write to (sysfs refuses root too), a name
    longer than the system allows: each one line naming --out, exit 2, before any work."""
    (tmp_path / "notes.txt").write_text("mine")
    for out, reason in [(tmp_path / "notes.txt", "is not a folder"), (tmp_path / "notes.txt" / "r", "is not a folder"),
                        (Path("/sys/gpu-check-report"), "cannot write there"),
                        (tmp_path / ("r" * 300), "longer than this system allows")]:
        result = gpu_check_process("--cudasim", "--out", str(out))
        assert result.returncode == 2 and result.stdout == "", out
        assert result.stderr.startswith("scripts/gpu-check: error: --out") and reason in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_folder_holding_a_report_name_is_refused_and_left_as_it_was(tmp_path):
    """The user's own summary.md, and a parity.log that is a link to a file elsewhere: nothing is
    overwritten, nothing is written through the link."""
    (tmp_path / "summary.md").write_text("my notes")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere.txt"
    elsewhere.write_text("not yours")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "parity.log").symlink_to(elsewhere)
    for out, name in ((tmp_path, "summary.md"), (linked, "parity.log")):
        result = gpu_check_process("--cudasim", "--parts", "versions", "--out", str(out))
        assert result.returncode == 2
        assert result.stderr == (f"scripts/gpu-check: error: --out {out} already holds {name}; choose a new or empty folder "
                                 "(nothing is overwritten)\n")
    assert (tmp_path / "summary.md").read_text() == "my notes" and elsewhere.read_text() == "not yours"


def test_a_relative_out_is_relative_to_where_the_command_runs(report):
    """The parts run in the checkout, but nothing of the report (parity's junit XML included)
    lands there: it all goes where --out says, from where the command runs."""
    _, out, added = report
    assert added == set()
    assert sorted(path.name for path in out.iterdir()) == ["benchmark.txt", "parity.log", "sanitizer.log", "summary.md"]


def test_a_check_stopped_from_outside_leaves_its_report(tmp_path):
    """SIGTERM while the first parity part runs (as `timeout` stops a command): the summary says
    which parts passed, which one was stopped and which were not reached, and the twin's verdict
    is INCOMPLETE."""
    out = tmp_path / "report"
    process = subprocess.Popen([sys.executable, str(SCRIPT), "--cudasim", "--out", str(out)], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    summary = out / "summary.md"
    for _ in range(1200):  # a hang guard of 120 s; the versions part takes a few seconds
        if summary.exists() and "* parity-bf16: running" in summary.read_text():
            break
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    text = summary.read_text()
    assert process.returncode == 1
    assert text.startswith("# gpu-check: twin INCOMPLETE; tools: sanitizer not reached, profile not reached (cudasim")
    assert "* versions: passed" in text and "* parity-bf16: stopped" in text and "stopped from outside (SIGTERM)" in text
    assert all(f"* {name}: not reached" in text for name in PARTS[2:])


def test_a_tool_that_cannot_run_here_is_not_the_twins_failure(gpu_check):
    parts = [gpu_check.Part(name, "passed") for name in PARTS[:-2]]
    parts += [gpu_check.Part("sanitizer", "unavailable"), gpu_check.Part("profile", "unavailable")]
    assert gpu_check.verdicts(parts, list(PARTS)) == ("PASSED", "sanitizer unavailable, profile unavailable")
    parts[-2].status = "failed"  # compute-sanitizer ran and found an error in a kernel
    assert gpu_check.verdicts(parts, list(PARTS))[0] == "FAILED"
    for output in ("========= Error: Device not supported", "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission"):
        assert gpu_check.UNAVAILABLE.search(output)


def test_the_default_budget_fits_one_short_gpu_window(gpu_check):
    """At most 8 minutes in all, and the parts before the tools leave a quarter for them."""
    assert gpu_check.DEFAULT_BUDGET <= 8 * 60
    assert sum(gpu_check.SHARES.values()) <= 0.75
    assert list(gpu_check.SHARES) == list(PARTS[:-2])
    for name, seconds in gpu_check.GPU_SECONDS.items():  # each part's estimate within its time
        if name in gpu_check.SHARES:
            assert seconds <= gpu_check.SHARES[name] * gpu_check.DEFAULT_BUDGET, name


def test_started_outside_any_venv_it_runs_under_the_checkouts_venv(tmp_path, hub_1x):
    """`scripts/gpu-check` from its shebang's python3 (no virtual environment) starts itself
    again under the checkout's .venv, the README's set-up, and the summary says so."""
    copy = copy_checkout(tmp_path / "checkout")
    venv_python = lent_machine_venv(copy / ".venv", hub_1x)
    base_python = getattr(sys, "_base_executable", sys.executable)
    result = subprocess.run([base_python, str(copy / "scripts" / "gpu-check"), "--cudasim", "--parts", "versions",
                             "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"gpu-check: Python {platform_version(venv_python)} at {venv_python} (the checkout's .venv)" in result.stdout


def platform_version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()


def test_tests_that_cannot_start_are_the_checks_failure_not_the_twins(tmp_path, bare_python):
    """A conftest that cannot import (as the checkout's own minit2i/ folder once shadowed the
    import root): the part says the check could not run the tests and why, and the twin is
    INCOMPLETE, not FAILED."""
    copy = copy_checkout(tmp_path / "checkout")
    conftest = copy / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + "\nimport a_module_this_machine_lacks\n")
    result = subprocess.run([str(bare_python), str(copy / "scripts" / "gpu-check"), "--cudasim", "--parts",
                             "versions,parity-fp32", "--out", str(tmp_path / "report")],
                            capture_output=True, text=True, timeout=300)
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert result.returncode == 1
    assert summary.startswith("# gpu-check: twin INCOMPLETE;")
    assert ("* parity-fp32: could not run" in summary and "the check could not run the tests: ModuleNotFoundError: "
            "No module named 'a_module_this_machine_lacks'" in summary), summary


@pytest.mark.parametrize("output, errors", [
    ("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n", 0),
    ("========= ERROR SUMMARY: 3 errors\n", 3),
    ("========= ERROR SUMMARY: 1 error\n", 1),
    ("========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n", 0),
    ("========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n", 1),
    ("Traceback (most recent call last):\n", None),
])
def test_each_sanitizer_tools_summary_is_read(gpu_check, output, errors):
    """memcheck, synccheck and initcheck end with ERROR SUMMARY, racecheck with its own line (as
    printed on an H200: `RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)`)."""
    assert gpu_check.sanitizer_errors(output) == errors


def test_the_attention_counts_stand_beside_ncus(gpu_check):
    """Per request, cudasim's counts (at its tile shape) beside ncu's (at B/16's), and the SASS
    trip's instructions per warp and key tile beside ncu's executed instructions over B/16's 960
    warps and 20 tiles, flagged past 15 %."""
    kernel_counts = gpu_check.load_benchmark_module("kernel_counts")
    ours = {"counts": {"smsp__inst_executed_op_ldsm.sum": 10, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum": 40,
                       "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum": 0,
                       "smsp__inst_executed_op_ldgsts.sum": 5, "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": 80},
            "trip": {"total": 815}, "b16_warps": 960, "b16_tiles": 20}
    measured = {"smsp__inst_executed_op_ldsm.sum": 1000, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum": 5000,
                "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum": 1000,
                "smsp__inst_executed_op_ldgsts.sum": 100, "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": 1600,
                "smsp__inst_executed.sum": 960 * 20 * 862}
    rows = gpu_check.attention_count_rows(ours, measured, kernel_counts)
    assert "| ldmatrix wavefronts per request | 4.00 | 5.00 | 1.25 (off by more than 15 %) |" in rows
    assert "| ldmatrix excess wavefronts per request | 0.00 | 1.00 | - |" in rows
    assert "| cp.async global sectors per request | 16.00 | 16.00 | 1.00 |" in rows
    assert "| instructions per warp and key tile (SASS trip) | 815.00 | 862.00 | 1.06 |" in rows
    assert gpu_check.attention_count_rows(ours, {}, kernel_counts)[-1].endswith("| 815.00 | - | - |")  # no GPU


def test_the_sm_clock_is_sampled_while_the_benchmark_runs(gpu_check, tmp_path):
    """nvidia-smi's samples (a stand-in that prints two and waits) are read once the block ends."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 1980\necho 1965\nexec sleep 60\n")
    smi.chmod(0o755)
    with gpu_check.sm_clock_log(str(smi)) as clocks:
        time.sleep(1)
    assert clocks == [1980, 1965]
    assert gpu_check.clock_line(clocks, False) == "SM clock during the runs: 1965-1980 MHz, median 1980 (2 samples)"
    assert gpu_check.clock_line([], False).startswith("SM clock: not logged")


def test_ncu_runs_at_the_clock_and_caches_of_the_timed_runs(gpu_check):
    assert " ".join(gpu_check.NCU_CONTROL) == "--clock-control none --cache-control none"
    output = ('"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
              '"0","flash_attention_tc_bf16(const __nv_bfloat16 *)","smsp__inst_executed_op_ldsm.sum","","7,680"\n')
    assert gpu_check.ncu_metrics(output, gpu_check.COUNTED_METRICS) == {
        "flash_attention_tc_bf16": {"smsp__inst_executed_op_ldsm.sum": 7680.0}}
