"""`minit2i explore` without a browser: the command's refusals, the heat maps, and the served page
driven through Gradio's own client (the queue, bad inputs, the same pixels as `minit2i generate`)."""

from __future__ import annotations

import socket
import sys
from concurrent.futures import ThreadPoolExecutor

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
    serving,
    started,
)

from minit2i.cli import build_parser, main
from minit2i.demo_models import demo_model
from minit2i.explore import DEFAULT_HOST, MAP_PATCH_PIXELS, Models, heat_maps, look, model_sources
from minit2i.pipeline import open_model, sampling_defaults

# The page's other inputs, in the order of its generate endpoint; the demo model's guidance.
REQUEST = {"prompt": PROMPT, "model": "demo", "backend": "numpy", "seed": SEED, "steps": STEPS, "guidance": 2.0,
           "t_min": 0.2, "t_max": 0.8, "width": 64, "height": 64, "step": 3, "block": 2}

needs_gradio = pytest.mark.skipif(not HAVE_GRADIO, reason=NO_GRADIO)


def run(capsys, *args):
    code = main(["explore", *args])
    return code, capsys.readouterr().err


def test_binds_this_machine_only_by_default():
    args = build_parser().parse_args(["explore"])
    assert (args.host, DEFAULT_HOST) == ("127.0.0.1", "127.0.0.1")


def test_without_gradio_one_line_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gradio", None)  # `import gradio` raises ImportError
    code, err = run(capsys)
    assert code == 2
    assert err == 'minit2i: error: minit2i explore needs Gradio; install the extra: pip install -e ".[explore]"\n'


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


@needs_gradio
def test_sigterm_stops_the_server_with_one_line():
    """As every command: SIGTERM is `minit2i: terminated` and status 143 (Gradio's own wait would
    swallow it and exit 0)."""
    with started() as (server, _):
        server.terminate()
        _, err = server.communicate(timeout=60)
    assert server.returncode == 143 and err.endswith("minit2i: terminated\n")


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
def client():
    pytest.importorskip("gradio", reason=NO_GRADIO)
    from gradio_client import Client

    with serving() as url:
        yield Client(url, verbose=False)


def ask(client, **changes):
    """The page's outputs for REQUEST with `changes`: (status, image path, timings, x0 gallery,
    attention gallery, cond, uncond, guided)."""
    job = client.submit(*(REQUEST | changes).values(), api_name="/generate")
    return job.result(timeout=REQUEST_LIMIT_S)


def test_five_requests_at_once_queue_and_all_complete(client, tmp_path):
    seeds = range(SEED, SEED + 5)
    with ThreadPoolExecutor(5) as pool:
        replies = list(pool.map(lambda seed: ask(client, seed=seed), seeds))
    for seed, reply in zip(seeds, replies):
        assert reply[0] == f"demo, seed {seed}: done"
        np.testing.assert_array_equal(read_pixels(reply[1]), generated_pixels(tmp_path, "demo", STEPS, 2.0, seed))


def test_page_shows_every_panel(client):
    """Steps are numbered from 1, as in the docs: step 3 is the third x0 of the strip."""
    status, image, timings, x0_steps, attention, cond, uncond, guided, state, x0, velocity, runs = ask(client)
    assert status == f"demo, seed {SEED}: done"
    assert timings.startswith("timings (numpy, fp32, BLAS threads 1):") and f"step {STEPS}" in timings
    assert [item["caption"] for item in x0_steps] == [f"step {i}" for i in range(1, STEPS + 1)]
    assert [item["caption"].split(":")[0] for item in attention] == PROMPT.split()
    third = read_pixels(x0_steps[REQUEST["step"] - 1]["image"])
    np.testing.assert_array_equal(read_pixels(guided), third)
    np.testing.assert_array_equal(read_pixels(x0), third)
    assert not np.array_equal(read_pixels(state), third) and not np.array_equal(read_pixels(velocity), third)
    assert read_pixels(image).shape == read_pixels(cond).shape == read_pixels(uncond).shape == (64, 64, 3)
    assert runs.startswith("sampling runs on this page: ")


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
    assert list(client.predict("demo-mf", api_name="/defaults")) == expected
    assert client.predict("nope", api_name="/defaults")[0].startswith("**error:** unknown model 'nope'")


@pytest.mark.parametrize(("changes", "message"), [
    ({"prompt": ""}, "the prompt is empty"),
    ({"steps": 0}, "must be an integer in [1, 10000], found 0"),
    ({"width": 62}, "--width 62 is not a positive multiple of the patch size 4"),
    ({"model": "nope"}, "unknown model 'nope'; choose one of demo, demo-mf"),
    ({"step": 0}, f"step 0 is outside 1..{STEPS}"),
    ({"block": 5}, "block 5 is outside 1..4"),
])
def test_bad_input_is_one_message_and_the_next_request_works(client, changes, message):
    status = ask(client, **changes)[0]
    assert status.startswith("**error:** ") and message in status and "\n" not in status
    assert ask(client)[0] == f"demo, seed {SEED}: done"


def test_the_served_concepts_page_carries_its_figures_and_no_dead_links():
    """The explore server shows docs/concepts.md itself: every figure inlined (it has no file route),
    links to other pages of the docs left as their text (those pages are the docs site's)."""
    import re

    from minit2i.explore_tutor import concepts_dir, concepts_markdown

    source = (concepts_dir() / "concepts.md").read_text()
    served = concepts_markdown()
    figures = re.findall(r"!\[[^\]]*\]\(figures/", source)
    assert len(figures) >= 6 and served.count("](data:image/png;base64,") == len(figures)
    assert re.findall(r"(?<!!)\[[^\]]+\]\((?!data:)[^)]*\)", served) == []
    assert "[`sample`](" not in served and "`sample`" in served


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
    figures = re.findall(r"!\[[^\]]*\]\((figures/[^)]+)\)", (concepts_dir() / "concepts.md").read_text())
    for name in ["concepts.md", *figures]:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
