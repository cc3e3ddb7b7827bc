"""Real DVC in a throwaway git repo: stages rerun exactly when their own inputs change."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, load_params, make_pipeline_repo, profile_params, run, write_params

# The params each stage reads: whole groups, or single keys of another stage's group. params.yaml holds the
# values the stages use (conf/ composed by `dvc exp run`), so these names are all DVC needs to track.
STAGE_PARAMS = {"generate": ["generate"], "base": ["model", "base"], "train": ["model", "train"],
                "evaluate": ["model", "evaluate", "train.load_in_4bit", "train.temperature", "train.answer_temperature",
                             "train.top_p", "train.top_k"],
                "export": ["model", "export"], "smoke": ["model", "smoke", "train.load_in_4bit"], "card": ["profile"]}


def test_each_stage_tracks_exactly_the_params_it_reads():
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(pipeline) == list(STAGE_PARAMS)
    for name, params in STAGE_PARAMS.items():
        assert set(pipeline[name].get("params", [])) == set(params), name
        assert f"stages/{name}.py" in pipeline[name]["deps"]
        assert pipeline[name]["cmd"].startswith(f"python stages/{name}.py")


def library_modules(script: Path) -> set[str]:
    """The vgrpo modules a script imports, directly or through other vgrpo modules, at any depth of the code."""
    found, todo = set(), [script]
    while todo:
        for node in ast.walk(ast.parse(todo.pop().read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vgrpo"):
                names = [f"vgrpo.{a.name}" for a in node.names] if node.module == "vgrpo" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                path = ROOT / (name.replace(".", "/") + ".py")
                if name.startswith("vgrpo.") and path.is_file() and path.relative_to(ROOT).as_posix() not in found:
                    found.add(path.relative_to(ROOT).as_posix())
                    todo.append(path)
    return found


def test_each_stage_depends_on_every_library_module_it_imports():
    """Else editing such a module (the train stage's sampler, say) would not rerun the stage."""
    pipeline = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in pipeline.items():
        missing = library_modules(ROOT / f"stages/{name}.py") - set(stage["deps"])
        assert not missing, f"{name} imports {sorted(missing)} but does not depend on them"


@pytest.fixture
def repo(tmp_path):
    path = make_pipeline_repo(tmp_path / "repo")
    raw = load_params()
    raw["generate"].update(train_size=30, val_size=10, test_size=10, ood_size=12)
    write_params(path / "params.yaml", raw)
    run(["git", "commit", "-qam", "small dataset"], path)
    return path


def repro_generate(repo):
    return run(["dvc", "repro", "generate"], repo).stdout


@pytest.mark.slow
def test_generate_reruns_only_when_its_params_change(repo):
    first = repro_generate(repo)
    assert "Running stage 'generate'" in first
    assert json.loads((repo / "data/shapes/stats.json").read_text())["images"] == 62

    assert "Running stage" not in repro_generate(repo)  # nothing changed

    raw = yaml.safe_load((repo / "params.yaml").read_text())
    raw["evaluate"]["batch_size"] = 3  # a param generate does not read
    write_params(repo / "params.yaml", raw)
    assert "Running stage" not in repro_generate(repo)

    before = json.loads((repo / "data/shapes/stats.json").read_text())["fingerprint"]
    raw["generate"]["seed"] = 7
    write_params(repo / "params.yaml", raw)
    assert "Running stage 'generate'" in repro_generate(repo)
    assert json.loads((repo / "data/shapes/stats.json").read_text())["fingerprint"] != before


@pytest.mark.slow
def test_exp_run_tiny_profile_builds_the_dataset(repo):
    result = run(["dvc", "exp", "run", "-S", "profile=tiny", "generate"], repo)
    assert "Running stage 'generate'" in result.stdout
    stats = json.loads((repo / "data/shapes/stats.json").read_text())
    tiny = profile_params("tiny")["generate"]
    assert stats["splits"]["train"]["size"] == tiny["train_size"]
    assert "tiny" in run(["dvc", "exp", "show", "--no-pager", "--md"], repo).stdout



@pytest.mark.slow
def test_a_change_a_profile_overrides_reruns_nothing(repo):
    """Hydra composition: with profile tiny, a default that tiny overrides (generate.train_size) is not a
    value the stages use, so changing it in conf/ reruns nothing and params.yaml stays the same; a value
    that is used (generate.seed, -S after the profile) reruns the stage."""
    run(["dvc", "exp", "run", "-S", "profile=tiny", "generate"], repo)
    composed = (repo / "params.yaml").read_text()
    config = repo / "conf" / "config.yaml"
    config.write_text(config.read_text().replace("  train_size: 600\n", "  train_size: 601\n", 1))
    run(["git", "commit", "-qam", "a default the tiny profile overrides"], repo)
    again = run(["dvc", "exp", "run", "-S", "profile=tiny", "generate"], repo).stdout
    assert "Running stage 'generate'" not in again, again
    assert (repo / "params.yaml").read_text() == composed
    seeded = run(["dvc", "exp", "run", "-S", "profile=tiny", "-S", "generate.seed=7", "generate"], repo).stdout
    assert "Running stage 'generate'" in seeded
    assert yaml.safe_load((repo / "params.yaml").read_text())["generate"]["seed"] == 7
