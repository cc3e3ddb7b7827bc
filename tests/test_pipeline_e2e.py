"""The CPU demo end to end: `dvc exp run -S profile=tiny` through `smoke` in a throwaway clone."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from conftest import copy_repo, profile_params, run

pytestmark = pytest.mark.slow  # the whole tiny pipeline under DVC

# The README's `dvc exp show` line: the headline columns only.
EXP_SHOW = r"dvc exp show --drop '.*' --keep 'Experiment|profile|test\.(trained|gain|low|high)$|ood\.trained|passed'"


def declared(repo, kind: str) -> list[str]:
    """Paths that dvc.yaml declares as `kind` (metrics or plots) in its stages."""
    stages = yaml.safe_load((repo / "dvc.yaml").read_text())["stages"]
    paths = []
    for stage in stages.values():
        for entry in stage.get(kind, []):
            paths.append(entry if isinstance(entry, str) else next(iter(entry)))
    return paths


def test_every_stage_ran(tiny_pipeline):
    log = (tiny_pipeline / "exp-run.log").read_text()
    for stage in ("generate", "base", "train", "evaluate", "export", "smoke"):
        assert f"Running stage '{stage}'" in log, stage
    assert re.search(r"evaluate: 100%\|.*\| (\d+)/\1 .*sample/s\]", log)  # progress bar: total, samples/s
    assert "Running stage" not in run(["dvc", "repro"], tiny_pipeline).stdout  # nothing left to do
    assert (tiny_pipeline / "models/adapter/adapter_model.safetensors").exists()
    assert (tiny_pipeline / "reports/train/plots/metrics/train/reward.tsv").exists()  # DVCLive curves
    assert json.loads((tiny_pipeline / "reports/train/metrics.json").read_text())["backend"] == "hf"


def test_every_declared_metric_file_exists_and_parses(tiny_pipeline):
    metrics = declared(tiny_pipeline, "metrics")
    assert metrics == ["reports/train/headline.json", "reports/eval/headline.json", "reports/smoke/headline.json"]
    for path in metrics:
        assert isinstance(json.loads((tiny_pipeline / path).read_text()), dict), path


def test_metrics_show_has_about_a_dozen_numbers(tiny_pipeline):
    """The headline files `dvc metrics show` and `dvc exp show` print; every figure stays in the stages'
    metrics.json outputs."""
    shown = json.loads(run(["dvc", "metrics", "show", "--json"], tiny_pipeline).stdout)
    numbers = []

    def leaves(value):
        if isinstance(value, dict):
            for item in value.values():
                leaves(item)
        else:
            numbers.append(value)

    for files in shown.values():
        for data in files["data"].values():
            leaves(data["data"])
    assert 10 <= len(numbers) <= 16, numbers
    headline = json.loads((tiny_pipeline / "reports/eval/headline.json").read_text())
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())
    assert headline["test"]["trained"] == evaluation["test"]["trained"]["accuracy"]
    interval = evaluation["test"]["trained_minus_base"]["accuracy_ci95"]
    assert [headline["test"]["low"], headline["test"]["high"]] == interval
    assert json.loads((tiny_pipeline / "reports/smoke/headline.json").read_text())["passed"] is True


def test_the_readmes_exp_show_fits_120_columns(tiny_pipeline):
    """The README's `dvc exp show` line: the run's headline in a table no wider than a 120-column terminal,
    nothing cut (DVC cuts columns it cannot fit with an ellipsis)."""
    from conftest import ROOT

    assert EXP_SHOW in (ROOT / "README.md").read_text()
    result = run(f"COLUMNS=120 {EXP_SHOW} --no-pager", tiny_pipeline)
    rows = result.stdout.splitlines()
    assert rows and max(len(row.rstrip()) for row in rows) <= 120 and "…" not in result.stdout, result.stdout
    header = next(row for row in rows if "Experiment" in row)
    for column in ("test.trained", "test.gain", "test.low", "test.high", "ood.trained", "passed", "profile"):
        assert column in header, header
    for path in declared(tiny_pipeline, "plots"):
        assert (tiny_pipeline / path).exists(), path


def test_the_tiny_run_trains_a_model_that_differs_from_its_base(tiny_pipeline):
    """The warm-started base gives GRPO rewards that vary within groups, so the adapter moves, and
    evaluate compares two different models."""
    from safetensors.torch import load_file

    train = json.loads((tiny_pipeline / "reports/train/metrics.json").read_text())
    assert train["adapter_changed"] is True and train["zero_spread_steps"] < 1.0 and train["zero_spread_groups"] < 1.0
    adapter = load_file(str(tiny_pipeline / "models/adapter/adapter_model.safetensors"))
    assert max(t.abs().max().item() for name, t in adapter.items() if "lora_B" in name) > 0
    evaluation = json.loads((tiny_pipeline / "reports/eval/metrics.json").read_text())
    assert evaluation["adapter"]["max_lora_b"] > 0 and evaluation["adapter"]["max_logit_change"] > 0
    base = json.loads((tiny_pipeline / "reports/base/metrics.json").read_text())
    assert base["sft_steps"] > 0 and base["val"]["format_compliance"] > 0.5  # the warm start taught the format


def test_grpo_logs_held_out_accuracy_along_training(tiny_pipeline):
    """`train.eval_steps`: greedy val accuracy before the first step and every N steps, as a curve
    beside the rewards and in the train metrics."""
    train_params = profile_params("tiny")["train"]
    every, steps = train_params["eval_steps"], train_params["max_steps"]
    rows = (tiny_pipeline / "reports/train/plots/metrics/eval/accuracy.tsv").read_text().splitlines()
    curve = {int(step): float(value) for step, value in (row.split("\t") for row in rows[1:])}
    assert sorted(curve) == list(range(0, steps + 1, every))
    assert all(0.0 <= value <= 1.0 for value in curve.values())
    train = json.loads((tiny_pipeline / "reports/train/metrics.json").read_text())
    assert train["val_accuracy"] == {f"step_{step}": value for step, value in curve.items()}


def test_smoke_gate_passed(tiny_pipeline):
    smoke = json.loads((tiny_pipeline / "reports/smoke/metrics.json").read_text())
    assert smoke["gate"] == {"passed": True, "failures": []}


def test_exp_show_lists_the_run(tiny_pipeline):
    shown = json.loads(run(["dvc", "exp", "show", "--json"], tiny_pipeline).stdout)
    experiments = [exp for commit in shown for exp in (commit.get("experiments") or [])]
    assert experiments, shown
    params = [rev["data"]["params"]["params.yaml"]["data"] for exp in experiments for rev in exp["revs"]]
    tiny = [p for p in params if p.get("profile") == "tiny"]
    assert tiny, params
    # the values the run used (composed from conf/), not the defaults the profile overrode
    assert tiny[0]["train"]["max_steps"] == 6 and tiny[0]["model"]["name"] == "tiny"
    assert tiny[0]["train"]["learning_rate"] == profile_params("tiny")["train"]["learning_rate"] != 5e-6
    table = run(["dvc", "exp", "show", "--md"], tiny_pipeline).stdout
    assert any("└──" in row and "| tiny " in row for row in table.splitlines())  # the experiment, profile tiny


def test_resumed_run_under_dvc_continues_the_curves(tiny_pipeline, tmp_path):
    """`dvc exp run -S profile=tiny -S train.resume=true` keeps the curves (declared persist) and appends to
    them. Run up to `train` only: the stages after it rerun as in any run, and other tests cover them."""
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    steps = json.loads((repo / "reports/train/metrics.json").read_text())["steps"]
    result = run(["dvc", "exp", "run", "-S", "profile=tiny", "-S", "train.resume=true", "-S",
                  f"train.max_steps={steps + 2}", "train"], repo)
    assert "Running stage 'train'" in result.stdout and "Running stage 'base'" not in result.stdout
    metrics = json.loads((repo / "reports/train/metrics.json").read_text())
    assert (metrics["steps"], metrics["resumed_from"]) == (steps + 2, f"checkpoint-{steps}")
    rows = (repo / "reports/train/plots/metrics/train/reward.tsv").read_text().splitlines()[1:]
    assert [r.split("\t")[0] for r in rows] == [str(i) for i in range(1, steps + 3)]


def test_editing_a_default_the_profile_overrides_reruns_nothing(tiny_pipeline, tmp_path):
    """The case that used to rerun train and all after it: with profile tiny, conf/'s train.learning_rate
    (which tiny overrides) changes; `dvc exp run -S profile=tiny` composes the same params.yaml, and no
    stage runs."""
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    config = repo / "conf" / "config.yaml"
    config.write_text(config.read_text().replace("  learning_rate: 5.0e-6\n", "  learning_rate: 7.0e-6\n", 1))
    run(["git", "commit", "-qam", "a default the tiny profile overrides"], repo)
    result = run(["dvc", "exp", "run", "-S", "profile=tiny"], repo)
    assert "Running stage" not in result.stdout, result.stdout


def test_params_diff_shows_the_values_the_run_used(tiny_pipeline):
    """`dvc params diff`: the tiny run's params.yaml (composed) against the commit's (profile full), key by key."""
    diff = run(["dvc", "params", "diff", "--md"], tiny_pipeline).stdout
    rows = {row.split("|")[2].strip(): [cell.strip() for cell in row.split("|")[3:5]]
            for row in diff.splitlines() if row.startswith("| params.yaml")}
    assert rows["train.max_steps"] == ["-1", "6"] and rows["model.name"] == ["Qwen/Qwen3-VL-8B-Instruct", "tiny"]
    assert rows["profile"] == ["full", "tiny"] and "train.lora_r" not in rows  # unchanged keys are not listed
