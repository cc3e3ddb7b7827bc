"""The `generate` stage: Click CLI, complete outputs, same bytes twice, nothing half-written."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, load_params, stage, write_params

from vgrpo.config import config_from_dict


def small_params(tmp_path: Path) -> Path:
    raw = load_params()
    raw["generate"].update(train_size=30, val_size=10, test_size=10, ood_size=12)
    return write_params(tmp_path / "params.yaml", raw)


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_help():
    result = stage("generate", "--help")
    assert result.returncode == 0
    assert "--params" in result.stdout and "--out" in result.stdout


def test_writes_dataset_stats_and_preview(tmp_path):
    out = tmp_path / "shapes"
    result = stage("generate", "--params", str(small_params(tmp_path)), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "generate" in result.stderr  # the tqdm progress bar
    import datasets

    dataset = datasets.load_from_disk(str(out))
    assert {s: len(dataset[s]) for s in dataset} == {"train": 30, "val": 10, "test": 10, "ood": 12}
    row = dataset["train"][0]
    assert row["question"].startswith("How many ") and row["question"].endswith(" are in the image?")
    assert int(row["answer"]) == row["counts"][row["target_shape"]]
    assert row["prompt"][0]["role"] == "user" and row["question"] in row["prompt"][0]["content"]
    assert row["image"].size == (256, 256)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["labels_verified"] == 62 and stats["label_errors"] == 0
    assert sum(stats["splits"]["ood"]["answers"].values()) == 12
    assert set(stats["splits"]["ood"]["answers"]) <= {"6", "7", "8"}
    assert len(stats["fingerprint"]) == 64
    from PIL import Image

    assert Image.open(out / "preview.png").size == (4 * 256, 4 * (256 + 28))


def test_same_params_same_bytes(tmp_path):
    params = small_params(tmp_path)
    for name in ("a", "b"):
        assert stage("generate", "--params", str(params), "--out", str(tmp_path / name)).returncode == 0
    first, second = tree_digest(tmp_path / "a"), tree_digest(tmp_path / "b")
    assert first == second
    assert any(name.endswith(".arrow") for name in first)


def test_interrupted_write_keeps_the_old_dataset(tmp_path):
    """A crash while saving leaves the previous dataset as it was and no temp dir behind."""
    out = tmp_path / "shapes"
    params = small_params(tmp_path)
    assert stage("generate", "--params", str(params), "--out", str(out)).returncode == 0
    before = tree_digest(out)
    code = f"""
import datasets, sys
from vgrpo import shapes
from vgrpo.config import load_config
import os
def crash(self, path, *a, **k):  # dies half-way through writing
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, "partial.arrow"), "w").write("x")
    raise KeyboardInterrupt
datasets.DatasetDict.save_to_disk = crash
config = load_config({str(params)!r}).generate
samples = shapes.generate_samples(config)
shapes.write_dataset(samples, config, {str(out)!r})
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode != 0 and "KeyboardInterrupt" in result.stderr
    assert tree_digest(out) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".shapes")] == []


def test_missing_dataset_is_one_line(tmp_path):
    import pytest

    from vgrpo.config import VgrpoError
    from vgrpo.shapes import load_dataset

    with pytest.raises(VgrpoError, match=r"no dataset here \(run the generate stage"):
        load_dataset(tmp_path / "nothing")


def test_full_profile_sizes():
    g = config_from_dict(load_params()).generate
    assert (g.train_size, g.val_size, g.test_size, g.ood_size) >= (500, 100, 100, 100)
