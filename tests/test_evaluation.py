"""The demo data set and the checker that judges the demo models (training/shapes.py,
training/evaluate.py): plain NumPy, so they run without the [train] extra."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from PIL import Image

from minit2i.training import shapes
from minit2i.training.evaluate import ATTRIBUTES, accuracy_report, classify, evaluation_scenes, misread, misread_line

# ---------------------------------------------------------------------------------------------
# Data set


@pytest.mark.parametrize("shape, area", [
    ("square", 16 * 16),
    ("cross", 2 * 16 * 6 - 6 * 6),  # two 16 x 6 bars (arm 16/3 -> 6 pixel centres) sharing a 6 x 6 centre
    ("triangle", 128),  # rows of 0, 2, 2, 4, 4, ..., 14, 14, 16 pixels: the apex row holds no pixel centre
])
def test_rendered_areas_are_exact(shape, area):
    assert shapes.render_mask(shape, 16, (32, 32)).sum() == area


def test_circle_area_is_close_to_pi_r_squared():
    # the pixel-centre count of a radius-14 disc differs from pi r^2 by a boundary term O(r)
    assert abs(shapes.render_mask("circle", 28, (32, 32)).sum() - np.pi * 14**2) < 2 * np.pi * 14


@pytest.mark.parametrize("shape", shapes.SHAPES)
@pytest.mark.parametrize("size", shapes.SIZES.values())
def test_every_shape_fills_its_bounding_box(shape, size):
    """Exactly `size` pixels wide and tall, except the triangle, whose apex row is empty."""
    ys, xs = np.nonzero(shapes.render_mask(shape, size, (16, 48)))
    top = 48 - size // 2 + (shape == "triangle")
    assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (16 - size // 2, 16 + size // 2, top, 48 + size // 2)


def test_held_out_pairs_never_appear_in_training_batches():
    rng = np.random.default_rng(0)
    for _ in range(20):
        _, captions = shapes.random_batch(rng, 64)
        for caption in captions:
            words = caption.split()
            assert not any(c in words and s in words for c, s in shapes.HELD_OUT), caption


def test_short_captions_leave_out_phrases():
    _, captions = shapes.random_batch(np.random.default_rng(1), 400)
    assert any(c.count(" ") == 2 for c in captions)  # "a red circle"
    assert any(c.endswith("background") for c in captions)
    assert all(set(c.split()) <= set(shapes.vocabulary()) for c in captions)


def test_pixels_round_trip_through_the_model_range():
    from minit2i.core.images import to_pixels

    pixels = np.random.default_rng(2).integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    np.testing.assert_array_equal(to_pixels(shapes.to_model_range(pixels)), pixels)


# ---------------------------------------------------------------------------------------------
# Checker


def test_checker_reads_back_every_rendered_scene():
    scenes = shapes.all_scenes() + shapes.all_scenes(held_out=True)
    assert len(scenes) == 2 * 8 * 4 * 5 * 4 - 2 * 4 * 5  # white shapes on white are left out
    wrong = [s for s in scenes if classify(shapes.render(s)) != {a: getattr(s, a) for a in ATTRIBUTES}]
    assert wrong == []


@pytest.mark.parametrize("scene", [
    shapes.Scene("large", "yellow", "square", "right", "black"),
    shapes.Scene("large", "orange", "circle", "top", "white"),
    shapes.Scene("small", "blue", "cross", "bottom", "gray"),
    shapes.Scene("small", "red", "triangle", "left", "navy"),
])
def test_stray_pixels_off_a_corner_do_not_change_the_shape_read(scene):
    """Two shape-coloured pixels two pixels outside opposite corners of the bounding box (as a
    drawn square's fringe can put them) widen the box by 4; the shape is still read right, and
    a bounding-box reading alone would read the square as a circle."""
    image = shapes.render(scene)
    ys, xs = np.nonzero(shapes.render_mask(scene.shape, shapes.SIZES[scene.size], shapes.POSITIONS[scene.position]))
    image[ys.min() - 2, xs.min() - 2] = image[ys.max() + 2, xs.max() + 2] = shapes.COLOURS[scene.colour]
    assert classify(image)["shape"] == scene.shape
    if scene.shape == "square":
        mask = (image != image[0, 0]).any(axis=-1)
        wide = (ys.max() - ys.min() + 1) + 4
        iou = {shape: (lambda c: (c & mask).sum() / (c | mask).sum())(
            shapes.render_mask(shape, wide, shapes.POSITIONS[scene.position])) for shape in ("square", "circle")}
        assert iou["circle"] > iou["square"]


def test_checker_reports_no_shape_on_a_plain_image():
    blank = np.full((64, 64, 3), 128, dtype=np.uint8)
    assert classify(blank) == {"background": "gray", "colour": None, "position": None, "size": None, "shape": None}


def test_accuracy_report_counts_groups_separately():
    scenes = evaluation_scenes(4, seeds=2)
    assert sum(held_out for _, _, held_out in scenes) == 2 * 2
    pixels = [shapes.render(scene) for scene, _, _ in scenes]
    pixels[0] = np.full_like(pixels[0], 15)  # a black image: only a black background can be right
    report = accuracy_report(scenes, pixels)
    assert report["counts"] == {"held_in": 8, "held_out": 4}
    assert report["held_out"] == dict.fromkeys(ATTRIBUTES, 1.0)
    assert report["held_in"]["shape"] == 7 / 8
    assert sum(report["shapes"][scenes[0][0].shape].values()) >= 1
    assert sum(sum(row.values()) for row in report["shapes"].values()) == 12
    assert "None" in [k for row in report["shapes"].values() for k in row]  # the black image


def test_misread_lists_exactly_the_images_read_wrong():
    scenes = evaluation_scenes(4, seeds=2)
    pixels = [shapes.render(scene) for scene, _, _ in scenes]
    square = next(s for s, _, _ in scenes if s.shape != "square")
    wrong_shape = scenes.index(next(x for x in scenes if x[0] == square))
    pixels[wrong_shape] = shapes.render(dataclasses.replace(square, shape="square"))
    pixels[5] = np.full_like(pixels[5], 15)
    found = misread(scenes, pixels)
    assert [i for i, _ in found] == sorted({wrong_shape, 5})
    line = misread_line(scenes[wrong_shape], dict(found)[wrong_shape])
    assert line == f"{square.caption()} (seed {scenes[wrong_shape][1]}): shape read as square"


def test_evaluate_lists_and_tiles_the_misread_images(tmp_path, capsys, monkeypatch):
    """With the renderer standing in for the model and one image replaced by a plain one, the
    command names that image and tiles exactly it, framed: (64 + 4) pixels a side."""
    from minit2i.training import evaluate

    def drawn(scenes, *args):
        pixels = [shapes.render(scene) for scene, _, _ in scenes]
        pixels[1] = np.full_like(pixels[1], 128)
        return pixels

    monkeypatch.setattr(evaluate, "generate_scenes", drawn)
    sheet = tmp_path / "misread.png"
    assert evaluate.main(["--prompts", "2", "--seeds", "1", "--failures", str(sheet)]) == 0
    out = capsys.readouterr().out
    scene = evaluation_scenes(2, 1)[1][0]
    assert f"1 of 3 images read wrong:\n{scene.caption()} (seed 0): " in out
    tiles = np.asarray(Image.open(sheet))
    assert tiles.shape == (68, 68, 3) and (tiles[2:-2, 2:-2] == 128).all() and (tiles[:2] == 128).all()


def test_short_prompts_score_only_colour_and_shape(capsys, monkeypatch):
    """--short asks for "a {colour} {shape}" and scores those two alone: images with the right
    colour and shape but another background, size and position are all right; one with the
    wrong shape is the one image read wrong, named by its short prompt."""
    from minit2i.training import evaluate

    asked = []

    def drawn(scenes, model, t5, settings, short):
        asked.extend(evaluate.prompt(scene, short) for scene, _, _ in scenes)
        others = [dataclasses.replace(scene, background="gray" if scene.colour != "white" else "navy",
                                      size="large" if scene.size == "small" else "small", position="top")
                  for scene, _, _ in scenes]
        others[1] = dataclasses.replace(others[1], shape="triangle" if others[1].shape != "triangle" else "cross")
        return [shapes.render(scene) for scene in others]

    monkeypatch.setattr(evaluate, "generate_scenes", drawn)
    assert evaluate.main(["--prompts", "2", "--seeds", "1", "--short"]) == 0
    out = capsys.readouterr().out
    scenes = evaluation_scenes(2, 1)
    assert asked == [f"a {s.colour} {s.shape}" for s, _, _ in scenes]
    assert out.startswith("| prompts | images | colour | shape |\n") and "background error" not in out
    assert "| held-out pairs | 1 | 100% | 100% |" in out and "| held-in | 2 | 100% | 50% |" in out
    assert f"1 of 3 images read wrong:\n{asked[1]} (seed 0): shape read as " in out


@pytest.mark.parametrize("argv, words", [
    (["--prompts", "0"], "--prompts must be an integer in [1, 10000], found 0"),
    (["--steps", "0"], "--steps must be an integer in [1, 10000], found 0"),
    (["--cfg-scale", "nan"], "--cfg-scale"),
    (["--model", "{tmp}/nowhere"], "--model"),
    (["--json", "{tmp}/no/such/folder/report.json"], "--json folder"),
    (["--json", "{tmp}"], "is a folder"),
    (["--json", "{tmp}/" + "r" * 250 + ".json"], "limit on file names"),
    (["--failures", "{tmp}/misread.jpg"], "--failures {tmp}/misread.jpg must end in .png"),
    (["--failures", "{tmp}/no/such/folder/misread.png"], "--failures folder"),
])
def test_bad_evaluation_arguments_are_one_line_before_any_work(argv, words, tmp_path, capsys, monkeypatch):
    from minit2i.training import evaluate

    monkeypatch.setattr(evaluate, "generate_scenes", lambda *a: pytest.fail("images were generated"))
    assert evaluate.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evaluate: error:") and err.count("\n") == 1 and words.format(tmp=tmp_path) in err, err
    assert sorted(tmp_path.iterdir()) == []
