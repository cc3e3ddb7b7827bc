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


def test_sft_control_continues_the_warm_start_and_answers_the_test_images(tiny_pipeline):
    """`bench/sft_control.py` on a finished run: SFT steps from the run's base, then the same test
    images as `evaluate`; the warm start and GRPO figures it prints are the run's own."""
    import json

    out = run(["python", str(ROOT / "bench/sft_control.py"), "--repo", str(tiny_pipeline), "--steps", "2"],
              ROOT).stdout
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())["test"]
    assert re.search(r"budget: 2 steps; SFT continued 2 steps in [\d.]+ min \(lr [\d.e-]+, constant, batch \d+\)", out)
    found = re.search(r"test accuracy \((\d+) images, greedy\): warm start ([\d.]+), \+ GRPO ([\d.]+), "
                      r"\+ more SFT ([\d.]+)", out)
    assert found, out
    assert int(found[1]) == evaluation["base"]["samples"]
    assert float(found[2]) == round(evaluation["base"]["accuracy"], 3)
    assert float(found[3]) == round(evaluation["trained"]["accuracy"], 3)
    assert 0 <= float(found[4]) <= 1


def test_answer_styles_answers_as_it_comes_and_with_the_brief_style_forbidden(tiny_pipeline):
    """`bench/answer_styles.py` on a finished run: both models, both ways, on the test images evaluate used;
    with the brief style's first token forbidden no answer is brief."""
    import json

    out = run(["python", str(ROOT / "bench/answer_styles.py"), "--repo", str(tiny_pipeline)], ROOT).stdout
    samples = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())["test"]["base"]["samples"]
    lines = re.findall(r"^(warm start|trained) +(as it answers|brief style forbidden) +test accuracy ([\d.]+) "
                       r"\((\d+) images\), brief answers ([\d.]+)$", out, flags=re.MULTILINE)
    assert [(model, way) for model, way, *_ in lines] == [(m, w) for m in ("warm start", "trained")
                                                         for w in ("as it answers", "brief style forbidden")], out
    assert all(int(n) == samples and 0 <= float(accuracy) <= 1 for _, _, accuracy, n, _ in lines)
    assert [brief for _, way, _, _, brief in lines if way == "brief style forbidden"] == ["0.000", "0.000"]


def test_the_brief_style_token_is_where_a_brief_answer_leaves_the_described_one(tiny_model_dir):
    import sys

    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "bench"))
    from answer_styles import brief_style_token

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.decode([brief_style_token(tokenizer)]) == ">I"  # "<REASONING>I count" vs "<REASONING>2 red"
