"""`minit2i explore` without a browser: the command's refusals, the heat maps, and the served page
driven through Gradio's own client (the queue, bad inputs, the same pixels as `minit2i generate`)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from explore_server import (
    HAVE_GRADIO,
    NO_GRADIO,
    PROMPT,
    REQUEST_LIMIT_S,
    SEED,
    STEPS,
    free_port,
    generated_pixels,
    read_pixels,
    started,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from minit2i.cli import build_parser, main
from minit2i.demo_models import demo_model
from minit2i.core.errors import MiniT2IError
from minit2i.explore import DEFAULT_HOST, MAP_PATCH_PIXELS, Models, heat_maps, look, model_sources
from minit2i.explore_architecture import STAGE_KEYS
from minit2i.explore_tutor import Kept, KeptRuns, look_again
from minit2i.pipeline import open_model, sampling_defaults

# The page's other inputs, in the order of its generate endpoint; the demo model's guidance.
REQUEST = {"prompt": PROMPT, "model": "demo", "backend": "numpy", "seed": SEED, "steps": STEPS, "guidance": 2.0,
           "t_min": 0.2, "t_max": 0.8, "width": 64, "height": 64, "step": 3, "block": 2, "stage": "state"}

needs_gradio = pytest.mark.skipif(not HAVE_GRADIO, reason=NO_GRADIO)


def run(capsys, *args):
    code = main(["explore", *args])
    return code, capsys.readouterr().err


def test_a_server_keeps_its_sessions_runs_within_one_bound():
    """Each session kept a run of up to 256 MiB for an hour and nothing bounded them together (50
    sessions could hold over 12 GiB): keeping one more run lets go of the oldest past the bound,
    and its session is told in one line to generate again."""
    from types import SimpleNamespace

    def run():  # what a kept run's size is made of: 600 + 400 bytes
        return SimpleNamespace(states=np.zeros(600, np.uint8), x0s=np.zeros(400, np.uint8))

    runs = KeptRuns(limit=3000)
    keys = [runs.keep(run()) for _ in range(4)]
    assert [runs.get(key) is not None for key in keys] == [False, True, True, True]
    alone = KeptRuns(limit=10)
    assert alone.get(alone.keep(run())) is not None  # the newest run is kept even when it alone is over
    with pytest.raises(MiniT2IError, match=r"^there is no finished run to look at \(none yet, or the server let it "
                                           r"go to make room for other sessions' runs\); press Generate$"):
        look_again(None, Kept(key=-1), 1, 1)


def test_binds_this_machine_only_by_default():
    args = build_parser().parse_args(["explore"])
    assert (args.host, DEFAULT_HOST) == ("127.0.0.1", "127.0.0.1")


def test_without_gradio_one_line_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` raises ImportError
    code, err = run(capsys)
    assert code == 2
    assert err == 'minit2i: error: minit2i explore needs Gradio; install the extra: pip install -e ".[explore]"\n'


@needs_gradio
def test_a_host_that_is_no_address_is_one_line_saying_why(capsys):
    """--host 999.1.1.1 said "Unknown error -2" (os.strerror of the resolver's own error code)."""
    code, err = run(capsys, "--host", "999.1.1.1")
    assert code == 2
    assert err.startswith("minit2i: error: cannot serve on 999.1.1.1:7860 (") and "Unknown error" not in err
    assert err.endswith("); pass another --host\n")


@needs_gradio
def test_taken_port_is_one_line(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, err = run(capsys, "--port", str(port))
    assert code == 2
    assert err == (f"minit2i: error: cannot serve on 127.0.0.1:{port} (Address already in use); "
                   "pass another --port or --host\n")


@needs_gradio
def test_bad_start_model_is_refused_before_serving(capsys, tmp_path):
    code, err = run(capsys, "--port", str(free_port()), "--model", str(tmp_path / "missing"))
    assert code == 2
    assert err.count("\n") == 1 and "missing: no such file or folder" in err


@pytest.fixture(scope="module")
def served_on_all_addresses_then_terminated():
    """(exit status, stderr) of `minit2i explore --host 0.0.0.0` sent SIGTERM once it serves: one
    server's start (Gradio's import, about 10 s on a loaded 2-core machine) for the warning of the
    host and the way SIGTERM ends it, which does not depend on the host."""
    with started("--host", "0.0.0.0") as (server, _):
        server.terminate()
        _, err = server.communicate(timeout=60)
    return server.returncode, err


@needs_gradio
def test_sigterm_stops_the_server_with_one_line(served_on_all_addresses_then_terminated):
    """As every command: SIGTERM is `minit2i: terminated` and status 143 (Gradio's own wait would
    swallow it and exit 0)."""
    code, err = served_on_all_addresses_then_terminated
    assert code == 143 and err.endswith("minit2i: terminated\n")


@pytest.mark.parametrize(("flags", "offered"), [([], ["demo", "demo-mf"]), (["--model", "demo-mf"], ["demo-mf", "demo"])])
def test_the_demo_model_named_at_start_up_is_the_pages_first(flags, offered):
    assert list(model_sources(build_parser().parse_args(["explore", *flags]))) == offered


def test_model_given_at_start_up_is_offered_first_and_loaded_once(tiny_model):
    transformer, t5 = map(str, tiny_model)
    models = Models(model_sources(build_parser().parse_args(["explore", "--model", transformer, "--t5", t5])))
    assert list(models.sources) == [transformer, "demo", "demo-mf"]
    insides = look(models, transformer, "numpy", None, "a red cat", seed=0, steps=2, guidance_scale=3.0, width=64,
                   height=32, step=1, block=1)
    assert insides.image.shape == (32, 64, 3) and insides.words == ["a", "red", "cat"]
    assert models.pipeline(transformer, "numpy") is models.pipeline(transformer, "numpy")  # not read again


def test_heat_maps_share_one_scale_and_brighten_with_the_weight():
    attention = np.array([[[0.0, 0.1], [0.2, 0.3]], [[0.4, 0.5], [0.6, 0.6]]], dtype=np.float32)
    maps = heat_maps(attention)
    assert [m.shape for m in maps] == [(2 * MAP_PATCH_PIXELS, 2 * MAP_PATCH_PIXELS, 3)] * 2
    brightness = np.concatenate([m[::MAP_PATCH_PIXELS, ::MAP_PATCH_PIXELS].astype(int).sum(-1).ravel()
                                 for m in maps])
    assert brightness[0] == 0 and brightness[-1] == 3 * 255  # 0 black, the page's largest weight white
    assert (np.diff(brightness[:-1]) > 0).all()  # rising with the weight, across words


@pytest.fixture(scope="module")
def page():
    """(the server process, its URL, a Gradio client of it); the server's stderr is read by `terminal`."""
    pytest.importorskip("gradio", reason=NO_GRADIO)
    from gradio_client import Client

    with started() as (server, url):
        os.set_blocking(server.stderr.fileno(), False)
        yield server, url, Client(url, verbose=False)


@pytest.fixture(scope="module")
def client(page):
    return page[2]


def terminal(server) -> str:
    """What the server has written to stderr since this was last asked (its pipe is non-blocking)."""
    try:
        return os.read(server.stderr.fileno(), 2**20).decode()
    except BlockingIOError:
        return ""


def ask(client, **changes):
    """The page's outputs for REQUEST with `changes`: (status, image path, timings, x0 gallery,
    attention gallery, cond, uncond, guided)."""
    job = client.submit(*(REQUEST | changes).values(), api_name="/generate")
    return job.result(timeout=REQUEST_LIMIT_S)


def test_five_requests_at_once_queue_and_all_complete(client, tmp_path):
    """Two steps each: the queue's behaviour does not depend on the number of steps."""
    seeds = range(SEED, SEED + 5)
    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(lambda seed: ask(client, seed=seed, steps=2, step=1), seeds))
    for seed, reply in zip(seeds, replies):
        assert reply[0] == f"demo, seed {seed}: done"
        np.testing.assert_array_equal(read_pixels(reply[1]), generated_pixels(tmp_path, "demo", 2, 2.0, seed))


def test_page_shows_every_panel(client):
    """Steps are numbered from 1, as in the docs: step 3 is the third x0 of the strip, marked there
    with its t (the uniform grid's 2/6), which the line above the panels gives too."""
    (status, image, timings, x0_steps, attention, cond, uncond, guided, stage, stage_about, state, x0, velocity,
     time, runs, architecture, velocity_look) = ask(client)
    assert status == f"demo, seed {SEED}: done"
    assert timings.startswith("timings (numpy, fp32, BLAS threads 1):") and f"step {STEPS}" in timings
    assert [item["caption"] for item in x0_steps] == [
        f"\u25b6 {i}: t 0.33" if i == REQUEST["step"] else f"step {i}" for i in range(1, STEPS + 1)]
    assert time.startswith(f"**step {REQUEST['step']} of {STEPS}: t = 0.33 to 0.50**")
    assert [item["caption"].split(":")[0] for item in attention] == PROMPT.split()
    third = read_pixels(x0_steps[REQUEST["step"] - 1]["image"])
    np.testing.assert_array_equal(read_pixels(guided), third)
    np.testing.assert_array_equal(read_pixels(x0), third)
    # The velocity comes as an update of its panel, its label with it (a student's differs).
    assert velocity["label"] == "the velocity of the step"
    assert not np.array_equal(read_pixels(state), third) and not np.array_equal(read_pixels(velocity["value"]), third)
    assert read_pixels(image).shape == read_pixels(cond).shape == read_pixels(uncond).shape == (64, 64, 3)
    assert runs.startswith("sampling runs on this page: ")
    np.testing.assert_array_equal(read_pixels(stage), read_pixels(state))  # the architecture's chosen stage
    assert stage_about.startswith(f"**the state x_t step {REQUEST['step']} starts from** (step 3, block 2).")
    assert velocity_look.startswith("The direction the step moves x_t")
    # The architecture's stages, each labelled with its shape for this run (explore_architecture).
    assert [key for _, key in architecture["choices"]] == list(STAGE_KEYS)
    assert architecture["choices"][4][0] == "noisy state x_t: [1, 3, 64, 64]"


def test_compare_shows_both_settings_of_one_prompt_and_seed(client, tmp_path):
    """The left side is the form's (the demo, 6 steps), the right side the student's 4 steps: each
    picture is what `minit2i generate` draws with those settings."""
    status, label_a, image_a, steps_a, label_b, image_b, steps_b, _ = client.submit(
        *list(REQUEST.values())[:10], "demo-mf", 4, 2.0,
        api_name="/compare").result(timeout=REQUEST_LIMIT_S)
    assert status == f"seed {SEED}: both done"
    assert label_a.startswith(f"**demo**: {STEPS} steps, guidance 2") and label_b.startswith("**demo-mf**: 4 steps")
    assert (len(steps_a), len(steps_b)) == (STEPS, 4)
    np.testing.assert_array_equal(read_pixels(image_a), generated_pixels(tmp_path, "demo", STEPS, 2.0))
    np.testing.assert_array_equal(read_pixels(image_b), generated_pixels(tmp_path, "demo-mf", 4, 2.0))


def test_compare_checks_the_right_side_before_sampling_the_left(client):
    """The right side's settings were checked only after the left side had been sampled (one
    update of the page a step); now a bad right side is the first and only answer."""
    job = client.submit(*list(REQUEST.values())[:10], "demo-mf", 0, 2.0, api_name="/compare")
    status = job.result(timeout=REQUEST_LIMIT_S)[0]
    assert "must be an integer in [1, 10000], found 0" in status
    assert len(job.outputs()) == 1


def test_student_with_its_interval_draws_generates_pixels(client, tmp_path):
    t_min, t_max = sampling_defaults(open_model(*demo_model("demo-mf")[:2]))["guidance_interval"]
    status, image, *_ = ask(client, model="demo-mf", steps=4, guidance=3.0, t_min=t_min, t_max=t_max, step=1)
    assert status == f"demo-mf, seed {SEED}: done"
    np.testing.assert_array_equal(read_pixels(image), generated_pixels(tmp_path, "demo-mf", 4, 3.0))


def test_choosing_a_model_fills_in_its_settings(client):
    """The student's steps, guidance and interval, its size, and the middle step and block (from 1)."""
    defaults = sampling_defaults(open_model(*demo_model("demo-mf")[:2]))
    expected = ["", defaults["steps"], defaults["cfg_scale"], *defaults["guidance_interval"], 64, 64,
                defaults["steps"] // 2 + 1, 3]
    *settings, architecture = client.predict("demo-mf", api_name="/defaults")
    assert settings == expected and architecture["choices"][1][0].startswith("the student's prefix: [1, 20, ")
    assert client.predict("nope", api_name="/defaults")[0].startswith("**error:** unknown model 'nope'")


@pytest.mark.parametrize(("changes", "message"), [
    ({"prompt": ""}, "the prompt is empty"),
    ({"steps": 0}, "must be an integer in [1, 10000], found 0"),
    ({"width": 62}, "--width 62 is not a positive multiple of the patch size 4"),
    ({"model": "nope"}, "unknown model 'nope'; choose one of demo, demo-mf"),
    ({"step": 0}, f"step 0 is outside 1..{STEPS}"),
    ({"block": 5}, "block 5 is outside 1..4"),
    ({"stage": "nope"}, "stage 'nope' is not a stage of the model; choose one of t5, aux_tokens"),
    ({"stage": [1]}, "stage [1] is not a stage of the model"),
])
def test_bad_input_is_one_message_and_the_next_request_works(client, changes, message):
    """The next request of one step: that it runs is the point, not what it draws."""
    status = ask(client, **changes)[0]
    assert status.startswith("**error:** ") and message in status and "\n" not in status
    assert ask(client, steps=1, step=1)[0] == f"demo, seed {SEED}: done"


@pytest.mark.parametrize(("changes", "message"), [
    ({"steps": float("nan")}, "--steps (num_inference_steps) must be an integer in [1, 10000], found nan"),
    ({"seed": float("inf")}, "--seed (generator) must be an integer in [0, 9223372036854775807], found inf"),
    ({"width": "64"}, '--width must be an integer in [1, 16384], found "64" (a string)'),
    ({"height": [64]}, "--height must be an integer in [1, 16384], found [64] (a list)"),
    ({"model": ["demo"]}, "unknown model ['demo']; choose one of demo, demo-mf"),
    ({"backend": ["numpy"]}, 'unknown backend ["numpy"] (a list); choose one of numpy, cupy, cudasim'),
    ({"guidance": None}, "--cfg-scale (guidance_scale) must be a number in [-1000, 1000], found null"),
    ({"prompt": 5}, "the prompt must be a string, found int"),
    ({"step": 1.5}, f"step 1.5 is outside 1..{STEPS}"),
    ({"block": True}, "block True is outside 1..4"),
])
def test_any_value_in_any_field_is_one_line_on_the_page_and_nothing_in_the_terminal(page, changes, message):
    """The page's API is a public interface: whatever a client sends in a field is checked by the
    project's own checks (Gradio converts nothing first: NaN in an integer field used to be a bare
    "Error" on the page and a traceback in the terminal)."""
    server, url, _ = page
    event, data = call_raw(url, list((REQUEST | changes).values()))
    assert event == "complete", (event, data)
    status = data[0]
    assert status.startswith("**error:** ") and message in status and "\n" not in status, status
    assert terminal(server) == ""


def call_raw(url: str, fields: list) -> tuple[str, object]:
    """(the final event's name, its data) of the page's generate endpoint called over plain HTTP,
    as any client may: the fields as JSON, NaN and Infinity included (Gradio's client refuses to
    send them)."""
    join = urllib.request.Request(url + "gradio_api/call/generate", data=json.dumps({"data": fields}).encode(),
                                  headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(join, timeout=60) as reply:
        event_id = json.loads(reply.read())["event_id"]
    with urllib.request.urlopen(f"{url}gradio_api/call/generate/{event_id}", timeout=REQUEST_LIMIT_S) as reply:
        stream = reply.read().decode()
    events = [block.splitlines() for block in stream.strip().split("\n\n")]
    name, data = events[-1][0].removeprefix("event: "), events[-1][1].removeprefix("data: ")
    return name, json.loads(data)


def test_whole_numbers_sent_as_floats_are_taken(client):
    """JSON does not tell 6 from 6.0: a whole float in an integer field is that integer."""
    assert ask(client, steps=float(STEPS), seed=float(SEED))[0] == f"demo, seed {SEED}: done"


def test_an_unexpected_failure_is_one_line_on_the_page_and_one_in_the_terminal(capsys):
    from minit2i.explore import error_status

    status = error_status(KeyError("x\ny"))
    printed = capsys.readouterr().err
    assert status == ("**error:** the server failed on this request (KeyError: 'x\\ny'); the terminal that started "
                      "it has the same line")
    assert printed == "minit2i explore: error: a request failed (KeyError: 'x\\ny')\n"


def cpu_seconds(pid: int) -> float:
    """CPU time the process has used, all its threads, user and system (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the server's CPU time from /proc")
def test_a_cancelled_request_stops_sampling_at_its_next_step(page):
    """A request of 2,000 steps (minutes on the demo model; the most the page keeps of a 64 x 64
    run is about 2,700) cancelled once it samples: the server
    then uses next to no CPU (a step is ~0.1 s; an idle server, a few ms a second), where it
    used to sample to the end; the next request runs as usual."""
    server, _, client = page
    job = client.submit(*(REQUEST | {"steps": 2000, "step": 1}).values(), api_name="/generate")
    deadline = time.monotonic() + REQUEST_LIMIT_S
    while not (job.status().progress_data or time.monotonic() > deadline):
        time.sleep(0.2)
    assert job.status().progress_data, "the long request never started sampling"
    job.cancel()
    time.sleep(3)  # the step under way ends, and the request with it
    before = cpu_seconds(server.pid)
    time.sleep(5)
    assert cpu_seconds(server.pid) - before < 0.5
    assert ask(client)[0] == f"demo, seed {SEED}: done"


def generation_step_count_after_close(close_after: int) -> tuple[int, int]:
    """(steps run when the generator was closed, steps run 1 s later) of a 1,000-step stand-in
    for a generation (10 ms a step) run by `stepwise`."""
    from minit2i.explore import stepwise

    done = []

    def work(on_step):
        for index in range(1000):
            time.sleep(0.01)
            done.append(index)
            on_step(index)

    steps = stepwise(work)
    for _ in range(close_after):
        next(steps)
    steps.close()
    closed_at = len(done)
    time.sleep(1)
    return closed_at, len(done)


def test_closing_a_request_stops_its_work_at_the_next_step():
    closed_at, later = generation_step_count_after_close(3)
    assert later - closed_at <= 1


def test_the_page_refuses_foreign_hosts_foreign_origins_uploads_and_large_bodies(page):
    """As local notebook servers do: a request under a name that is not loopback (DNS rebinding),
    from another site's page, an upload (the page has no file input) or a body over 1 MiB is
    refused before Gradio sees it; the page itself still loads."""
    _, url, _ = page

    def status(path="", data=None, **headers):
        request = urllib.request.Request(url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    assert status()[0] == 200
    assert status(Origin=url.rstrip("/"))[0] == 200
    assert status(Host="attacker.example:7860") == (
        403, (b"this page serves this machine only, under a loopback name (localhost, 127.0.0.1), not "
              b"'attacker.example:7860'\n"))
    assert status(Origin="http://attacker.example") == (
        403, b"this page answers its own pages only, not requests from 'http://attacker.example'\n")
    upload = b'--x\r\nContent-Disposition: form-data; name="files"; filename="a.bin"\r\n\r\n' + b"0" * 1000 + b"\r\n--x--\r\n"
    assert status("gradio_api/upload", upload, **{"Content-Type": "multipart/form-data; boundary=x"}) == (
        403, b"this page takes no uploads\n")
    assert declared_body_status(url, "gradio_api/queue/join", 2**20 + 1) == 413


def declared_body_status(url: str, path: str, length: int) -> int:
    """The status of a POST declaring a body of `length` bytes, answered before the body is sent
    (the server refuses by the declared length, and a client still sending would see a broken pipe)."""
    import http.client
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        connection.putrequest("POST", "/" + path)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(length))
        connection.endheaders()
        return connection.getresponse().status
    finally:
        connection.close()


def raw_get(url: str, path: str) -> tuple[int, bytes]:
    """(status, body) of a GET of `path` sent as it is written (no client rewrites it)."""
    import http.client
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    try:
        connection.putrequest("GET", path)
        connection.endheaders()
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def assert_one_line_404(url: str, path: str) -> None:
    status, body = raw_get(url, path)
    assert status == 404 and body.count(b"\n") == 1 and body.startswith(b"no source file "), (path[:80], body[:200])


def test_code_serves_no_file_named_by_an_absolute_path(page):
    """/code//ABSOLUTE or /code/%2F... named any source file of the machine: this test file was served."""
    _, url, _ = page
    me = str(Path(__file__).resolve())
    for path in (f"/code/{me}", "/code/" + urllib.parse.quote(me, safe=""), "/code/" + me.replace("/", "//")):
        assert_one_line_404(url, path)


def test_code_serves_no_folder_of_the_checkout_outside_its_allow_list(page):
    """tests/, benchmarks/ (and every other top-level folder, untracked ones and .venv/ included:
    tests/test_code_pages.py lists them all) were served; the page a concepts link opens still is."""
    _, url, _ = page
    for path in ("/code/tests/test_explore.py", "/code/benchmarks/batch.py", "/code/core/files.py"):
        assert_one_line_404(url, path)
    status, body = raw_get(url, "/code/reference/sampler.py")
    assert status == 200 and b'id="sample"' in body


def test_odd_code_paths_are_one_line_404s_with_nothing_in_the_terminal(page, tmp_path):
    """A NUL byte, a name over 255 bytes, a link loop and 3,000 segments were each a 500 and a
    40-line traceback on the server's stderr."""
    server, url, _ = page
    terminal(server)
    loop = tmp_path / "loop.py"
    loop.symlink_to(loop)
    for path in ("/code/scripts/a%00b.py", "/code/scripts/" + "a" * 300 + ".py", f"/code/{loop}",
                 "/code/scripts/" + "a/" * 3000 + "x.py", "/code/reference/%00", "/code/%ff%fe.py"):
        assert_one_line_404(url, path)
    assert terminal(server) == ""


def page_event(url: str, session: str, elem_id: str, event: str, data: list, event_data=None) -> dict:
    """The last message of the page's `event` of its component `elem_id` (found in the page's
    config), sent over Gradio's queue as a client may, `event_data` included, in `session`; or,
    for a request refused before Gradio sees it, {"msg": "refused", "status": ..., "line": ...}."""
    with urllib.request.urlopen(url + "config", timeout=60) as reply:
        config = json.loads(reply.read())
    component = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == elem_id)
    fn_index = next(d["id"] for d in config["dependencies"] if [component, event] in d["targets"])
    body = {"data": data, "fn_index": fn_index, "trigger_id": component, "session_hash": session,
            "event_data": event_data}
    join = urllib.request.Request(url + "gradio_api/queue/join", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(join, timeout=60).close()
    except urllib.error.HTTPError as err:  # refused before Gradio sees it (page_guard)
        return {"msg": "refused", "status": err.code, "line": err.read().decode()}
    with urllib.request.urlopen(f"{url}gradio_api/queue/data?session_hash={session}", timeout=REQUEST_LIMIT_S) as reply:
        for line in reply:
            message = json.loads(line.removeprefix(b"data: ")) if line.startswith(b"data: ") else {}
            if message.get("msg") in ("process_completed", "unexpected_error", "close_stream"):
                return message
    raise AssertionError(f"the {event} event of #{elem_id} never completed")


@pytest.fixture(scope="module")
def kept_session(page):
    """A page session (its id) that generated a run of STEPS steps."""
    import uuid

    _, url, _ = page
    session = uuid.uuid4().hex
    done = page_event(url, session, "generate", "click", [*(REQUEST | {"steps": STEPS}).values(), None])
    assert done["success"] and done["output"]["data"][0] == f"demo, seed {SEED}: done", done
    return session


@pytest.mark.parametrize("index", ["2", None, [1], 2**70, 1.5, True, -1, STEPS])
def test_a_forged_strip_click_is_one_line_and_completes(page, kept_session, index):
    """A click on the x0 strip whose event data names no picture of the run (a string, null, a list,
    an integer past 64 bits, ...): the slider's check, one line in the status, where it was a
    traceback, or an answer that never came; a real click's index still moves the slider."""
    server, url, _ = page
    terminal(server)
    for event_data in ({"index": index, "value": None}, index):
        done = page_event(url, kept_session, "x0-steps", "select", [None], event_data)
        assert done["msg"] == "process_completed" and done["success"], done
        status = done["output"]["data"][0]
        assert status.startswith("**error:** step ") and f"is outside 1..{STEPS}" in status and "\n" not in status
    assert terminal(server) == ""
    done = page_event(url, kept_session, "x0-steps", "select", [None], {"index": 1, "value": None})
    assert done["success"] and done["output"]["data"][1] == 2


@pytest.mark.parametrize("steps", [True, 10**30, "6", None, [6], -1, float("nan")])
def test_a_forged_number_of_steps_leaves_the_slider_and_completes(page, kept_session, steps):
    """The steps field's change with `true` or 10^30 was a traceback or an answer that never came:
    now a value that is not a number of steps leaves the slider as it is (Generate says why)."""
    server, url, _ = page
    terminal(server)
    done = page_event(url, kept_session, "steps", "change", [steps, 2])
    assert done["msg"] == "process_completed" and done["success"], done
    assert done["output"]["data"] == [{"__type__": "update"}]
    assert terminal(server) == ""


def test_a_step_past_the_kept_run_is_for_the_next_run_and_changes_nothing(page, kept_session):
    """With the steps field at more steps than the kept run's, the slider goes past the run's last
    step: that is the run to come, not an error (the status said `step 11 is outside 1..6` while
    the next run was being set up, and a Generate pressed then looked as if it had failed); the
    run's own steps still show, and a step no run can have (0) is still the one line."""
    server, url, _ = page
    terminal(server)
    for step, status in ((STEPS + 1, {"__type__": "update"}), (10_000, {"__type__": "update"}),
                         (STEPS, f"step {STEPS}, block 1: from the finished run")):
        done = page_event(url, kept_session, "step", "change", [None, step, 1, "x0"])
        assert done["msg"] == "process_completed" and done["success"], done
        assert done["output"]["data"][0] == status, done
    done = page_event(url, kept_session, "step", "change", [None, 0, 1, "x0"])
    assert done["output"]["data"][0].startswith(f"**error:** step 0 is outside 1..{STEPS}"), done
    assert terminal(server) == ""


# Any JSON value a client may send (NaN and the infinities too: Python's JSON reads them), Gradio's
# file objects among them (a dict with a "path").
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["path", "meta", "index", "x"]) |
                                                                st.text(max_size=6), inner, max_size=3),
    max_leaves=6)
