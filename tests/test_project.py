"""The project as a package: a license, a changelog whose newest entry is the version pyproject names (and a
git tag for it), and no file that points outside the project's own tree."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
from conftest import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def tracked_files() -> list:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in files]


def test_license_and_its_metadata():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_the_changelog_names_this_version_first():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", changelog, re.MULTILINE)
    assert versions and versions[0] == VERSION, versions
    tags = subprocess.run(["git", "tag", "--list", "v*"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tags:
        pytest.skip("this clone carries no tags (git clone of a branch pushed without them)")
    assert all(f"v{v}" in tags for v in versions[1:]), tags  # every released version is tagged
    assert f"v{VERSION}" in tags or VERSION not in versions[1:]


def test_nothing_points_outside_the_tree():
    """A doc or a comment that names a path above the project (a shared design file, say) works in one checkout.
    (The default DVC remote, a directory next to the clone, is a setting the README tells users to change.)"""
    outside = re.compile(r"(?<![\w.])\.\./(?!(?:\.\./)?vgrpo-dvc-storage)")
    for path in tracked_files():
        if path.suffix in (".png", ".gguf", ".safetensors") or path.name == "config" and path.parent.name == ".dvc":
            continue
        text = path.read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            assert not outside.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
