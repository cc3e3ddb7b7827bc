"""The evaluate stage: base vs trained on the same images and prompt, metrics, predictions, plots,
attention on the image, and bad input that fails before any model loads."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import copy_repo, run, stage, tiny_params, write_params

from vgrpo import evaluation, models
from vgrpo.base import base_model_path
from vgrpo.config import config_from_dict

PER_MODEL = ["samples", "accuracy", "accuracy_ci95", "format_compliance", "description_rate", "unparseable_rate",
             "mean_reasoning_tokens", "rewards", "accuracy_by_shape", "accuracy_by_count", "attention_on_image"]


# --- Scoring, without a model ------------------------------------------------------------------

def record(answer, parsed, shape="circles", tokens=10, fmt=-2.0, description=0.0):
    return {"answer": str(answer), "parsed": parsed, "correct": parsed == answer, "target_shape": shape,
            "reasoning_tokens": tokens, "rewards": {"correctness_tags": 0.0, "format_tags": fmt,
                                                    "correctness_free": 0.0, "description": description,
                                                    "reasoning": 0.0}}


def test_summary_numbers():
    params = config_from_dict(tiny_params()).evaluate
    records = [record(3, 3, fmt=1.0, description=0.5), record(3, 2, "squares"), record(7, None, "squares", 30),
               record(7, 7, tokens=20)]
    summary = evaluation.summarize(records, params)
    assert summary["accuracy"] == 0.5 and summary["samples"] == 4
    assert summary["unparseable_rate"] == 0.25 and summary["format_compliance"] == 0.25
    assert summary["description_rate"] == 0.25 and summary["mean_reasoning_tokens"] == 17.5
    assert summary["accuracy_by_shape"] == {"circles": 1.0, "squares": 0.0}
    assert summary["accuracy_by_count"] == {"3": 0.5, "7": 0.5}
    low, high = summary["accuracy_ci95"]
    assert 0.0 <= low < 0.5 < high <= 1.0


def test_bootstrap_interval_is_seeded_and_narrows_with_more_data():
    few = [True, False] * 5
    many = [True, False] * 500
    assert evaluation.bootstrap_ci(few, 1000, 0) == evaluation.bootstrap_ci(few, 1000, 0)
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(evaluation.bootstrap_ci(many, 1000, 0)) < width(evaluation.bootstrap_ci(few, 1000, 0))
    assert evaluation.bootstrap_ci([True] * 20, 500, 1) == [1.0, 1.0]


def test_difference_is_trained_minus_base():
    trained = {"accuracy": 0.75, "rewards": {"format_tags": 1.0}, "accuracy_ci95": [0.5, 1.0], "samples": 4}
    base = {"accuracy": 0.25, "rewards": {"format_tags": -2.0}, "accuracy_ci95": [0.0, 0.5], "samples": 4}
    assert evaluation.difference(trained, base) == {"accuracy": 0.5, "rewards": {"format_tags": 3.0}}


def test_reasoning_text_rule():
    assert evaluation.reasoning_text("<REASONING>two blue</REASONING><SOLUTION>2</SOLUTION>") == "two blue"
    assert evaluation.reasoning_text("I count 2 circles <SOLUTION>2</SOLUTION>") == "I count 2 circles "


# --- The model side --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_and_rows(tiny_base, tmp_path_factory):
    from vgrpo import shapes

    config = config_from_dict(tiny_params())
    g = dataclasses.replace(config.generate, train_size=1, val_size=6, test_size=1, ood_size=1)
    out = tmp_path_factory.mktemp("rows") / "shapes"
    shapes.write_dataset(shapes.generate_samples(g), g, out)
    rows = [shapes.load_dataset(out)["val"][i] for i in range(6)]
    path = base_model_path(tiny_base)
    return config, models.load_model(path, "float32").eval(), models.load_processor(path, config.model), rows


def test_batched_greedy_equals_one_at_a_time(model_and_rows):
    config, model, processor, rows = model_and_rows
    params = dataclasses.replace(config.evaluate, max_new_tokens=12)
    batched = evaluation.generate(model, processor, rows, dataclasses.replace(params, batch_size=6))
    single = [evaluation.generate(model, processor, [row], dataclasses.replace(params, batch_size=1))[0]
              for row in rows]
    assert batched == single


def test_attention_share_and_grid(model_and_rows):
    config, model, processor, rows = model_and_rows
    evaluation.with_eager_attention(model)
    completion = evaluation.generate(model, processor, rows[:1], config.evaluate)[0]
    share, grid = evaluation.image_attention(model, processor, rows[0], completion)
    assert grid.shape == (8, 8)  # 64 image tokens for 256x256
    assert 0.0 < share < 1.0
    assert np.isclose(grid.sum(), share, atol=1e-4)
    image = evaluation.heatmap(rows[0]["image"], grid)
    assert image.size == rows[0]["image"].size


# --- The stage, end to end --------------------------------------------------------------------

def test_metrics_predictions_plots_and_heatmaps(tiny_pipeline):
    reports = tiny_pipeline / "reports" / "eval"
    metrics = json.loads((reports / "metrics.json").read_text())
    params = config_from_dict(tiny_params()).evaluate
    for split in params.splits:
        assert set(metrics[split]) == {"base", "trained", "trained_minus_base"}
        for name in ("base", "trained"):
            assert set(PER_MODEL) <= set(metrics[split][name]), (split, name)
            assert metrics[split][name]["samples"] == params.max_samples[split]
            assert 0.0 <= metrics[split][name]["attention_on_image"] <= 1.0
        assert "accuracy" in metrics[split]["trained_minus_base"]
    assert set(metrics["ood"]["base"]["accuracy_by_count"]) <= {"6", "7", "8"}
    assert metrics["speed"]["samples_per_second"] > 0

    lines = [json.loads(line) for line in (reports / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * sum(params.max_samples[split] for split in params.splits)
    for key in ("id", "split", "model", "question", "answer", "completion", "parsed", "correct", "rewards"):
        assert key in lines[0]
    assert set(lines[0]["rewards"]) == {"correctness_tags", "format_tags", "correctness_free", "description",
                                        "reasoning"}
    base = {(r["split"], r["id"]): r["question"] for r in lines if r["model"] == "base"}
    trained = {(r["split"], r["id"]): r["question"] for r in lines if r["model"] == "trained"}
    assert base == trained  # same samples, same questions

    plots = reports / "plots"
    header = (plots / "accuracy_by_count.csv").read_text().splitlines()
    assert header[0] == "count,range,base,trained"
    assert any(",out of range," in line for line in header) and any(",in range," in line for line in header)
    assert (plots / "confusion_trained.csv").read_text().startswith("actual,predicted\n")
    assert (plots / "accuracy_by_reasoning_length.csv").exists()
    assert len(list((reports / "attention").glob("*.png"))) == params.attention_samples * len(params.splits)


def test_dvc_metrics_and_plots_show(tiny_pipeline, tmp_path):
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], tiny_pipeline).stdout)
    files = next(iter(shown.values()))["data"]
    assert "reports/eval/metrics.json" in files and "reports/train/metrics.json" in files
    out = tmp_path / "plots"
    run(["dvc", "plots", "show", "--json", "-o", str(out)], tiny_pipeline)
    result = run(["dvc", "plots", "show", "-o", str(out)], tiny_pipeline)
    html = (out / "index.html").read_text()
    assert "Accuracy by true count" in html and "Confusion, trained" in html
    assert "attention" in html and result.returncode == 0


def test_changing_an_evaluate_param_reruns_evaluate_only(tiny_pipeline, tmp_path):
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    assert "Running stage" not in run(["dvc", "repro"], repo).stdout  # all up to date
    result = run(["dvc", "exp", "run", "-S", "profiles.tiny.evaluate.batch_size=4"], repo)
    assert "Running stage 'evaluate'" in result.stdout
    assert "Running stage 'generate'" not in result.stdout and "Running stage 'train'" not in result.stdout


# --- Bad input: one line, exit 2, nothing loaded -----------------------------------------------

def evaluate_stage(tmp_path, params_raw, data, adapter, base):
    params = write_params(tmp_path / "params.yaml", params_raw)
    result = stage("evaluate", "--params", str(params), "--data", str(data), "--base", str(base), "--adapter",
                   str(adapter), "--reports", str(tmp_path / "reports"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Loading weights" not in result.stderr  # no model was loaded
    assert not (tmp_path / "reports").exists()
    return result.stderr.strip().splitlines()[-1]


def fake_adapter(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"")  # present: the stage must stop on the other input
    return adapter


def test_missing_adapter(tmp_path, tiny_dataset, tiny_base):
    line = evaluate_stage(tmp_path, tiny_params(), tiny_dataset, tmp_path / "nowhere", tiny_base)
    assert line == f"error: {tmp_path / 'nowhere'}: no LoRA adapter here (run the train stage: dvc repro train)"


def test_missing_dataset(tmp_path, tiny_base):
    line = evaluate_stage(tmp_path, tiny_params(), tmp_path / "nodata", fake_adapter(tmp_path), tiny_base)
    assert "no dataset here (run the generate stage" in line


def test_missing_base(tmp_path, tiny_dataset):
    line = evaluate_stage(tmp_path, tiny_params(), tiny_dataset, fake_adapter(tmp_path), tmp_path / "nobase")
    assert line == f"error: {tmp_path / 'nobase' / 'source.json'}: no base model recorded here (run the base stage: " \
                   "dvc repro base)"


def test_split_missing_from_the_dataset_lists_the_real_ones(tmp_path, tiny_dataset, tiny_base):
    import shutil

    data = tmp_path / "shapes"
    shutil.copytree(tiny_dataset, data)
    shutil.rmtree(data / "ood")
    (data / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "val", "test"]}))
    line = evaluate_stage(tmp_path, tiny_params(), data, fake_adapter(tmp_path), tiny_base)
    assert line == f"error: {data}: no split 'ood' (the dataset has train, val, test)"


@pytest.mark.parametrize("changes, message", [
    ({"splits": ["val", "holdout"]}, "evaluate.splits[1]: expected one of train, val, test, ood, got 'holdout'"),
    ({"batch_size": 0}, "evaluate.batch_size: expected an integer >= 1, got 0"),
    ({"max_samples": {"val": 16, "test": 0, "ood": 16}}, "evaluate.max_samples.test: expected an integer >= 1, got 0"),
])
def test_bad_evaluate_params(changes, message, tmp_path, tiny_dataset, tiny_base):
    line = evaluate_stage(tmp_path, tiny_params(evaluate=changes), tiny_dataset, fake_adapter(tmp_path), tiny_base)
    assert line == f"error: params.yaml: profiles.tiny.{message}"