FOREIGN_FILE = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}


@settings(max_examples=25, deadline=None)
@given(event=st.sampled_from([("x0-steps", "select"), ("steps", "change"), ("step", "change"), ("block", "blur"),
                              ("architecture", "change")]),
       values=st.lists(json_values, min_size=3, max_size=3), event_data=st.one_of(
           json_values, st.dictionaries(st.sampled_from(["index", "value", "selected"]), json_values)))
def test_generated_page_events_over_http(page, kept_session, event, values, event_data):
    """The page's other events (a click on the x0 strip, the steps field, the step and block
    selectors, the architecture's stage) with any JSON as their values and event data, sent over
    Gradio's queue: each
    answer completes, with the run's values or one line in the status, and nothing in the
    server's terminal."""
    server, url, _ = page
    terminal(server)
    data = {"x0-steps": [None], "steps": values[:2]}.get(event[0], [None, *values])  # the kept run, step, block, stage
    done = page_event(url, kept_session, *event, data, event_data)
    if done["msg"] == "refused":
        assert done["status"] == 403 and done["line"].startswith("this page takes no files: ") and done[
            "line"].count("\n") == 1, done
    else:
        assert done["msg"] == "process_completed" and done["success"], done
        status = done["output"]["data"][0]
        assert isinstance(status, dict) or "\n" not in status, status  # an update of the slider, or one line
    assert terminal(server) == ""


