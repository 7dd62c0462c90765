"""`minit2i batch FOLDER`: a folder of prompts as DPG-Bench ships its `prompts/` (one `.txt` a
prompt, the file's stem the item id), drawn and exported as DPG-Bench reads it back.

DPG-Bench's side is reproduced from its published repository, TencentQQGYLab/ELLA at commit
025f650e9b36b9603d606042635d98da09e870de: README.md ("Generate your images according to our
prompts ... Please make sure your generated image's filename is the same with the prompt's
filename") and dpg_bench/compute_dpg_bench.py, which lists the image folder (`os.listdir`), looks
each file's item up by `osp.basename(image_path).split('.')[0]`, and crops the four samples of a
2 x 2 grid at (0, 0, r, r), (r, 0, 2r, r), (0, r, r, 2r), (r, r, 2r, 2r), r the resolution given.
"""

from __future__ import annotations

import json
import os
import os.path as osp

import numpy as np
import pytest
from PIL import Image

from minit2i.batch.store import image_path
from test_bad_inputs import assert_one_line_error
from test_batch import batch

SIZE = 64  # the demo model's images
ITEMS = {"1": "a large red circle at the left on a gray background\n", "256": "  a small blue square at the top ",
         "partiprompts12": "a green triangle"}


def write_folder(folder, items: dict[str, str | bytes]):
    folder.mkdir()
    for stem, text in items.items():
        (folder / f"{stem}.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


def dpg_bench_prompts(folder) -> dict[str, str]:
    """DPG-Bench's prompts: {item id: prompt}, the id the file name without .txt (its README)."""
    return {name[:-len(".txt")]: open(osp.join(folder, name)).read() for name in os.listdir(folder)}


def dpg_bench_grids(image_root: str, item_ids, resolution: int) -> dict[str, list[np.ndarray]]:
    """What compute_dpg_bench.py scores: for each file it lists, the item its name names (an item
    missing from its question table fails that file, as `value['qid2tuple']` on None does) and the
    four crops of the grid."""
    crops = [(0, 0, resolution, resolution), (resolution, 0, resolution * 2, resolution),
             (0, resolution, resolution, resolution * 2), (resolution, resolution, resolution * 2, resolution * 2)]
    scored = {}
    for fn in os.listdir(image_root):
        image_path = osp.join(image_root, fn)
        key = osp.basename(image_path).split('.')[0]
        assert key in item_ids, f"DPG-Bench finds no item {key!r} for {fn}"
        grid = Image.open(image_path)
        scored[key] = [np.asarray(grid.crop(box)) for box in crops]
    return scored


def test_dpg_benchs_folder_drawn_as_shipped_is_read_back_by_its_own_scorer(tmp_path):
    """The folder as a prompt file (item ids the stems, in the order of the names), drawn in
    groups of 4, exported as grids: DPG-Bench's scorer finds every item once, each crop the image
    k of that item's prompt, and each prompt the text of its file."""
    folder = write_folder(tmp_path / "prompts", ITEMS)
    out = tmp_path / "run"
    code, stdout, err = batch(folder, "--out", out, "-n", "4", "--batch-size", "4", "--export", "dpg")
    assert code == 0, err
    metadata = [json.loads((out / f"{index:05d}/metadata.jsonl").read_text()) for index in range(3)]
    assert [entry["id"] for entry in metadata] == ["1", "256", "partiprompts12"]
    prompts = dpg_bench_prompts(folder)
    assert {entry["id"]: entry["prompt"] for entry in metadata} == {stem: text.strip()
                                                                     for stem, text in prompts.items()}
    scored = dpg_bench_grids(str(out / "dpg"), set(prompts), SIZE)
    assert sorted(scored) == sorted(prompts)
    for index, entry in enumerate(metadata):
        for k, crop in enumerate(scored[entry["id"]]):
            assert np.array_equal(crop, np.asarray(Image.open(out / image_path(index, k)))), (entry["id"], k)
    assert stdout.splitlines()[-1].endswith("dpg: 3 images")


def test_a_changed_prompt_folder_is_refused_as_a_changed_prompt_file(tmp_path):
    folder = write_folder(tmp_path / "prompts", {"1": "a red circle"})
    code, _, err = batch(folder, "--out", tmp_path / "run")
    assert code == 0, err
    (folder / "1.txt").write_text("a blue circle")
    assert_one_line_error(*batch(folder, "--out", tmp_path / "run"), "prompts.sha256")


def fifo(folder):
    os.mkfifo(folder / "f.txt")


def link(folder):
    (folder / "l.txt").symlink_to(folder / "1.txt")


@pytest.mark.parametrize("make, words", [
    (lambda folder: None, "is empty"),
    (lambda folder: (folder / "notes.json").write_text("{}"), "'notes.json', not a .txt file"),
    (lambda folder: (folder / "x.txt").mkdir(), "'x.txt', a folder"),
    (link, "'l.txt', a symbolic link"),
    (fifo, "'f.txt', a FIFO"),
    (lambda folder: (folder / "A.txt").write_text("a red square"), "A.txt and a.txt, which differ only in case"),
    (lambda folder: (folder / "e.txt").write_text(" \n"), "e.txt is empty"),
    (lambda folder: (folder / "b.txt").write_bytes(b"a red \xff circle"), "is not UTF-8 text (byte 0xff at offset 6)"),
    (lambda folder: (folder / "a.b.txt").write_text("a red square"), "'a.b.txt', whose name is not an item id"),
    (lambda folder: (folder / "big.txt").write_text("a " * 2**19), "more than the"),
], ids=["empty", "another kind of file", "a folder", "a link", "a FIFO", "stems differing in case", "an empty file",
        "not UTF-8", "a dot in the stem", "a file too large"])
def test_a_bad_prompt_folder_is_one_line_and_nothing_is_created(tmp_path, make, words):
    folder = tmp_path / "prompts"
    folder.mkdir()
    if words != "is empty":
        (folder / "1.txt").write_text("a red circle")
        (folder / "a.txt").write_text("a blue circle")
    make(folder)
    assert_one_line_error(*batch(folder, "--out", tmp_path / "run"), words)
    assert not (tmp_path / "run").exists()
