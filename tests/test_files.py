"""Outputs are swapped in whole, and a resumed writer never writes through a link into DVC's cache."""

from __future__ import annotations

import os

import pytest

from vgrpo.files import atomic_dir, detach, write_json, write_jsonl


def test_atomic_dir_replaces_on_success_and_keeps_the_old_on_failure(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("interrupted")
    assert (out / "a.txt").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temp or old dir left behind


def test_json_writers(tmp_path):
    write_json(tmp_path / "m.json", {"a": 1})
    write_jsonl(tmp_path / "p.jsonl", [{"a": 1}, {"b": 2}])
    assert (tmp_path / "m.json").read_text() == '{\n  "a": 1\n}\n'
    assert (tmp_path / "p.jsonl").read_text() == '{"a": 1}\n{"b": 2}\n'


def test_detach_breaks_hard_links_and_symlinks(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "curve").write_text("step\tvalue\n1\t0.5\n")
    (cache / "summary").write_text("{}")
    out = tmp_path / "reports" / "plots"
    out.mkdir(parents=True)
    os.link(cache / "curve", out / "curve.tsv")
    (out / "summary.json").symlink_to(cache / "summary")
    detach(tmp_path / "reports")
    with (out / "curve.tsv").open("a") as f:
        f.write("2\t0.7\n")
    (out / "summary.json").write_text('{"step": 2}')
    assert (cache / "curve").read_text() == "step\tvalue\n1\t0.5\n"  # the cache is untouched
    assert (cache / "summary").read_text() == "{}"
    assert (out / "curve.tsv").read_text().endswith("2\t0.7\n") and not (out / "summary.json").is_symlink()