@pytest.mark.parametrize(("elem_id", "event", "data", "event_data"), [
    ("x0-steps", "select", [None], {"index": 1, "value": FOREIGN_FILE}),
    ("x0-steps", "select", [None], {"path": "/etc/passwd"}),
    ("steps", "change", [FOREIGN_FILE, 2], None),
    ("generate", "click", [FOREIGN_FILE, *list(REQUEST.values())[1:], None], None),
])
def test_a_file_named_in_a_request_is_refused_in_one_line(page, kept_session, elem_id, event, data, event_data):
    """A file object (Gradio's, a dict with a "path") naming anything but the page's own pictures,
    in a field or in an event's data: Gradio refused it itself, with a bare "Error" on the page and
    a 20-line traceback on the server's stderr; now one line before Gradio sees it."""
    server, url, _ = page
    terminal(server)
    done = page_event(url, kept_session, elem_id, event, data, event_data)
    assert done == {"msg": "refused", "status": 403,
                    "line": "this page takes no files: the request names '/etc/passwd', none of its pictures\n"}
    assert terminal(server) == ""


def test_a_request_body_names_no_file_outside_the_pictures(tmp_path):
    from minit2i.page_guard import foreign_file

    picture = str(tmp_path / "hash" / "image.png")
    for body in ([{"path": picture}], {"a": [{"b": {"path": picture, "url": "x"}}]}, [1, "path", {"path": 5}]):
        assert foreign_file(json.dumps(body).encode(), tmp_path) is None, body
    for named in ("/etc/passwd", f"{tmp_path}/../x.png", str(tmp_path), "relative.png", f"{picture}\0"):
        assert foreign_file(json.dumps({"data": [{"path": named}]}).encode(), tmp_path) == named
    assert foreign_file(b"[" * 100_000, tmp_path) is None and foreign_file(b"\xff", tmp_path) is None


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                ("[::1]", True), ("127.1.2.3", True), ("0.0.0.0", False),
                                                ("::", False), ("192.168.1.5", False), ("example.com", False)])
