"""The evaluate stage: base vs trained on the same images and prompt, metrics, predictions, plots,
attention on the image, and bad input that fails before any model loads."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
from conftest import copy_repo, run, stage, tiny_adapter, tiny_params, write_params

from vgrpo import attention, evaluation, generation, models, prompts
from vgrpo.base import base_model_path
from vgrpo.config import config_from_dict
from vgrpo.pass_at_k import pass_rates
from vgrpo.rewards import REWARDS

PER_MODEL = ["samples", "accuracy", "accuracy_ci95", "format_compliance", "description_rate", "unparseable_rate",
             "mean_reasoning_tokens", "rewards", "accuracy_by_shape", "accuracy_by_count", "attention_on_image",
             "attention_samples", "count_stated_rate", "reasoning_count_accuracy", "answer_matches_reasoning"]


# --- Scoring, without a model ------------------------------------------------------------------

def record(answer, parsed, shape="circles", tokens=10, fmt=-2.0, description=0.0, stated=None):
    return {"answer": str(answer), "parsed": parsed, "correct": parsed == answer, "target_shape": shape,
            "reasoning_tokens": tokens, "reasoning_count": stated,
            "rewards": {**dict.fromkeys(REWARDS, 0.0), "format_tags": fmt, "description": description}}


def test_summary_numbers():
    params = config_from_dict(tiny_params()).evaluate
    records = [record(3, 3, fmt=1.0, description=0.5, stated=3), record(3, 2, "squares", stated=3),
               record(7, None, "squares", 30), record(7, 7, tokens=20, stated=6)]
    summary = evaluation.summarize(records, params)
    # counted right twice (3, 3); the answer repeats the stated count once (3), not when it differs
    # (3 -> 2), nor when the reasoning states none (None), nor when it states another (6 -> 7)
    assert summary["reasoning_count_accuracy"] == 0.5 and summary["answer_matches_reasoning"] == 0.25
    assert summary["count_stated_rate"] == 0.75  # the third states no count
    assert summary["accuracy"] == 0.5 and summary["samples"] == 4
    assert summary["unparseable_rate"] == 0.25 and summary["format_compliance"] == 0.25
    assert summary["description_rate"] == 0.25 and summary["mean_reasoning_tokens"] == 17.5
    assert summary["accuracy_by_shape"] == {"circles": 1.0, "squares": 0.0}
    assert summary["accuracy_by_count"] == {"3": 0.5, "7": 0.5}
    low, high = summary["accuracy_ci95"]
    assert 0.0 <= low < 0.5 < high <= 1.0


def test_difference_is_trained_minus_base():
    trained = {"accuracy": 0.75, "rewards": {"format_tags": 1.0}, "accuracy_ci95": [0.5, 1.0], "samples": 4}
    base = {"accuracy": 0.25, "rewards": {"format_tags": -2.0}, "accuracy_ci95": [0.0, 0.5], "samples": 4}
    assert evaluation.difference(trained, base) == {"accuracy": 0.5, "rewards": {"format_tags": 3.0}}


def test_gain_carries_interval_p_and_discordant_counts():
    params = config_from_dict(tiny_params()).evaluate
    base = [record(2, 2), record(3, 1), record(1, 1), record(4, 0)]
    trained = [record(2, 2), record(3, 3), record(1, 0), record(4, 4)]
    g = evaluation.gain(base, trained, params)
    assert g["accuracy"] == 0.25 and (g["only_trained_right"], g["only_base_right"]) == (2, 1)
    assert g["mcnemar_p"] == 1.0 and len(g["accuracy_ci95"]) == 2


def test_reasoning_text_rule():
    assert prompts.reasoning_text("<REASONING>two blue</REASONING><SOLUTION>2</SOLUTION>") == "two blue"
    assert prompts.reasoning_text("I count 2 circles <SOLUTION>2</SOLUTION>") == "I count 2 circles "


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
    batched = generation.generate(model, processor, rows, max_new_tokens=12)
    single = [generation.generate(model, processor, [row], max_new_tokens=12)[0] for row in rows]
    assert batched == single


def test_attention_share_and_grid(model_and_rows):
    config, model, processor, rows = model_and_rows
    attention.with_eager_attention(model)
    completion = generation.generate(model, processor, rows[:1], config.evaluate.max_new_tokens)[0]
    share, grid = attention.image_attention(model, processor, rows[0], completion)
    assert grid.shape == (8, 8)  # 64 image tokens for 256x256
    assert 0.0 < share < 1.0
    assert np.isclose(grid.sum(), share, atol=1e-4)
    image = attention.heatmap(rows[0]["image"], grid, float(grid.min()), float(grid.max()))
    assert image.size == rows[0]["image"].size


def test_heatmaps_share_one_colour_scale(model_and_rows):
    """The same attention value is the same red in the base and the trained panel: each panel scaled to its
    own range would paint cell (7, 7), 0.1 in both, full red in one and faint in the other."""
    _, _, _, rows = model_and_rows
    image = rows[0]["image"]
    base, trained = np.full((8, 8), 0.1), np.full((8, 8), 0.1)
    base[1, 1] = trained[1, 1] = 0.0
    trained[0, 0] = 0.9
    low, high = min(base.min(), trained.min()), max(base.max(), trained.max())
    panels = [np.asarray(attention.heatmap(image, grid, low, high)).astype(int) for grid in (base, trained)]
    cell = (slice(224, 256), slice(224, 256))  # cell (7, 7), 32 px per cell
    assert (panels[0][cell] == panels[1][cell]).all()
    own_scale = [np.asarray(attention.heatmap(image, grid, grid.min(), grid.max())).astype(int)
                 for grid in (base, trained)]
    assert not (own_scale[0][cell] == own_scale[1][cell]).all()  # what the shared scale prevents


def test_the_attention_sheet_titles_its_panels_and_shows_its_scale(model_and_rows):
    """image | base | trained, each under a title, and a colour bar from the shared scale's low (white) to its
    high (the heatmaps' full red) on the right, the question below."""
    _, _, _, rows = model_and_rows
    image = rows[0]["image"]
    grids = {"base": np.full((8, 8), 0.01), "trained": np.full((8, 8), 0.02)}
    sheet = attention.attention_sheet(image, grids, 0.01, 0.02, rows[0]["question"])
    width, height = image.size
    assert sheet.size == (3 * width + attention.BAR_WIDTH, height + 2 * attention.TITLE_HEIGHT)
    pixels = np.asarray(sheet).astype(int)
    titles = pixels[:attention.TITLE_HEIGHT, : 3 * width]
    assert (titles < 128).any(axis=2).any()  # dark text on white above the panels
    bar = pixels[attention.TITLE_HEIGHT:attention.TITLE_HEIGHT + height, 3 * width + 9]
    assert tuple(bar[1]) == (255, 102, 102) and (bar[-2] >= 250).all()  # high (red) at the top, low (white) below
    assert np.array_equal(pixels[attention.TITLE_HEIGHT:attention.TITLE_HEIGHT + height, :width],
                          np.asarray(image.convert("RGB")).astype(int))  # the image itself, unchanged


# --- The stage, end to end --------------------------------------------------------------------

@pytest.mark.slow
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
            assert metrics[split][name]["attention_samples"] == params.attention_samples
        gain = metrics[split]["trained_minus_base"]
        assert {"accuracy", "accuracy_ci95", "mcnemar_p", "only_trained_right", "only_base_right"} <= set(gain)
        assert gain["accuracy_ci95"][0] <= gain["accuracy"] <= gain["accuracy_ci95"][1] and 0 < gain["mcnemar_p"] <= 1
    assert set(metrics["ood"]["base"]["accuracy_by_count"]) <= {"6", "7", "8"}
    n, images = max(params.pass_k), params.pass_samples["test"]
    for name in ("base", "trained"):  # pass@k from each sampled image's right answers, which it keeps
        rates = metrics["test"][name]["pass_at_k"]
        assert (rates["images"], rates["samples_per_image"], len(rates["right_per_image"])) == (images, n, images)
        assert all(0 <= right <= n for right in rates["right_per_image"])
        assert {k: v for k, v in rates.items() if k.startswith("pass@")} == pass_rates(rates["right_per_image"], n,
                                                                                      params.pass_k)
    assert metrics["speed"]["samples_per_second"] > 0
    assert metrics["decoding"] == {"do_sample": False, "temperature": None, "max_new_tokens": params.max_new_tokens}

    lines = [json.loads(line) for line in (reports / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * sum(params.max_samples[split] for split in params.splits)
    for key in ("id", "split", "model", "question", "answer", "completion", "parsed", "correct", "rewards",
                "reasoning_count"):
        assert key in lines[0]
    assert set(lines[0]["rewards"]) == set(REWARDS)
    base = {(r["split"], r["id"]): r["question"] for r in lines if r["model"] == "base"}
    trained = {(r["split"], r["id"]): r["question"] for r in lines if r["model"] == "trained"}
    assert base == trained  # same samples, same questions

    plots = reports / "plots"
    header = (plots / "accuracy_by_count.csv").read_text().splitlines()
    assert header[0] == "count,range,base,trained"
    assert any(",out of range," in line for line in header) and any(",in range," in line for line in header)
    assert (plots / "confusion_trained.csv").read_text().startswith("actual,predicted\n")
    lengths = (plots / "accuracy_by_reasoning_length.csv").read_text().splitlines()
    assert lengths[0] == "reasoning_tokens,base,trained,base_samples,trained_samples"
    assert all(line.split(",")[0].isdigit() for line in lengths[1:]) and len(lengths) > 1  # a number on x
    assert len(list((reports / "attention").glob("*.png"))) == params.attention_samples * len(params.splits)


def quantitative_fields(spec: dict) -> set[str]:
    """Fields a Vega-Lite spec draws on a numeric axis (x or y, at any depth of layers and facets)."""
    found = set()
    if isinstance(spec, dict):
        for channel in ("x", "y"):
            encoding = spec.get("encoding", {}).get(channel)
            if isinstance(encoding, dict) and encoding.get("type") == "quantitative" and "field" in encoding:
                found.add(encoding["field"])
        for value in spec.values():
            found |= quantitative_fields(value)
    elif isinstance(spec, list):
        for value in spec:
            found |= quantitative_fields(value)
    return found


@pytest.mark.slow
def test_every_declared_plot_renders_with_data(tiny_pipeline, tmp_path):
    """`dvc plots show` on the tiny run: every plot dvc.yaml declares is there, has data points, and every
    value on a numeric axis is a number (Vega-Lite drops a point whose x is text)."""
    import yaml

    shown = json.loads(run(["dvc", "plots", "show", "--json"], tiny_pipeline).stdout)["data"]
    pipeline = yaml.safe_load((tiny_pipeline / "dvc.yaml").read_text())
    titles = [next(iter(plot)) for plot in pipeline["plots"]]
    assert set(titles) <= set(shown), set(titles) - set(shown)
    assert any(name.startswith("reports/eval/attention/") for name in shown)
    # only the charts worth reading: not one per logged value, no end-of-run figure drawn as a one-point curve
    assert len(shown) == len(titles) + len(list((tiny_pipeline / "reports/eval/attention").glob("*.png")))
    for name, renders in shown.items():
        for render in renders:
            if render["type"] == "image":
                assert (tiny_pipeline / name).stat().st_size > 0, name
                continue
            values = render["content"]["data"]["values"]
            assert values, f"{name}: no data points"
            for field in quantitative_fields(render["content"]):
                numbers = [row[field] for row in values if field in row]
                assert numbers, (name, field)
                for number in numbers:
                    float(number)  # raises on text such as "0000-15"
    out = tmp_path / "plots"
    run(["dvc", "plots", "show", "-o", str(out)], tiny_pipeline)
    html = (out / "index.html").read_text()
    assert "Accuracy by reasoning length" in html and "Confusion, trained" in html and "attention" in html
    assert "GRPO reward per step" in html and "reports/train/plots/metrics/train/reward.tsv" not in titles


@pytest.mark.slow
def test_dvc_metrics_show(tiny_pipeline):
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], tiny_pipeline).stdout)
    files = next(iter(shown.values()))["data"]
    assert set(files) == {"reports/train/headline.json", "reports/eval/headline.json", "reports/smoke/headline.json"}


