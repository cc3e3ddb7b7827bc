"""The benchmark scripts run and print their figures (with small sizes; the README's figures come from
the full sizes). Speed is measured by these scripts, never asserted by a test."""

from __future__ import annotations

import re

import pytest
import yaml
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


def test_answer_temperature_benchmark_prints_each_sampler(tiny_pipeline):
    out = run(["python", str(ROOT / "bench/answer_temperature.py"), "--repo", str(tiny_pipeline), "--images", "2",
               "--answer-temperature", "1.4", "--answer-temperature", "2.0"], ROOT).stdout
    figures = (r"right [\d.]+, described [\d.]+, right among described [\d.]+, malformed [\d.]+, "
               r"groups of 4 with spread [\d.]+, pass@8 [\d.]+")
    assert re.search("^as they come: " + figures + "$", out, re.M)
    for temperature in ("1.4", "2.0"):
        assert re.search(f"^answer token at {temperature} among the digits: " + figures + "$", out, re.M)


def test_cpu_run_picture_without_plots_says_so_in_one_line(tmp_path):
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'bench'); import cpu_run; "
            f"cpu_run.picture(Path({str(tmp_path)!r}), Path({str(tmp_path / 'x.png')!r}))")
    result = run(["python", "-c", code], ROOT, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (f"cpu_run: `dvc plots show --json` found no plots in {tmp_path} "
                                     "(not a finished cpu run?)")


def test_cpu_seeds_stops_in_one_line_on_contradicting_options_and_unmatched_runs(tmp_path):
    """`--no-controls` with `--control` is a usage error before any clone is made; GRPO against a rival that
    shares no image with it (runs of two datasets) names the seed, not a ZeroDivisionError."""
    import click
    from cpu_seeds import paired_difference

    result = run(["python", str(ROOT / "bench/cpu_seeds.py"), "--work", str(tmp_path / "w"), "--no-controls",
                  "--control", "rft", "0"], ROOT, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr and not (tmp_path / "w").exists()
    assert "Error: --control rft names a control and --no-controls runs none: drop one" in result.stderr
    rows = {3: {"runs": {"grpo": {"a": True}, "rft": {"b": False}}}}
    with pytest.raises(click.ClickException, match=r"seed 3: GRPO's and rft's predictions share no image"):
        paired_difference(rows, {3: "rft"})


def test_grpos_own_share_is_over_the_warm_starts_greedy_answers_where_it_has_no_brief_style():
    """With a brief style, the warm start's rival is its made-to-describe decoding, greedy left out; a warm start
    taught only to describe has no made-to-describe run, and its greedy answers stand in (not RFT alone)."""
    from cpu_seeds import better_rival

    greedy, described, rft = {"a": True, "b": True}, {"a": True, "b": False}, {"a": False, "b": False}
    assert better_rival({"greedy": greedy, "described": described, "rft": rft}) == "described"
    assert better_rival({"greedy": greedy, "described": {}, "rft": rft}) == "greedy"
    assert better_rival({"greedy": rft, "described": {}, "rft": described}) == "rft"


def test_the_report_gives_the_interval_with_the_seed_as_the_unit_from_two_seeds_on():
    """The seed-report test runs one seed; the line `--report` prints beside a pooled interval from two seeds on
    (OOD's per-seed gains on the profile: docs/cpu-research.md) is checked here, in points."""
    from cpu_seeds import seeds_interval

    assert seeds_interval([0.158, -0.017, 0.033, -0.025, 0.067]) == ", over the seeds (t) [-4.9, +13.6]"
    assert seeds_interval([0.05]) == ""


def test_a_lever_is_paired_with_another_folders_grpo_and_rft_on_the_same_seeds_images(tmp_path, capsys):
    """`--report --against W`: a lever run with --no-controls, minus the profile's GRPO and RFT of the same seeds,
    image by image; the warm starts' agreement is printed; another dataset or an unfinished seed there stops in
    one line that names it."""
    import json

    import click
    from cpu_seeds import report_against

    def seed(work, number, grpo, rft, described, generate_seed=7):
        repo = work / f"seed-{number}" / "repo"
        (repo / "reports/eval").mkdir(parents=True)
        (repo / "params.yaml").write_text(yaml.safe_dump({"generate": {"seed": generate_seed, "val_size": 4}}))
        rows = [{"split": "val", "model": model, "id": f"val-{i}", "parsed": answer, "correct": answer == 3}
                for model, answers in (("trained", grpo), ("base_described", described)) for i, answer in
                enumerate(answers)]
        (repo / "reports/eval/predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if rft:
            (repo / "controls/rft/eval").mkdir(parents=True)
            lines = [json.dumps({"split": "val", "model": "trained", "id": f"val-{i}", "parsed": a, "correct": a == 3})
                     for i, a in enumerate(rft)]
            (repo / "controls/rft/eval/predictions.jsonl").write_text("".join(line + "\n" for line in lines))
        (repo.parent / "done").touch()
        return repo.parent

    lever, profile = tmp_path / "lever", tmp_path / "profile"  # every image's true count is 3
    folders = [seed(lever, 0, [3, 3, 3, 1], None, [3, 1, 1, 1]), seed(lever, 1, [3, 3, 1, 1], None, [3, 3, 1, 2])]
    seed(profile, 0, [3, 3, 1, 1], [3, 1, 1, 1], [3, 1, 1, 1])
    seed(profile, 1, [3, 3, 1, 1], [3, 3, 3, 1], [3, 3, 1, 1])  # one made-to-describe answer differs: 4 of 4, 3 of 4
    report_against(folders, profile, "val")
    out = capsys.readouterr().out
    assert f"against {profile}: the two warm starts made to describe give the same answer on 87.5% of the images" in out
    # GRPO minus theirs: seed 0 +25, seed 1 0; minus their RFT: seed 0 +50, seed 1 -25
    named = re.escape(str(profile))
    assert re.search(rf"GRPO minus {named}'s GRPO: mean \+12.5 points \[[+-][\d.]+, [+-][\d.]+\], "
                     r"over the seeds \(t\) \[[+-][\d.]+, [+-][\d.]+\], range \+0.0 to \+25.0", out), out
    assert re.search(rf"GRPO minus {named}'s RFT: mean \+12.5 points .*range -25.0 to \+50.0", out), out
    (profile / "seed-1/done").unlink()
    with pytest.raises(click.ClickException, match=rf"--against {named}: seed-1 is not finished there"):
        report_against(folders, profile, "val")
    seed(tmp_path / "other", 0, [3], [3], [3], generate_seed=8)
    with pytest.raises(click.ClickException, match=r"seed-0's generate.seed is 7 here and 8 there"):
        report_against(folders[:1], tmp_path / "other", "val")
    refused = run(["python", str(ROOT / "bench/cpu_seeds.py"), "--work", str(tmp_path / "new"), "--against",
                   str(profile), "0", "1"], ROOT, check=False)  # refused before any clone or run
    assert refused.returncode == 2 and not (tmp_path / "new").exists(), refused.stderr
    assert f"Error: --against {profile}: seed-1 is not finished there" in refused.stderr


def test_a_slot_slip_is_an_answer_that_took_another_shapes_stated_count():
    """Of the answers that are not the reasoning's count of the asked shape: a slip names another shape's stated
    count; a number stated for no shape is not one; answers that repeat the count, or follow no stated count,
    are not counted at all."""
    from cpu_seeds import slot_slips

    def row(answer, reasoning_count, model="trained"):
        reasoning = "2 red triangles, 3 blue circles, 1 green squares"
        return {"model": model, "target_shape": "circles", "parsed": answer, "reasoning_count": reasoning_count,
                "completion": f"<REASONING>{reasoning}</REASONING><SOLUTION>{answer}</SOLUTION>"}

    rows = [row(1, 3), row(2, 3), row(5, 3), row(3, 3), row(4, None), row(1, 3, model="base")]
    assert slot_slips(rows, "trained") == (2, 3)  # 1 (squares) and 2 (triangles) slip; 5 is stated for no shape
    assert slot_slips(rows, "base") == (1, 1) and slot_slips(rows, "rft") == (0, 0)


def test_pass_at_k_gaps_are_paired_image_by_image_over_the_seeds_that_kept_right_answers():
    """GRPO's pass@k minus a rival's, from each image's right answers of n: seed 0 (n 2) and seed 1 (n 2) kept
    them, seed 2 (scored before evaluate kept them) is left out of the gap, not counted as zero."""
    import click
    from cpu_seeds import pass_at_k_differences

    def rates(right):
        return {"pass@1": 0.0, "pass@2": 0.0, "images": len(right), "samples_per_image": 2, "right_per_image": right}

    rows = {0: {"pass": {"trained": rates([2, 0]), "rft": rates([1, 0])}},
            1: {"pass": {"trained": rates([1, 1]), "rft": rates([2, 0])}},
            2: {"pass": {"trained": {"pass@1": 0.9, "pass@2": 1.0}, "rft": {"pass@1": 0.0, "pass@2": 0.0}}}}
    gaps, images = pass_at_k_differences(rows, "rft")
    assert images == 4 and list(gaps) == ["pass@1", "pass@2"]
    # pass@1 = right / n: seed 0 GRPO 0.5, RFT 0.25; seed 1 GRPO 0.5, RFT 0.5; the mean gap is +0.125
    assert gaps["pass@1"][0] == pytest.approx(0.125)
    # pass@2 with n 2: any right answer. Seed 0: GRPO [1, 0], RFT [1, 0]; seed 1: GRPO [1, 1], RFT [1, 0]
    assert gaps["pass@2"][0] == pytest.approx(0.25)
    low, high = gaps["pass@2"][1]
    assert 0 <= low <= 0.25 <= high <= 0.5  # seed 0 never differs; seed 1's one differing image drives it
    assert pass_at_k_differences(rows, "base") == ({}, 0)  # no warm start sampled: no gap
    rows[1]["pass"]["rft"] = rates([2, 0, 1])
    with pytest.raises(click.ClickException, match=r"seed 1: GRPO's pass@k is on 2 images and rft's on 3"):
        pass_at_k_differences(rows, "rft")


@pytest.mark.slow
def test_controls_and_the_seed_report_on_a_finished_run(tiny_pipeline, tmp_path):
    """`bench/controls.py` on a finished run: RFT (the warm start's verified samples) and full-label SFT, each
    with GRPO's steps and batch, scored by evaluate's code and paired with GRPO image by image. The run is
    a seed `bench/cpu_seeds.py` finished with --no-controls: run again, it adds the controls (the clone's
    own bench/controls.py) and does not rerun GRPO, then reports that seed as on the cpu runs."""
    import json

    from conftest import copy_repo
    from cpu_seeds import ONE_THREAD

    repo = copy_repo(tiny_pipeline, tmp_path / "seeds" / "seed-0" / "repo")
    (repo.parent / "done").touch()  # what bench/cpu_seeds.py leaves once a seed's GRPO run is finished
    seeds = ["python", str(ROOT / "bench/cpu_seeds.py"), "--work", str(tmp_path / "seeds"), "--split", "test"]
    score_only = ["python", str(ROOT / "bench/controls.py"), "--repo", str(repo), "--control", "rft", "--score-only"]
    refused = run(score_only, ROOT, check=False)  # nothing trained yet: nothing to score
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip() == (f"Error: {repo / 'controls/rft'}: no trained control to score (run without "
                                      "--score-only first)")
    first = run([*seeds, "0"], ROOT)
    assert "seed 0: GRPO done before, kept" in first.stderr and "the controls (rft, full_label_sft)" in first.stderr
    out = (repo.parent / "controls-rft-full_label_sft.log").read_text()
    steps = json.loads((repo / "reports/train/metrics.json").read_text())["steps"]
    for name in ("rft", "full_label_sft"):
        summary = json.loads((repo / "controls" / name / "summary.json").read_text())
        assert summary["prompts"] == steps * 4 // 4  # the tiny profile: 1 prompt x 4 generations a step
        assert summary["steps"] in (0, steps) and summary["kept"] <= (summary["sampled"] or summary["kept"])
        versus = summary["versus_grpo"]["test"]
        assert versus["images"] == 16 and versus["ci95"][0] <= versus["grpo_minus_control"] <= versus["ci95"][1]
        assert re.search(rf"  test: {name} [\d.]+, GRPO [\d.]+, GRPO minus {name} [+-][\d.]+ \[", out), out
    full = json.loads((repo / "controls/full_label_sft/summary.json").read_text())
    assert full["steps"] == steps and full["kept"] == steps * 4  # every prompt's full label, as often as GRPO samples

    again = run([*seeds, "--control", "rft", "0"], ROOT)
    assert "the controls" not in again.stderr  # a control a seed has is not trained again
    # scored again from its saved adapter, not trained again: the same scores, the training's figures kept
    adapter = (repo / "controls/rft/adapter/adapter_model.safetensors").read_bytes()
    scored, trained_summary = ((repo / "controls/rft" / f).read_text() for f in ("eval/metrics.json", "summary.json"))
    (repo / "controls/rft/eval/metrics.json").unlink()
    # with one thread, as cpu_seeds.py scored it: pass@k samples, and another thread count sums floats in
    # another order, which moves a draw near a token's boundary (seen on an AMD EPYC: pass@1 0.25 against 0.375)
    rescored = run(score_only, ROOT, env=ONE_THREAD)
    assert (repo / "controls/rft/adapter/adapter_model.safetensors").read_bytes() == adapter
    assert (repo / "controls/rft/eval/metrics.json").read_text() == scored
    assert json.loads((repo / "controls/rft/summary.json").read_text()) == json.loads(trained_summary)
    assert re.search(r"^rft: \d+ of \d+ answers kept from \d+ prompts", rescored.stdout, re.M), rescored.stdout
    table = run([*seeds, "--report"], ROOT).stdout
    assert table == first.stdout == again.stdout
    evaluation = json.loads((repo / "reports/eval/metrics.json").read_text())["test"]
    assert re.search(r"cpu profile over 1 seeds \(base.seed = train.seed\), data generate.seed \d+, test accuracy "
                     r"on 16 images; one thread per run; CPU: .+ \(.*\d+ cores\)", table), table
    assert f"after GRPO: mean {evaluation['trained']['accuracy']:.1%}" in table
    assert re.search(r"GRPO's own share \(after GRPO minus the better of made to describe and RFT\): mean "
                     r"[+-][\d.]+ points, paired 95% interval over the seeds' images \[[+-][\d.]+, [+-][\d.]+\], "
                     r"range", table)
    assert "over the seeds (t)" not in table  # one seed: no interval with the seed as the unit
    for label in ("warm start", "after GRPO", "RFT control"):  # the tiny profile's base has no brief style to forbid
        assert re.search(rf"pass@k {label}, at GRPO's sampling settings: mean over 1 seeds pass@1 [\d.]+", table), table
    rft_pass = json.loads((repo / "controls/rft/eval/metrics.json").read_text())["test"]["trained"]["pass_at_k"]
    assert rft_pass["images"] == 2 and rft_pass["samples_per_image"] == 4  # evaluate.pass_samples, max(pass_k)
    assert 0 <= rft_pass["pass@1"] <= rft_pass["pass@4"] <= 1
    assert re.search(r"  test: rft pass@1 [\d.]+, pass@4 [\d.]+ at GRPO.s sampling settings \(2 images\)", out), out
    assert f"pass@k RFT control, at GRPO's sampling settings: mean over 1 seeds pass@1 {rft_pass['pass@1']:.2f}, " \
           f"pass@4 {rft_pass['pass@4']:.2f}" in table, table
    grpo_pass = evaluation["trained"]["pass_at_k"]  # each image's right answers: the gap is paired image by image
    assert len(grpo_pass["right_per_image"]) == len(rft_pass["right_per_image"]) == 2
    gap = re.escape(f"{grpo_pass['pass@1'] - rft_pass['pass@1']:+.2f}")
    assert re.search(rf"pass@k after GRPO minus RFT control, paired over 2 images: pass@1 {gap} "
                     r"\[[+-][\d.]+, [+-][\d.]+\], pass@4 [+-][\d.]+ \[", table), table
    trained = evaluation["trained"]
    assert (f"after GRPO: the reasoning states the asked count right on {trained['reasoning_count_accuracy']:.1%}, "
            f"the answer is the reasoning's count on {trained['answer_matches_reasoning']:.1%} "
            "(mean over 1 seeds)") in table, table
    rft_eval = json.loads((repo / "controls/rft/eval/metrics.json").read_text())["test"]["trained"]
    assert (f"RFT: the reasoning states the asked count right on {rft_eval['reasoning_count_accuracy']:.1%}, "
            f"the answer is the reasoning's count on {rft_eval['answer_matches_reasoning']:.1%} "
            "(mean over 1 seeds)") in table, table
    highest = yaml.safe_load((repo / "params.yaml").read_text())["generate"]["max_count"]
    answers = [r["parsed"] for r in map(json.loads, (repo / "reports/eval/predictions.jsonl").open())
               if r["split"] == "test" and r["model"] == "trained"]
    above = sum(a is not None and a > highest for a in answers) / len(answers)
    assert f"after GRPO: answers above the training range (> {highest}) {above:.1%} (mean over 1 seeds)" in table, table
    rft = {r["id"]: r["parsed"] for r in map(json.loads, (repo / "controls/rft/eval/predictions.jsonl").open())
           if r["split"] == "test"}
    grpo = {r["id"]: r["parsed"] for r in map(json.loads, (repo / "reports/eval/predictions.jsonl").open())
            if r["split"] == "test" and r["model"] == "trained"}
    same = sum(grpo[i] == rft[i] for i in grpo) / len(grpo)
    assert f"after GRPO and RFT give the same answer on {same:.1%} of the images (mean over 1 seeds)" in table, table
    for label in ("RFT", "full-label SFT"):  # GRPO against each control on its own, with its interval
        assert re.search(rf"GRPO minus {label}: mean [+-][\d.]+ points \[[+-][\d.]+, [+-][\d.]+\], range", table), table


@pytest.mark.slow
def test_gate_figures_of_a_run(tiny_pipeline):
    """`bench/gate_figures.py` (the figures behind smoke's bounds) on the tiny run, with itself as the other
    run: every precision a CPU runs, every measure the gate reads."""
    out = run(["python", str(ROOT / "bench/gate_figures.py"), "--repo", str(tiny_pipeline), "--other",
               str(tiny_pipeline), "--images", "2", "--threads", "2"], ROOT).stdout
    for reference in ("reference float32", "reference bfloat16", "reference 4bit", "another run's files",
                      "a BF16 file from a bfloat16 merge"):
        assert reference in out, out
    assert re.search(r"Qwen3-VL-tiny-shapes-grpo-F16.gguf: count_agreement [\d.]+, count_tv [\d.e-]+, answer_agreement "
                     r"[\d.]+, trained_agreement (?:None|[\d.]+), logprob_diff [\d.e-]+, projector_error [\d.e-]+", out)
    assert re.search(r"merge in bfloat16: log-prob difference to base \+ adapter [\d.e-]+ nats", out)


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


def test_kl_to_start_finds_the_count_tokens_of_an_answer(tiny_model_dir):
    """bench/kl_to_start.py splits the KL at the digit tokens (the counts) from the words around them."""
    import sys

    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "bench"))
    from kl_to_start import digit_tokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    digits = set(digit_tokens(tokenizer))
    answer = tokenizer("<REASONING>2 red circles, 13 blue squares</REASONING><SOLUTION>2</SOLUTION>")["input_ids"]
    assert [tokenizer.decode([t]) for t in answer if t in digits] == ["2", "1", "3", "2"]


def test_kl_to_start_finds_the_style_fork_only_in_answers_that_open_as_both_styles_do(tiny_model_dir):
    """The style fork is the position after the opening both warm-start styles share (`<REASONING`), in the
    answers that begin with it; an answer that opens otherwise has none."""
    import sys

    import torch
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "bench"))
    from kl_to_start import style_fork_positions

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    opening, brief_token = brief_style_fork(tokenizer)
    texts = ["<REASONING>I count the blue circles.</REASONING>", "<REASONING>2 red triangles, 3 blue circles",
             "<SOLUTION>3</SOLUTION> and more words to pad"]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:8] for text in texts]
    fork = style_fork_positions(torch.tensor(ids), opening)
    assert fork.sum(1).tolist() == [1, 1, 0]
    assert ids[0][fork[0].nonzero().item()] == brief_token and fork[1, len(opening)]


