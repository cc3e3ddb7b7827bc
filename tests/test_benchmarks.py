"""The benchmark scripts run and print their figures (with small sizes; the README's figures come from
the full sizes). Speed is measured by these scripts, never asserted by a test."""

from __future__ import annotations

import re

from conftest import ROOT, run


def test_generate_benchmark():
    out = run(["python", str(ROOT / "bench/generate.py"), "--images", "200"], ROOT).stdout
    assert re.search(r"verified generate : +[\d.]+ images/s", out)
    assert re.search(r"naive label errors: +[\d.]+%", out)


def test_evaluate_speed_benchmark():
    out = run(["python", str(ROOT / "bench/evaluate_speed.py"), "--samples", "4", "--batch-size", "4",
               "--max-new-tokens", "4"], ROOT).stdout
    assert re.search(r"speed-up +: +[\d.]+x", out)


def test_sampling_benchmark():
    out = run(["python", str(ROOT / "bench/sampling.py"), "--rows", "2", "--calls", "2"], ROOT).stdout
    assert re.search(r"torch.multinomial +: +[\d.]+ ms/call", out)
    assert re.search(r"speed-up +: +[\d.]+x", out)


def test_cpu_run_picture_without_plots_says_so_in_one_line(tmp_path):
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'bench'); import cpu_run; "
            f"cpu_run.picture(Path({str(tmp_path)!r}), Path({str(tmp_path / 'x.png')!r}))")
    result = run(["python", "-c", code], ROOT, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"cpu_run: `dvc plots show --json` found no plots in {tmp_path} "
                                     "(not a finished cpu run?)")
