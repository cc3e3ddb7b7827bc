"""The benchmark scripts run and print their figures (with small sizes; the README's figures come from
the full sizes). Speed is measured by these scripts, never asserted by a test."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, run, tiny_params

from vgrpo.prompts import brief_style_fork


def test_generate_benchmark():
    out = run(["python", str(ROOT / "bench/generate.py"), "--images", "200"], ROOT).stdout
    assert re.search(r"verified generate : +[\d.]+ images/s", out)
    assert re.search(r"naive label errors: +[\d.]+%", out)


@pytest.mark.slow
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


@pytest.mark.slow
def test_sft_control_and_the_seed_report_on_a_finished_run(tiny_pipeline, tmp_path):
    """`bench/sft_control.py` on a finished run: SFT steps from the run's base, then the same test images as
    `evaluate`; the warm start and GRPO figures it prints are the run's own, GRPO minus SFT is paired.
    Then `bench/cpu_seeds.py --report` reads that run as one seed: its reporting path, as on the cpu runs."""
    import json

    seed = tmp_path / "seeds" / "seed-0"
    seed.mkdir(parents=True)
    (seed / "repo").symlink_to(tiny_pipeline)
    out = run(["python", str(ROOT / "bench/sft_control.py"), "--repo", str(tiny_pipeline), "--steps", "2", "--out",
               str(seed / "sft_control.json")], ROOT).stdout
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())["test"]
    assert re.search(r"budget: 2 steps; SFT continued 2 steps in [\d.]+ min \(lr [\d.e-]+, constant, batch \d+\)", out)
    found = re.search(r"test accuracy \((\d+) images, greedy\): warm start ([\d.]+), \+ GRPO ([\d.]+), "
                      r"\+ more SFT ([\d.]+)", out)
    assert found, out
    assert int(found[1]) == evaluation["base"]["samples"]
    assert float(found[2]) == round(evaluation["base"]["accuracy"], 3)
    assert float(found[3]) == round(evaluation["trained"]["accuracy"], 3)
    assert 0 <= float(found[4]) <= 1
    assert re.search(r"GRPO minus more SFT: [+-][\d.]+ \(paired 95% CI \[[+-][\d.]+, [+-][\d.]+\], McNemar p [\d.e-]+, "
                     rf"{found[1]} images\)", out), out
    sft = json.loads((seed / "sft_control.json").read_text())
    (seed / "done").touch()  # what bench/cpu_seeds.py leaves once a seed's runs are finished
    assert sft["sft_steps"] == 2 and f"{sft['accuracy']:.3f}" == found[4]

    table = run(["python", str(ROOT / "bench/cpu_seeds.py"), "--work", str(tmp_path / "seeds"), "--report"],
                ROOT).stdout
    assert re.search(rf"cpu profile over 1 seeds \(base.seed = train.seed\), test accuracy on {found[1]} images; "
                     r"CPU: .+ \(.*\d+ cores\)", table), table
    assert re.search(rf"\| 0 \| {float(found[2]):.1%} \| - \| {float(found[3]):.1%} \| - \| {sft['accuracy']:.1%} "
                     r"\(2 steps\) \|", table), table
    assert f"after GRPO: mean {float(found[3]):.1%}, range" in table


@pytest.mark.slow
def test_cpu_run_report_of_a_finished_run(tiny_pipeline):
    """`bench/cpu_run.py --report`: the figures the README's CPU section quotes, from a run's reports."""
    out = run(["python", str(ROOT / "bench/cpu_run.py"), "--report", str(tiny_pipeline)], ROOT).stdout
    for pattern in (r"warm start: \d+ SFT steps in [\d.]+ min; val accuracy [\d.]+",
                    r"GRPO: \d+ steps in [\d.]+ min \([\d.]+ s/step\), adapter changed: True",
                    r" test: base [\d.]+ -> trained [\d.]+ \([+-][\d.]+, paired 95% CI",
                    r"test answers given, base -> trained: ", r"smoke \(8 test images\): merged model [\d.]+; "):
        assert re.search(pattern, out), (pattern, out)


@pytest.mark.slow
def test_answer_styles_answers_as_it_comes_and_with_the_brief_style_forbidden(tiny_pipeline):
    """`bench/answer_styles.py` on a finished run: both models, both ways, on the test images evaluate used;
    with the brief style's first token forbidden no answer is brief; each model's brief-token probability."""
    import json

    out = run(["python", str(ROOT / "bench/answer_styles.py"), "--repo", str(tiny_pipeline)], ROOT).stdout
    samples = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())["test"]["base"]["samples"]
    lines = re.findall(r"^(warm start|trained) +(as it answers|brief style forbidden) +test accuracy ([\d.]+) "
                       r"\((\d+) images\), brief answers ([\d.]+)$", out, flags=re.MULTILINE)
    assert [(model, way) for model, way, *_ in lines] == [(m, w) for m in ("warm start", "trained")
                                                         for w in ("as it answers", "brief style forbidden")], out
    assert all(int(n) == samples and 0 <= float(accuracy) <= 1 for _, _, accuracy, n, _ in lines)
    assert [brief for _, way, _, _, brief in lines if way == "brief style forbidden"] == ["0.000", "0.000"]
    probabilities = re.findall(r"^(warm start|trained) +brief style's first-token probability: mean ([\d.]+), "
                               r"min ([\d.]+), max ([\d.]+) \((\d+) images\)$", out, flags=re.MULTILINE)
    assert [model for model, *_ in probabilities] == ["warm start", "trained"], out
    assert all(0 <= float(low) <= float(mean) <= float(high) <= 1 and int(n) == samples
               for _, mean, low, high, n in probabilities)
    assert re.search(rf"^trained minus warm start made to describe: [+-][\d.]+ \(paired 95% CI \[[+-][\d.]+, "
                     rf"[+-][\d.]+\], McNemar p [\d.e-]+, {samples} images\)$", out, flags=re.MULTILINE), out


def answer_styles_module():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import answer_styles

    return answer_styles


def test_the_styles_fork_where_a_brief_answer_leaves_the_described_one(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prefix, brief_token = brief_style_fork(tokenizer)
    assert tokenizer.decode(prefix) == "<REASONING"  # "<REASONING>I count" vs "<REASONING>2 red"
    assert tokenizer.decode([brief_token]) == ">I"


def test_brief_token_probability_is_the_next_token_probability_of_each_image_alone(tiny_model_dir, tiny_dataset):
    """Batched with left padding, each row's probability is the one its own unpadded forward pass gives."""
    import torch

    from vgrpo.config import config_from_dict
    from vgrpo.generation import batch_inputs
    from vgrpo.models import load_model, load_processor
    from vgrpo.shapes import load_dataset

    answer_styles = answer_styles_module()
    processor = load_processor(tiny_model_dir, config_from_dict(tiny_params()).model)
    net = load_model(tiny_model_dir, "float32").eval()
    test = load_dataset(tiny_dataset, splits=("test",))["test"]
    rows = [test[i] for i in range(3)]
    prefix, brief_token = brief_style_fork(processor.tokenizer)
    batched = answer_styles.brief_token_probabilities(net, processor, rows, prefix, brief_token)
    for row, probability in zip(rows, batched, strict=True):
        inputs = dict(batch_inputs(processor, [row], net.device))
        forced = torch.tensor([prefix])
        inputs["input_ids"] = torch.cat([inputs["input_ids"], forced], dim=1)
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(forced)], dim=1)
        inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        with torch.no_grad():
            logits = net(**inputs).logits[0, -1]
        assert probability == pytest.approx(logits.softmax(-1)[brief_token].item(), rel=1e-3, abs=1e-6)


@pytest.mark.slow
def test_smoke_reference_compares_both_reference_precisions(tiny_pipeline):
    """`bench/smoke_reference.py` (the README's figures for smoke's reference precision) on the tiny run."""
    out = run(["python", str(ROOT / "bench/smoke_reference.py"), "--repo", str(tiny_pipeline), "--images", "2"],
              ROOT).stdout
    found = {(m[1], m[2]): (float(m[3]), float(m[4])) for m in re.finditer(
        r"reference (float32|bfloat16) +vs \S+-F16\.gguf, (first token|first count): log-prob diff, max over 2 "
        r"images: over the 10 likeliest tokens ([\d.e+-]+), over the tokens with p > 1e-3 \([\d.]+ a image\) "
        r"([\d.e+-]+)", out)}
    assert set(found) == {(d, w) for d in ("float32", "bfloat16") for w in ("first token", "first count")}, out
    assert found[("float32", "first token")][1] < 0.05  # both in full precision (smoke's tiny threshold)