@pytest.mark.slow
def test_kl_to_start_puts_part_of_the_kl_at_the_style_fork_of_answers_that_open_as_both_styles_do(
        tiny_dataset, tiny_base, tmp_path):
    """Answers forced to open as the two warm-start styles do (the tiny warm start's own samples do not) have a
    style fork: for a moved adapter, in both directions, part of their KL falls there and part on their digits,
    and some is left for the other words; an answer that opens otherwise has none at a fork. A still adapter
    gives 0 everywhere. Each answer's tokens are counted up to and including its end-of-sequence token."""
    import sys

    import torch
    from conftest import tiny_adapter, tiny_config

    from vgrpo.evaluation import load_base_and_adapter
    from vgrpo.generation import batch_inputs
    from vgrpo.shapes import load_dataset

    sys.path.insert(0, str(ROOT / "bench"))
    from kl_to_start import answer_kl, answer_marks

    config = tiny_config()
    test = load_dataset(tiny_dataset, splits=("test",))["test"]
    rows = [test[i] for i in range(3)]
    texts = ["<REASONING>I count the blue circles: 2.</REASONING><SOLUTION>2</SOLUTION>",
             "<REASONING>2 red triangles, 3 blue circles.</REASONING><SOLUTION>3</SOLUTION>",
             "<SOLUTION>3</SOLUTION>"]
    for name, scale in (("still", 0.0), ("moved", 0.1)):
        adapter = tiny_adapter(tmp_path / name, tiny_base, scale=scale)
        model, processor = load_base_and_adapter(config, tiny_base, adapter, "float32")
        tokenizer = processor.tokenizer
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for text in texts]
        width = max(map(len, ids))
        answers = torch.tensor([answer + [tokenizer.pad_token_id] * (width - len(answer)) for answer in ids])
        marks = answer_marks(model, tokenizer)
        inputs = batch_inputs(processor, rows, model.device)
        for direction in ("reverse", "forward"):
            figures = answer_kl(model, inputs, answers, marks, config.train.temperature, direction)
            assert figures["tokens"] == [len(answer) for answer in ids]
            assert figures["digit_tokens"] == [2, 3, 1]
            if name == "still":
                assert figures["kl"] == figures["kl_on_digits"] == figures["kl_at_style_fork"] == [0.0] * 3
                continue
            fork, digits, whole = figures["kl_at_style_fork"], figures["kl_on_digits"], figures["kl"]
            assert fork[0] > 0 and fork[1] > 0 and fork[2] == 0, (direction, fork)
            assert all(0 < digit for digit in digits), (direction, digits)
            assert all(f + d < w for f, d, w in zip(fork, digits, whole, strict=True)), (direction, figures)


