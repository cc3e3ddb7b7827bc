"""The tiny model in 4 bits through all seven stages on a CPU (bitsandbytes' CPU backend), as a new user runs
it: `dvc exp run -S profile=tiny -S train.load_in_4bit=true` in a fresh `git clone`. Train loads NF4 weights
and moves both towers' LoRA; evaluate and smoke load their models in 4 bits too; export merges into the
16-bit base; smoke gates the files with the bounds of a 4-bit reference; the card is written."""

from __future__ import annotations

import json
import re

import pytest
from conftest import make_pipeline_repo, run

pytestmark = pytest.mark.slow  # the whole tiny pipeline under DVC


@pytest.fixture(scope="module")
def four_bit_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("four-bit")
    origin = make_pipeline_repo(root / "origin")
    clone = root / "clone"
    run(["git", "clone", "-q", str(origin), str(clone)], root)
    result = run(["dvc", "exp", "run", "-S", "profile=tiny", "-S", "train.load_in_4bit=true"], clone, timeout=2400)
    return clone, result.stdout + result.stderr


def test_every_stage_ran_in_4_bits(four_bit_run):
    clone, log = four_bit_run
    for stage in ("generate", "base", "train", "evaluate", "export", "smoke", "card"):
        assert f"Running stage '{stage}'" in log, stage
    assert "float32 4-bit" in log  # train's one line: the dtype it computes in, on NF4 weights
    assert "Running stage" not in run(["dvc", "status"], clone).stdout


def test_4bit_training_moved_both_towers(four_bit_run):
    clone, _ = four_bit_run
    train = json.loads((clone / "reports/train/metrics.json").read_text())
    assert train["load_in_4bit"] is True and train["adapter_changed"] is True
    assert train["adapter_max_lora_b_by_tower"]["vision"] > 0 and train["adapter_max_lora_b_by_tower"]["language"] > 0


def test_downstream_stages_loaded_4bit_and_the_gate_knew_it(four_bit_run):
    clone, _ = four_bit_run
    evaluation = json.loads((clone / "reports/eval/metrics.json").read_text())
    assert evaluation["adapter"]["max_lora_b"] > 0
    smoke = json.loads((clone / "reports/smoke/metrics.json").read_text())
    assert (smoke["hf"]["load_in_4bit"], smoke["hf"]["precision"]) == (True, "4bit")
    assert smoke["gate"] == {"passed": True, "failures": []}
    merged = json.loads((clone / "models/merged/config.json").read_text())
    assert "quantization_config" not in merged  # the merge is into the 16-bit (here float32) base, not NF4
    assert (clone / "models/README.md").is_file()


def test_a_fresh_clones_hash_warnings_are_the_outputs_it_has_not_made_yet(four_bit_run):
    """DVC checks out the last run's outputs before the first run, and a fresh clone has none: one warning
    per declared output, nothing else (the README's troubleshooting explains it)."""
    import yaml
    from conftest import ROOT

    clone, log = four_bit_run
    warned = re.findall(r"No file hash info found for '([^']+)'\. It won't be created\.", log)
    outputs = set()
    for stage in yaml.safe_load((clone / "dvc.yaml").read_text())["stages"].values():
        for key in ("outs", "metrics", "plots"):  # a stage's plots are outputs too
            outputs |= {entry if isinstance(entry, str) else next(iter(entry)) for entry in stage.get(key, [])}
    assert warned and {str(clone / out) for out in outputs} >= set(warned), (warned, outputs)
    assert "No file hash info found" in (ROOT / "README.md").read_text()
