"""scripts/gpu_check.sh runs here, on a CPU, in both of its modes, so that it cannot rot before a GPU is
lent: the tiny model built here, and a hub model served by the local hub stand-in (tests/hub_server.py).
Every case the CPU can run passes (a real train, evaluate, export and smoke), each CUDA-only case is
skipped with its reason, and the JSON summary holds every case's figures."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from conftest import ROOT
from hub_server import FakeHub

CUDA_ONLY = ["hf-16bit", "hf-fp16", "hf-4bit", "unsloth-16bit", "unsloth-fp16", "unsloth-4bit", "hf-ddp-2gpu",
             "downstream-hf-16bit", "downstream-unsloth-16bit", "downstream-hf-4bit"]


def gpu_check(work, env=None, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--work", str(work), "--steps", "2", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result, json.loads((work / "summary.json").read_text())


def check_cpu_summary(result, summary: dict, dvc_cases: list[str]) -> dict[str, dict]:
    cases = {c["case"]: c for c in summary["cases"]}
    assert list(cases) == ["setup", "hf-float32", *CUDA_ONLY[:7], "downstream-hf-float32", *CUDA_ONLY[7:], *dvc_cases]
    assert summary["device"]["cuda"] is False and summary["passed"] is True and summary["steps"] == 2
    train = cases["hf-float32"]
    assert train["outcome"] == "passed" and (train["backend"], train["dtype"], train["steps"]) == ("hf", "float32", 2)
    assert train["adapter_changed"] is True and train["seconds_per_step"] > 0
    downstream = cases["downstream-hf-float32"]
    assert downstream["outcome"] == "passed" and downstream["smoke_gate"] is True
    assert downstream["model_released"] is True and downstream["eval_samples_per_second"] > 0
    assert len(downstream["gguf"]) == 2 and all(f["n_gpu_layers"] == 0 for f in downstream["gguf"].values())
    for case in CUDA_ONLY + dvc_cases:
        assert cases[case]["outcome"] == "skipped" and cases[case]["reason"], cases[case]
    lines = result.stdout.splitlines()
    for case in cases:  # one line each
        assert sum(line.startswith(f"{case} ") for line in lines) == 1, (case, lines)
    return cases


@pytest.mark.slow
def test_gpu_check_runs_on_a_cpu_with_the_tiny_model(tmp_path):
    result, summary = gpu_check(tmp_path / "check")
    cases = check_cpu_summary(result, summary, ["dvc-tiny"])
    assert cases["hf-4bit"]["reason"] == "needs CUDA"
    assert summary["model"] == "tiny"


@pytest.mark.slow
def test_gpu_check_runs_on_a_cpu_with_a_hub_model(tiny_base, tmp_path):
    """Hub mode: the base stage downloads the model (the warm-started tiny Qwen3-VL) from the stand-in at
    the revision given, and every stage after it runs on that commit."""
    files = tmp_path / "repo"
    shutil.copytree(tiny_base, files, ignore=shutil.ignore_patterns("source.json"))
    with FakeHub() as hub:
        sha = hub.add_repo("Qwen/Qwen3-VL-Tiny-Test", files)
        env = hub.client_env(tmp_path / "hf", MODEL="Qwen/Qwen3-VL-Tiny-Test")
        result, summary = gpu_check(tmp_path / "check", env)
        assert any(r.startswith("GET /cdn-lfs/") for r in hub.requests)
    cases = check_cpu_summary(result, summary, ["dvc-full", "dvc-gpu16"])
    assert (summary["model"], summary["revision"], cases["setup"]["base"]) == ("Qwen/Qwen3-VL-Tiny-Test", "main", sha)
    # train loaded that commit (from the cache: later stages never ask the hub) and recorded it
    train = json.loads((tmp_path / "check" / "hf-float32" / "reports/train/metrics.json").read_text())
    assert (train["base_model"], train["base_revision"]) == (f"Qwen/Qwen3-VL-Tiny-Test@{sha}", sha)