@pytest.mark.slow
def test_kl_to_start_is_zero_for_an_adapter_that_never_moved_and_above_zero_for_one_that_did(
        tiny_dataset, tiny_base, tmp_path):
    """bench/kl_to_start.py, in both directions: LoRA with B = 0 (as at initialisation) is the warm start, so
    every answer's KL is exactly 0; an adapter that changes answers is a distance above 0, the same again with the
    same seed; its part on the digit tokens is above 0, and with the part at the style fork (0 where no
    answer opens as the warm-start styles do) leaves some for the other words. Forward KL samples from the
    warm start, so with one seed the moved adapter's answers are the still one's (same token count) and its
    figure differs from the reverse one's. A split that does not exist stops it in one line before the model
    loads."""
    import json

    from conftest import tiny_adapter, write_params

    params = write_params(tmp_path / "params.yaml", tiny_params())
    command = ["python", str(ROOT / "bench/kl_to_start.py"), "--params", str(params), "--data", str(tiny_dataset),
               "--base", str(tiny_base), "--split", "test", "--images", "4", "--samples", "2"]
    still = tiny_adapter(tmp_path / "still", tiny_base, scale=0.0)
    moved = tiny_adapter(tmp_path / "moved", tiny_base, scale=0.1)
    labels = {"reverse": r"KL\(trained \|\| warm start\)", "forward": r"KL\(warm start \|\| trained\)"}
    figures = {}
    for name, adapter, direction in (("still", still, "reverse"), ("moved", moved, "reverse"),
                                     ("again", moved, "reverse"), ("forward still", still, "forward"),
                                     ("forward moved", moved, "forward")):
        out_file = tmp_path / f"{name}.json"
        out = run([*command, "--adapter", str(adapter), "--direction", direction, "--out", str(out_file)],
                  ROOT).stdout
        assert re.search(rf"^test: {labels[direction]} [\d.]+ nats per answer \[[\d.]+, [\d.]+\], [\d.]+ per "
                         r"token \(4 images x 2 answers at temperature [\d.]+\); [\d.]+ per answer on its digit tokens "
                         r"\(\d+ of \d+\), [\d.]+ at the style fork$", out, re.M), out
        figures[name] = json.loads(out_file.read_text())["test"]
    for still_figures in (figures["still"], figures["forward still"]):
        assert still_figures["kl_per_answer"] == 0.0 and still_figures["ci95"] == [0.0, 0.0]
        assert still_figures["tokens"] > 0 and still_figures["kl_on_digits_per_answer"] == 0.0
        assert still_figures["kl_at_style_fork_per_answer"] == 0.0
    for moved_figures in (figures["moved"], figures["forward moved"]):
        assert moved_figures["kl_per_answer"] > 0 and moved_figures["kl_per_token"] > 0
        assert moved_figures["ci95"][0] <= moved_figures["kl_per_answer"] <= moved_figures["ci95"][1]
        assert moved_figures["images"] == 4
        assert 0 < moved_figures["kl_on_digits_per_answer"] < moved_figures["kl_per_answer"]
        assert 0 < moved_figures["digit_tokens"] < moved_figures["tokens"]
        parts = moved_figures["kl_on_digits_per_answer"] + moved_figures["kl_at_style_fork_per_answer"]
        assert 0 <= moved_figures["kl_at_style_fork_per_answer"] and parts < moved_figures["kl_per_answer"]
    assert figures["again"] == figures["moved"]
    assert figures["forward moved"]["tokens"] == figures["forward still"]["tokens"] == figures["still"]["tokens"]
    assert figures["forward moved"]["kl_per_answer"] != figures["moved"]["kl_per_answer"]

    refused = run([*command[:-6], "--split", "tset", "--adapter", str(still)], ROOT, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "Invalid value for '--split': 'tset' is not one of 'train', 'val', 'test', 'ood'." in refused.stderr