def test_loopback_addresses(host, loopback):
    from minit2i.page_guard import is_loopback

    assert is_loopback(host) is loopback


@needs_gradio
def test_a_server_on_all_addresses_warns_in_one_line(served_on_all_addresses_then_terminated):
    _, err = served_on_all_addresses_then_terminated
    assert err.splitlines()[0] == ("minit2i explore: warning: --host 0.0.0.0 serves the page to other machines: "
                                   "anyone who reaches it can run prompts on this one (default 127.0.0.1: this "
                                   "machine only)")


def test_a_bad_gradio_temp_dir_names_the_variable(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "missing"))
    code, err = run(capsys, "--port", str(free_port()))
    assert code == 2
    assert err == (f"minit2i: error: GRADIO_TEMP_DIR folder {tmp_path / 'missing'} does not exist; create it or "
                   "choose another GRADIO_TEMP_DIR\n")


def test_the_pictures_folder_keeps_the_newest_within_its_limit(tmp_path):
    from minit2i.page_guard import prune

    for index in range(10):
        (tmp_path / f"hash{index}").mkdir()
        picture = tmp_path / f"hash{index}" / "image.png"
        picture.write_bytes(b"0" * 1000)
        os.utime(picture, ns=(index * 10**9, index * 10**9))
    prune(tmp_path, limit=3500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hash7", "hash8", "hash9"]


@needs_gradio  # the extra is asked for before the model flags are read
@pytest.mark.parametrize(("flags", "message"), [
    (["--jax-tree", "ema"], "--jax-tree chooses a tree of a JAX (Orbax) checkpoint, but"),
    (["--t5", "demo"], "--model is missing: pass --model (e.g. MiniT2I/MiniT2I) with --t5, or neither"),
    (["--tokenizer", "no/such/tokenizer.json"], "--tokenizer no/such/tokenizer.json: no such file or folder"),
])
def test_model_flags_are_taken_or_refused_as_generate_takes_them(capsys, flags, message):
    code, err = run(capsys, "--port", str(free_port()), "-q", *flags)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_the_served_concepts_page_carries_its_figures_and_no_dead_links():
    """The explore server shows docs/concepts.md itself: every figure inlined (it has no file route),
    links within the page pointing at headings as Gradio names them, links to source files at the
    server's own page of the file, at the definition a link names (each answered, its id on the
    page), links to the other docs pages it shows at their routes (at the heading a link names),
    links to any other page left as their text."""
    import re

    from minit2i.code_pages import CODE_ROUTE, answer
    from minit2i.explore_tutor import (SHOWN_PAGES, concepts_dir, concepts_markdown, docs_route, section_anchor,
                                       served_code)

    source = (concepts_dir() / "concepts.md").read_text()
    served = concepts_markdown()
    figures = re.findall(r"!\[[^\]]*\]\(figures/", source)
    assert len(figures) >= 6 and len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,[^"]+" '
                                                 r'width="[1-9]\d*" height="[1-9]\d*">', served)) == len(figures)
    code = [link for link in re.findall(r"(?<!!)\[[^\]]+\]\(((?!data:|#)[^)]*)\)", served)
            if link.split("#")[0] not in {docs_route(page) for page in SHOWN_PAGES}]
    assert len(code) >= 40 and all(link.startswith(f"{CODE_ROUTE}/") for link in code)
    for link in set(code):
        status, _, page = answer("/" + link.split("#")[0], served_code())
        assert status == 200, link
        if "#" in link:
            assert f'id="{link.split("#")[1]}"' in page, link
    assert "[`sample`](code/reference/sampler.py#sample)" in served
    assert "[reading guide](reading-guide)" in served and "](reading-guide.md)" not in served
    assert "[sampler.md](sampler)" in served and "(demo-model#h-watch-it-learn)" in served
    anchors = {section_anchor(heading) for heading in re.findall(r"^#+ (.*)$", source, re.MULTILINE)}
    within = re.findall(r"\]\(#([^)]*)\)", served)
    assert within and set(within) <= anchors  # "References: below" goes to the references heading


