"""The fast tier a developer runs between edits, `.venv/bin/python -m pytest -q -m "not slow"`: the tests
marked slow (pipeline runs, GRPO that learns, DeepSpeed, the remote, exports and llama.cpp runs) are left
out, and what is left still touches every library module and every stage script. The README gives its
time; the README's test command (and CI) runs everything."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import ROOT
from test_dvc_pipeline import library_modules

FAST_TIER = '.venv/bin/python -m pytest -q -m "not slow"'


def fast_tier_files() -> set[str]:
    """The test files with at least one test in the fast tier (pytest's own selection)."""
    argv = [sys.executable, *shlex.split(FAST_TIER)[1:], "--collect-only", "-p", "no:cacheprovider"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600).stdout
    return {line.split("::")[0] for line in out.splitlines() if "::" in line}


STAGES = sorted(p.stem for p in (ROOT / "stages").glob("*.py"))


def touched(test_file: str) -> set[str]:
    """The vgrpo modules a test file imports (at any depth), and the stage scripts it runs through
    conftest's `stage(name, ...)` (a literal name, or a name from a literal list it loops over) with the
    modules they import."""
    path = ROOT / test_file
    modules = library_modules(path)
    tree = ast.parse(path.read_text())
    runs_stages = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "stage" for n in ast.walk(tree))
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in STAGES}
    names = names if runs_stages else set()
    for name in names:
        modules |= library_modules(ROOT / "stages" / f"{name}.py") | {f"stages/{name}.py"}
    return modules


@pytest.mark.slow
def test_the_fast_tier_leaves_out_the_slow_tests_and_touches_every_module():
    files = fast_tier_files()
    assert "tests/test_learning.py" not in files and "tests/test_remote.py" not in files
    assert "tests/test_config.py" in files
    covered = set().union(*(touched(f) for f in files))
    library = {f"vgrpo/{p.name}" for p in (ROOT / "vgrpo").glob("*.py") if p.name != "__init__.py"}
    stages = {f"stages/{p.name}" for p in (ROOT / "stages").glob("*.py")}
    assert library - covered == set(), "fast tier touches no test of these modules"
    assert stages - covered == set(), "fast tier runs no test of these stage scripts"


def test_slow_is_a_declared_marker():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'markers = \[\s*"slow: ', pyproject)


def test_a_full_temp_disk_stops_the_slow_tests_before_they_start(tmp_path):
    """Asking for more free space than any disk has stands in for a full disk: one line, exit 1, no test run."""
    env = {**os.environ, "VGRPO_TEST_NEED_GIB": "1e9"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_smoke.py"]
    slow = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert slow.returncode == 1, slow.stdout[-2000:]
    assert "GiB free; the slow tests need 1e+09 GiB (VGRPO_TEST_NEED_GIB)" in slow.stdout
    assert " passed" not in slow.stdout and " failed" not in slow.stdout
    fast = subprocess.run([*argv, "-m", "not slow", "--collect-only"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert fast.returncode == 0, fast.stdout[-2000:]