@pytest.mark.slow
def test_changing_an_evaluate_param_reruns_evaluate_only(tiny_pipeline, tmp_path):
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    assert "Running stage" not in run(["dvc", "repro"], repo).stdout  # all up to date
    result = run(["dvc", "exp", "run", "-S", "profile=tiny", "-S", "evaluate.batch_size=4"], repo)
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
    assert line == f"error: params.yaml: {message}"


@pytest.mark.slow
def test_a_warm_start_with_a_brief_style_is_also_evaluated_made_to_describe(tiny_dataset, tiny_base, tmp_path):
    """Where the warm start knows a brief answer style (source.json: described_share < 1), evaluate also
    answers with it made to describe (the brief style's first token forbidden), and compares the trained
    model with that, paired: the baseline for what GRPO added (the card and the README use it)."""
    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    source = json.loads((base / "source.json").read_text())
    source["warm_start"].update(described_share=0.4, brief_answers="guessed")
    (base / "source.json").write_text(json.dumps(source))
    adapter = tiny_adapter(tmp_path / "adapter", tiny_base)
    params = write_params(tmp_path / "params.yaml", tiny_params(evaluate={
        "splits": ["test"], "max_samples": {"test": 4}, "attention_samples": 0}))
    result = stage("evaluate", "--params", str(params), "--data", str(tiny_dataset), "--base", str(base),
                   "--adapter", str(adapter), "--reports", str(tmp_path / "reports"))
    assert result.returncode == 0, result.stderr[-2000:]
    test = json.loads((tmp_path / "reports/metrics.json").read_text())["test"]
    assert test["base_described"]["samples"] == 4 and "accuracy_ci95" in test["trained_minus_base_described"]
    assert "mcnemar_p" in test["trained_minus_base_described"]
    assert re.search(r"test: warm start made to describe [0-9.]+ -> trained [0-9.]+ \([+-][0-9.]+, paired 95% CI",
                     result.stdout)
    records = [json.loads(line) for line in (tmp_path / "reports/predictions.jsonl").read_text().splitlines()]
    described = [r["completion"] for r in records if r["model"] == "base_described"]
    assert len(described) == 4 and not any("I count" in c for c in described)
