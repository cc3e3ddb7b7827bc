"""The model card: written last, from what evaluate and smoke measured, with the dataset's own colours and
size and the decoding that was used; and a new evaluation refreshes it without a new export."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import copy_repo, profile_params, run, stage

from vgrpo import card

STEM = "Qwen3-VL-tiny-shapes-grpo"  # llama.cpp's naming convention (vgrpo.export.gguf_name)


def card_inputs(repo) -> dict:
    return {"base_dir": repo / "models/base", "adapter_dir": repo / "models/adapter", "gguf_dir": repo / "models/gguf",
            "data_dir": repo / "data/shapes", "eval_metrics": repo / "reports/eval/metrics.json",
            "smoke_metrics": repo / "reports/smoke/metrics.json"}


@pytest.mark.slow
def test_card_states_what_evaluate_and_smoke_measured(tiny_pipeline):
    text = (tiny_pipeline / "models/README.md").read_text()
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())
    smoke = json.loads((tiny_pipeline / "reports/smoke/metrics.json").read_text())
    test = evaluation["test"]
    low, high = test["trained_minus_base"]["accuracy_ci95"]
    gain = test["trained_minus_base"]
    assert (f"| test | {test['base']['samples']} | {test['base']['accuracy']:.3f} | {test['trained']['accuracy']:.3f} "
            f"| {gain['accuracy']:+.3f} [{low:+.3f}, {high:+.3f}] | {gain['mcnemar_p']:.3g} |") in text
    for name, m in smoke["files"].items():
        assert (f"| `{name}` | {m['accuracy']:.3f} | {m['answer_agreement']:.3f} | {m['count_agreement']:.3f} "
                f"| {m['template_agreement']:.3f} | {m['count_tv']:.3g} | {m['image_sensitivity']:.3g} "
                f"| {m['projector_error']:.2g} |") in text
    assert f"| merged model (transformers, float32) | {smoke['hf']['accuracy']:.3f} |" in text
    assert f"greedy, {smoke['num_images']} test images)" in text and "Gate: passed." in text
    assert "Evaluation (transformers, greedy," in text  # evaluate decoded greedily
    assert "Trained on red triangles, blue circles, green squares on white 256x256 images only" in text
    assert "1..5 of the asked shape and 1..5 of each other shape, 6..8 of the asked shape in `ood`" in text
    steps = profile_params("tiny")["base"]["sft_steps"]
    assert f"warm-started by {steps} supervised steps" in text
    assert "## What GRPO did" not in text  # the tiny warm start has one answer style


@pytest.mark.slow
def test_card_starts_with_hugging_face_metadata(tiny_pipeline):
    """base_model (for a hub base), license, pipeline tag, tags and a model-index with the test results, as
    huggingface_hub reads them back."""
    from huggingface_hub import ModelCard

    text = (tiny_pipeline / "models/README.md").read_text()
    assert text.startswith("---\n")
    data = ModelCard(text).data
    assert (data.license, data.pipeline_tag, data.base_model) == ("apache-2.0", "image-text-to-text", None)
    assert {"qwen3_vl", "grpo", "gguf", "llama.cpp"} <= set(data.tags)
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())
    results = {r.dataset_split: r.metric_value for r in data.eval_results}
    # test and ood: val chose the recipe's step count, so its figure is no result
    assert results == {split: round(evaluation[split]["trained"]["accuracy"], 4) for split in ("test", "ood")}
    assert data.model_name == STEM


@pytest.mark.slow
def test_the_title_claims_what_the_runs_show(tiny_pipeline):
    """Not "post-trained with GRPO to count shapes": a tiny CPU run is a demonstration of the pipeline."""
    title = (tiny_pipeline / "models/README.md").read_text().split("\n# ", 1)[1].splitlines()[0]
    assert title == (f"{STEM}: a tiny Qwen3-VL from the pipeline's CPU run, GRPO with a LoRA on a shape-counting "
                     "task (GGUF for llama.cpp)")
    assert "to count shapes" not in title


@pytest.mark.slow
def test_mtmd_cli_puts_the_image_before_the_text(tiny_pipeline):
    text = (tiny_pipeline / "models/README.md").read_text()
    command = re.search(r"llama-mtmd-cli .*?\n\s+-p \"(.*?)\"", text, re.DOTALL)
    assert command, text
    prompt = command.group(1)
    assert prompt.startswith(card.IMAGE_MARKER + "How many circles are in the image?")
    assert prompt.index(card.IMAGE_MARKER) < prompt.index("How many")
    assert f"--mmproj gguf/mmproj-{STEM}-F16.gguf" in command.group(0)
    assert "--temp 0 --no-repack" in command.group(0)  # the AMX crash: the command carries the cure
    run_it = text.split("## Run it", 1)[1].split("llama-mtmd-cli -m", 1)[0]  # said beside the command, not in Limits
    assert "`--no-repack` keeps llama.cpp off its repacked CPU weights" in run_it


@pytest.mark.slow
def test_card_follows_the_data_and_the_decoding(tiny_pipeline, tmp_path):
    """Other colours, another image size, sampled decoding: the card says so instead of the defaults."""
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    stats_path = repo / "data/shapes/stats.json"
    stats = json.loads(stats_path.read_text())
    stats["params"]["colours"] = {"triangles": "purple", "circles": "orange", "squares": "black"}
    stats["params"]["image_size"] = 192
    stats_path.unlink()  # a DVC link into the cache: write a file of its own
    stats_path.write_text(json.dumps(stats))
    eval_path = repo / "reports/eval/metrics.json"
    evaluation = json.loads(eval_path.read_text())
    evaluation["decoding"] = {"do_sample": True, "temperature": 0.7, "max_new_tokens": 32}
    eval_path.unlink()
    eval_path.write_text(json.dumps(evaluation))
    text = card.model_card(**card_inputs(repo))
    assert "purple triangles, orange circles, black squares on white 192x192 images" in text
    assert "red triangles" not in text and "256x256" not in text
    assert "Evaluation (transformers, sampled at temperature 0.7," in text and "greedy, base vs" not in text


def write_json(path, data) -> None:
    path.unlink()  # a DVC link into the cache: write a file of its own
    path.write_text(json.dumps(data))


@pytest.mark.slow
def test_card_of_a_cpu_run_states_its_baseline(tiny_pipeline, tmp_path):
    """The cpu profile's data (0..3 of each other shape, one shape per cell) and its warm start (two answer
    styles, the brief one a guess): the card says the greedy baseline is a guess's, and gives the warm start
    made to describe next to the trained model, with the paired interval and McNemar's p; a hub base is
    the metadata's base_model."""
    from huggingface_hub import ModelCard

    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    stats = json.loads((repo / "data/shapes/stats.json").read_text())
    stats["params"].update(other_min_count=0, other_max_count=3, layout="grid", image_size=128)
    write_json(repo / "data/shapes/stats.json", stats)
    source = json.loads((repo / "models/base/source.json").read_text())
    source["warm_start"].update(described_share=0.4, brief_answers="guessed")
    write_json(repo / "models/base/source.json", source)
    evaluation = json.loads((repo / "reports/eval/metrics.json").read_text())
    test = evaluation["test"]
    test["base"]["accuracy"], test["trained"]["accuracy"] = 0.2, 0.72
    test["base_described"] = {**test["base"], "accuracy": 0.69}
    test["trained_minus_base_described"] = {**test["trained_minus_base"], "accuracy": 0.03,
                                            "accuracy_ci95": [-0.02, 0.08], "mcnemar_p": 0.31}
    test["base"]["pass_at_k"] = {"pass@1": 0.41, "pass@16": 0.95, "images": 64, "samples_per_image": 16}
    test["trained"]["pass_at_k"] = {"pass@1": 0.77, "pass@16": 0.81, "images": 64, "samples_per_image": 16}
    write_json(repo / "reports/eval/metrics.json", evaluation)
    text = card.model_card(**card_inputs(repo))
    flat = " ".join(text.split())
    assert "1..5 of the asked shape and 0..3 of each other shape" in flat and "one shape per 32 px cell" in flat
    assert "and their number is a guess by design (`base.brief_answers: guessed`)" in flat
    assert "its greedy accuracy (20.0% on the test images) is a guess's" in flat
    assert ("Made to describe (the brief style's first token forbidden), the warm start answers 69.0% of them right; "
            "after GRPO, 72.0%: a difference of +3.0 points (paired 95% CI [-2.0, +8.0], McNemar p = 0.31).") in flat
    assert ("Sampled as GRPO samples (16 answers to each of 64 test images), warm start -> after GRPO: pass@1 41.0% -> "
            "77.0%, pass@16 95.0% -> 81.0%.") in flat  # selection or capability: pass@k beside pass@1
    assert not re.search(r"^[-+]\d", text, re.MULTILINE)  # no figure at a line's start: Markdown would list it
    assert "| test | " in text.split("## What GRPO did")[1].split("## ")[0]  # its own table
    assert ModelCard(text).data.base_model is None
    source.update(kind="hub", name="Qwen/Qwen3-VL-8B-Instruct", revision="main", sha="0" * 40)
    write_json(repo / "models/base/source.json", source)
    assert ModelCard(card.model_card(**card_inputs(repo))).data.base_model == "Qwen/Qwen3-VL-8B-Instruct"


