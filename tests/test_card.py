"""The model card: written last, from what evaluate and smoke measured, with the dataset's own colours and
size and the decoding that was used; and a new evaluation refreshes it without a new export."""

from __future__ import annotations

import json
import re

import pytest
from conftest import copy_repo, load_params, run, stage

from vgrpo import card

STEM = "Qwen3-VL-tiny-shapes-grpo"  # llama.cpp's naming convention (vgrpo.export.gguf_name)


def card_inputs(repo) -> dict:
    return {"base_dir": repo / "models/base", "adapter_dir": repo / "models/adapter", "gguf_dir": repo / "models/gguf",
            "data_dir": repo / "data/shapes", "eval_metrics": repo / "reports/eval/metrics.json",
            "smoke_metrics": repo / "reports/smoke/metrics.json"}


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
        assert (f"| `{name}` | {m['accuracy']:.3f} | {m['answer_agreement']:.3f} | {m['first_k_token_agreement']:.3f} "
                f"| {m['first_token_logprob_diff']:.3g} | {m['projector_error']:.2g} |") in text
    assert f"| merged model (transformers, float32) | {smoke['hf']['accuracy']:.3f} |" in text
    assert f"greedy, {smoke['num_images']} test images)" in text and "Gate: passed." in text
    assert "Evaluation (transformers, greedy," in text  # evaluate decoded greedily
    assert "red triangles, blue circles, green squares in 256x256 images" in text
    steps = load_params()["profiles"]["tiny"]["base"]["sft_steps"]
    assert f"warm-started by {steps} supervised steps" in text


def test_mtmd_cli_puts_the_image_before_the_text(tiny_pipeline):
    text = (tiny_pipeline / "models/README.md").read_text()
    command = re.search(r"llama-mtmd-cli .*?\n\s+-p \"(.*?)\"", text, re.DOTALL)
    assert command, text
    prompt = command.group(1)
    assert prompt.startswith(card.IMAGE_MARKER + "How many circles are in the image?")
    assert prompt.index(card.IMAGE_MARKER) < prompt.index("How many")
    assert f"--mmproj gguf/mmproj-{STEM}-F16.gguf" in command.group(0)


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
    assert "purple triangles, orange circles, black squares in 192x192 images" in text
    assert "red triangles" not in text and "256x256" not in text
    assert "Evaluation (transformers, sampled at temperature 0.7," in text and "greedy, base vs" not in text


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
    params = repo / "params.yaml"
    params.write_text(params.read_text().replace("      attention_samples: 2", "      attention_samples: 1"))
    return repo


def test_a_new_evaluation_does_not_redo_the_export(evaluate_changed):
    dry = run(["dvc", "repro", "--dry"], evaluate_changed).stdout
    assert "Running stage 'evaluate'" in dry
    assert "Running stage 'export'" not in dry and "Running stage 'smoke'" not in dry
    assert "Running stage 'train'" not in dry


def test_the_card_is_rewritten_after_the_new_evaluation(evaluate_changed):
    before = (evaluate_changed / "models/README.md").read_text()
    done = run(["dvc", "repro"], evaluate_changed).stdout
    assert "Running stage 'card'" in done and "Running stage 'export'" not in done
    assert json.loads((evaluate_changed / "reports/eval/metrics.json").read_text())["test"]["base"][
        "attention_samples"] == 1
    assert (evaluate_changed / "models/README.md").read_text() == before  # same models, same accuracies
    assert "Running stage" not in run(["dvc", "repro"], evaluate_changed).stdout


def test_export_no_longer_writes_a_card(tiny_pipeline):
    assert not (tiny_pipeline / "models/gguf/README.md").exists()
