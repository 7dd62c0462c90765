"""The sentences of docs/concepts.md that state a measured number or a property of a figure,
recomputed from the project's own functions, so that a sentence the code stops bearing out fails.

Each test reads the sentence off the page (a regular expression over its words) and computes the
number or property it states: the RoPE frequencies, the student's text positions, the attention
weights behind the joint-RoPE figure, what guidance 0 draws for one seed, the attention
exercise's word tokens, and the images `learn --eval-prompts 8` reads back.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import numpy as np
import pytest

from minit2i.core.mean_flow_config import aux_token_groups
from minit2i.core.mmjit_config import MMJIT_B16
from minit2i.insides import block_rope, look_inside
from minit2i.pipeline import load_model
from minit2i.reference.layers import image_rope_angles, text_rope_angles

ROOT = Path(__file__).resolve().parent.parent
CONCEPTS = ROOT / "docs" / "concepts.md"


def page() -> str:
    """The concepts page with its line breaks as spaces, so a sentence reads as one line."""
    return re.sub(r"\s+", " ", CONCEPTS.read_text())


@pytest.mark.parametrize("head_dim", [load_model("demo").mmjit.config.head_dim, MMJIT_B16.head_dim])
def test_text_and_patch_frequencies_agree_on_pair_0_only(head_dim):
    """f_j = 10000^(-2j/Dh) (text) and g_k = 10000^(-4k/Dh) (patches, either axis): f_0 = g_0 = 1,
    and for every j > 0, f_j != g_j (g_j = f_j^2) and f_{j + Dh/4} = f_j / 100 != g_j. Exact in
    float64 up to the rounding of one power (1e-15 relative)."""
    f = text_rope_angles(2, head_dim)[1]  # position 1: the angles are the frequencies
    g = image_rope_angles(2, 1, head_dim)[1, :head_dim // 4]  # row 1, column 0: the row half
    quarter = head_dim // 4
    assert f[0] == g[0] == 1
    np.testing.assert_allclose(g, f[:quarter] ** 2, rtol=1e-15)
    np.testing.assert_allclose(f[quarter:], f[:quarter] / 100, rtol=1e-15)
    assert np.all(np.abs(f[1:quarter] - g[1:]) > 1e-3 * g[1:])
    assert np.all(np.abs(f[quarter:] - g) > 1e-3 * g)
    assert "Only pair 0 has $f_0 = g_0 = 1$ and turns by the offset $l - r$" in page()


def test_the_students_words_sit_at_20_to_l_plus_19_behind_an_unrotated_prefix():
    """The student's double-block RoPE (the tables its forward hands the blocks): its A = 20
    prefix rows at angle 0, word l at text position A + l, patch (r, c) at rows r and c from 0."""
    config = load_model("demo-mf").mmjit.config
    prefix = sum(count for _, count in aux_token_groups(config))
    length, grid = config.prompt_length, config.image_size // config.patch_size
    cos, sin = block_rope(config, prefix + length, grid, grid, np.float64)
    assert prefix == 20
    np.testing.assert_array_equal(cos[:prefix], 1)
    np.testing.assert_array_equal(sin[:prefix], 0)
    words = text_rope_angles(prefix + length, config.head_dim)[prefix:]
    np.testing.assert_allclose(np.arccos(np.clip(cos[prefix:prefix + length], -1, 1)),
                               np.abs(np.angle(np.exp(1j * words))), atol=1e-7)
    assert words[0, 0] == prefix and words[-1, 0] == length + prefix - 1  # pair 0 turns by the position
    np.testing.assert_array_equal(cos[prefix + length:], np.cos(image_rope_angles(grid, grid, config.head_dim)))
    assert "its words take the text positions $20, \\dots, L + 19$, behind a prefix that carries no position" in page()


@pytest.fixture(scope="module")
def concept_figures():
    pytest.importorskip("matplotlib", reason="the figure script needs the [docs] extra")
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        return importlib.import_module("concept_figures")
    finally:
        sys.path.remove(str(ROOT / "scripts"))


def test_the_joint_rope_figures_weights_on_red_pick_out_the_disc_only_with_rope(concept_figures):
    """The page's numbers of the figure's two right maps: the softmax weights on "red" are 3.5
    times larger on the disc than off it with RoPE (all 20 largest on it), 1.1 times without (1
    of 20); both rounded as the page rounds them."""
    with_rope, without, disc = concept_figures.text_patch_weights()
    contrast = [concept_figures.shape_contrast(weights, disc) for weights in (with_rope, without)]
    on_disc = [int(disc.ravel()[np.argsort(weights.ravel())[-20:]].sum()) for weights in (with_rope, without)]
    assert (int(disc.sum()), f"{contrast[0]:.1f}", on_disc[0], f"{contrast[1]:.1f}", on_disc[1]) == (
        32, "3.5", 20, "1.1", 1)
    assert ('pick out the disc, on average 3.5 times larger on the disc\'s 32 patches than off them, and all 20 '
            'largest on it; recomputed with every rotation removed they lose it (1.1 times, 1 of the 20 largest '
            'on the disc)') in page()


def test_guidance_0_with_one_seed_draws_one_picture_so_3_of_24_is_who_asked_for_purple():
    """`evaluate --cfg-scale 0 --prompts 16 --seeds 1`: the prompt is dropped and every scene has
    seed 0, so two different prompts draw the same pixels; its 24 scenes' colour count is the
    number that ask for the colour of that one picture: 3, purple; gray 6, centre 6."""
    from minit2i.training.evaluate import accuracy_report, classify, evaluation_scenes, generate_scenes

    scenes = evaluation_scenes(16, 1)
    first, second = generate_scenes(scenes[:2], "demo", settings={"cfg_scale": 0.0})
    np.testing.assert_array_equal(first, second)
    assert scenes[0][0].colour != scenes[1][0].colour
    read = classify(first)
    report = accuracy_report(scenes, [first] * len(scenes))
    right = {a: round(sum(report[g][a] * report["counts"][g] for g in ("held_in", "held_out")))
             for a in ("colour", "background", "position")}
    assert len(scenes) == 24 and right == {"colour": 3, "background": 6, "position": 6}
    assert right["colour"] == sum(scene.colour == read["colour"] for scene, _, _ in scenes)
    assert (read["colour"], read["background"], read["position"]) == ("purple", "gray", "center")
    assert ("all 24 images are one picture: a large purple circle at the centre on a gray background" in page()
            and "3 ask for purple, 6 for a gray background (19 % and 38 %) and 6 for the centre" in page())


def test_the_attention_exercise_counts_eleven_word_tokens_and_its_shares_add_up():
    """The exercise's look at step 11, block 3: 11 word tokens, "a" twice; the shares the answer
    quotes are the printed ones, the rounded ones add to 0.197 and the unrounded to 0.196."""
    model = load_model("demo")
    inside = look_inside(model, "a large red circle at the left on a gray background", seed=1, steps=20,
                         guidance_scale=2.0, width=64, height=64, step=10, block=2)
    shares = [round(float(s), 3) for s in inside.attention.mean(axis=(1, 2))]
    assert len(inside.words) == 11 and inside.words.count("a") == 2
    assert round(sum(shares), 3) == 0.197 and round(float(inside.attention.mean(axis=(1, 2)).sum()), 3) == 0.196
    by_word = dict(zip(inside.words[::-1], shares[::-1]))  # the first "a" last: it is the one named "the first"
    text = page()
    assert "the eleven word tokens of the prompt" in text and "0.196: a fifth, against 11 word tokens" in text
    for word in ("background", "gray", "on", "red"):
        assert f'"{word}" ({by_word[word]:.3f})' in text or f'"{word}" gets {by_word[word]:.3f}' in text
    assert f'the second "a" ({shares[8]:.3f}, the first {shares[0]:.3f})' in text
    assert "`step=10, block=2`" in text and "counts steps and blocks from 0" in text


def test_eval_prompts_8_reads_back_12_images():
    """`learn --eval-prompts 8` reads 8 held-in prompts and 4 held-out ones: its table's "(right of 12)"."""
    pytest.importorskip("torch", reason="learn needs the [train] extra")
    from minit2i.training.evaluate import evaluation_scenes
    from minit2i.training.learn import score_table

    scenes = evaluation_scenes(8, 1)
    assert (len(scenes), sum(held_out for _, _, held_out in scenes)) == (12, 4)
    report = {"counts": {"held_in": 8, "held_out": 4}}
    assert score_table({0: report}, {}).splitlines()[0].endswith("(right of 12)")
    assert "`--eval-prompts 8` draws 8 held-in prompts and half as many held-out ones, 12 images" in page()


def test_no_self_check_says_guidance_pushes_away_from_noise():
    """Guidance extrapolates from the unconditional prediction, a picture (the blur of every picture,
    or an arbitrary one without dropped captions), never from noise."""
    assert "away from noise" not in page()



def test_every_folded_answer_is_a_block_a_file_viewer_renders_under_its_question():
    """Read as a file (GitHub renders CommonMark), a fold's text shows only if `<details>` and
    `<summary>` open an HTML block of their own, a blank line then returns to Markdown, and
    `</details>` stands alone before a blank line; an exercise's answer follows its command's fence."""
    text = CONCEPTS.read_text()
    folds = list(re.finditer(r"(?<=\n\n)<details markdown=\"1\">\n<summary>[^\n]*</summary>\n\n"
                             r"(?P<body>(?:(?!<details).)*?)\n</details>(?=\n\n)", text, re.S))
    assert len(folds) == text.count("<details") == text.count("</details>") >= 20
    for fold in folds:
        assert fold["body"].strip() and "<summary>" not in fold["body"], fold["body"][:80]
    answers = re.findall(r"([^\n]*)\n\n<details markdown=\"1\">\n<summary>What it prints", text)
    assert answers and all(line == "```" for line in answers)