def test_a_code_page_serves_the_source_files_the_concepts_page_links():
    """/code/PATH answers a source file the concepts page links, of the repository's package
    folders (or, in a checkout, scripts/ and notebooks/); anything else, a path leaving its
    folder included, is a 404 of one line (tests/test_code_pages.py tries every kind)."""
    from minit2i.code_pages import answer
    from minit2i.explore_tutor import served_code

    status, kind, page = answer("/code/reference/sampler.py", served_code())
    assert (status, kind) == (200, "text/html; charset=utf-8") and 'id="time_grid"' in page and 'id="L1"' in page
    assert answer("/code/scripts/concept_figures.py", served_code())[0] == 200  # a checkout
    for path in ("/code/reference/../pyproject.toml", "/code/../../etc/passwd", "/code/docs/concepts.md",
                 "/code/reference/no_such.py", "/code/reference", "/code/reference/%2e%2e/core/files.py",
                 "/code/core/files.py", "/code/tests/test_explore.py"):
        status, _, body = answer(path, served_code())
        assert status == 404 and body.count("\n") == 1, path


def test_no_dollar_sign_in_the_served_concepts_pages_code():
    """Gradio's Markdown pairs every `$` of the page as a maths delimiter, code included: one `$`
    in a shell line once hid sections 4 and 5 inside a formula."""
    import re

    from minit2i.explore_tutor import concepts_markdown

    code = re.findall(r"```.*?```|`[^`\n]+`", concepts_markdown(), re.DOTALL)
    assert code and [block for block in code if "$" in block] == []


def test_every_panel_note_links_a_section_of_the_concepts_page():
    from minit2i.explore_tutor import LOOK_FOR, concepts_dir, concepts_sections, look_for

    sections = concepts_sections((concepts_dir() / "concepts.md").read_text())
    for panel, (_, section) in LOOK_FOR.items():
        assert f"(concepts#{sections[section][1]})" in look_for(panel)
    assert sections[2][1] == "h-2-why-the-network-predicts-x0-and-how-x0-becomes-a-velocity"


def test_a_regular_install_ships_the_concepts_page_and_its_figures():
    """pyproject.toml maps docs/ to minit2i.docs_data, whose package data globs match concepts.md and
    every figure it shows (a glob that missed one would leave an installed explore page without it)."""
    import fnmatch
    import re

    from minit2i.explore_tutor import concepts_dir

    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((concepts_dir().parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "minit2i.docs_data" in setup["packages"] and setup["package-dir"]["minit2i.docs_data"] == "docs"
    patterns = setup["package-data"]["minit2i.docs_data"]
    from minit2i.explore_tutor import SHOWN_PAGES

    figures = [figure for page in SHOWN_PAGES
               for figure in re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", (concepts_dir() / page).read_text())]
    for name in [*SHOWN_PAGES, *figures]:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