@pytest.mark.slow
def test_missing_smoke_metrics_is_one_line(tiny_pipeline, tmp_path):
    inputs = card_inputs(tiny_pipeline)
    result = stage("card", *[arg for key, path in {**inputs, "smoke_metrics": tmp_path / "none.json"}.items()
                             for arg in (f"--{key.replace('_dir', '').replace('_', '-')}", str(path))],
                   "--out", str(tmp_path / "README.md"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"error: {tmp_path / 'none.json'}: not found (run the smoke "
                                                      "stage: dvc repro smoke)")
    assert not (tmp_path / "README.md").exists()


@pytest.fixture(scope="module")
def evaluate_changed(tiny_pipeline, tmp_path_factory):
    repo = copy_repo(tiny_pipeline, tmp_path_factory.mktemp("changed") / "repo")
    params = repo / "params.yaml"  # as composed for the run: edited in place, as `dvc repro` takes it
    raw = yaml.safe_load(params.read_text())
    assert raw["evaluate"]["attention_samples"] == 2
    raw["evaluate"]["attention_samples"] = 1
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    return repo


@pytest.mark.slow
def test_a_new_evaluation_does_not_redo_the_export(evaluate_changed):
    dry = run(["dvc", "repro", "--dry"], evaluate_changed).stdout
    assert "Running stage 'evaluate'" in dry
    assert "Running stage 'export'" not in dry and "Running stage 'smoke'" not in dry
    assert "Running stage 'train'" not in dry


@pytest.mark.slow
def test_the_card_is_rewritten_after_the_new_evaluation(evaluate_changed):
    before = (evaluate_changed / "models/README.md").read_text()
    done = run(["dvc", "repro"], evaluate_changed).stdout
    assert "Running stage 'card'" in done and "Running stage 'export'" not in done
    assert "Running stage 'smoke'" not in done  # evaluate's predictions are the same: nothing for smoke to redo
    assert json.loads((evaluate_changed / "reports/eval/metrics.json").read_text())["test"]["base"][
        "attention_samples"] == 1
    assert (evaluate_changed / "models/README.md").read_text() == before  # same models, same accuracies
    assert "Running stage" not in run(["dvc", "repro"], evaluate_changed).stdout


@pytest.mark.slow
def test_export_no_longer_writes_a_card(tiny_pipeline):
    assert not (tiny_pipeline / "models/gguf/README.md").exists()


@pytest.mark.parametrize("profile, expected", [
    ("tiny", "synthetic 256x256 px images, shapes never overlap, every label re-counted by an independent counter; "
             "splits train 64; 1..5 of the asked shape and 1..5 of each other shape, 6..8 of the asked shape in `ood` "
             "(above the training range)"),
    ("cpu", "synthetic 128x128 px images, one shape per 32 px cell, shapes never overlap, every label re-counted by an "
            "independent counter; splits train 600; 1..5 of the asked shape and 0..3 of each other shape, 6..8 of the "
            "asked shape in `ood` (above GRPO's training range, within the warm start's 1..8)"),
])
def test_the_data_line_is_right_for_every_profile(profile, expected):
    """The card's data line from each profile's own generate params (the cpu profile has 0..3 of the others, and
    its warm start saw the OOD counts)."""
    data = profile_params(profile)["generate"]
    size = f"{data['image_size']}x{data['image_size']}"
    assert card.data_line(data, size, f"train {data['train_size']}") == expected


@pytest.mark.parametrize("warmup_max_count, ood_range", [
    (8, "above GRPO's training range, within the warm start's 1..8"), (None, "above the training range"),
    (5, "above the training range")])
def test_the_data_line_says_when_the_warm_start_saw_the_ood_counts(warmup_max_count, ood_range):
    """With `generate.warmup_max_count` above the training range, OOD is above GRPO's range only: the card
    must not call it above the training range (and must, when the warm start saw 1..5 alone)."""
    data = {**profile_params("cpu")["generate"], "warmup_max_count": warmup_max_count}
    line = card.data_line(data, "128x128", "train 600")
    assert line.endswith(f"6..8 of the asked shape in `ood` ({ood_range})")
