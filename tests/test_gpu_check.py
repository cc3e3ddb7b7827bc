"""scripts/gpu_check.sh runs here, on a CPU, in both of its modes, so that it cannot rot before a GPU is
lent: the tiny model built here, and a hub model served by the local hub stand-in (tests/hub_server.py).
Every case a CPU can run passes (real train runs in bfloat16 and 4-bit NF4 with the 8B recipe's 8-bit Adam;
evaluate, export and smoke on the adapter of the bfloat16 run; for a hub model, `dvc exp run` of profile gpu16,
in 4 bits), each case a CPU cannot run is skipped with its reason, and the JSON summary holds every figure. To
keep the suite's time, a case that another test runs the same way is left out (`--skip`): what one mode runs
the other leaves out, and the float32 train and the 4-bit downstream stages are the pipeline's tests' own
(test_pipeline_e2e.py, test_pipeline_4bit.py)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml
from conftest import ROOT, cpu_computes_bfloat16
from hub_server import FakeHub

TRAINS = ["hf-float32", "hf-16bit", "hf-fp16", "hf-4bit", "unsloth-16bit", "unsloth-fp16", "unsloth-4bit",
          "hf-ddp-2gpu"]
DOWNSTREAM = ["downstream-hf-float32", "downstream-hf-16bit", "downstream-unsloth-16bit", "downstream-hf-4bit"]
RUNS_ON_A_CPU = {"hf-float32", "hf-16bit", "hf-4bit", "downstream-hf-float32", "downstream-hf-16bit",
                 "downstream-hf-4bit"}
CPU_CANNOT = {"hf-fp16": "float16 needs CUDA (a CPU runs the bfloat16 case)",
              "unsloth-16bit": "Unsloth needs CUDA", "unsloth-fp16": "Unsloth needs CUDA",
              "unsloth-4bit": "Unsloth needs CUDA", "hf-ddp-2gpu": "needs two GPUs",
              "downstream-unsloth-16bit": "no adapter from unsloth-16bit"}


# Run by the tiny-model check (the same code, on the tiny profile's knobs) or by dvc-gpu16 (gpu16's knobs through
# every stage, its train the 4-bit case's, with the bfloat16 merge full has too); the hub check keeps the 16-bit
# train, whose `full` knobs nothing else composes. dvc-full on a CPU is dvc-gpu16 without 4 bits (four minutes
# more).
HUB_LEAVES_OUT = ("hf-float32", "hf-4bit", "downstream-hf-float32", "downstream-hf-16bit", "downstream-hf-4bit",
                  "dvc-full")
# What the tiny check leaves out: dvc-tiny's `dvc exp run` and the float32 train are the pipeline's tests'
# (test_pipeline_e2e.py), evaluate/export/smoke on a 4-bit adapter test_pipeline_4bit.py's (a minute each here).
TINY_LEAVES_OUT = ("hf-float32", "downstream-hf-float32", "downstream-hf-4bit", "dvc-tiny")
# Both modes train in bfloat16 (hf-16bit), and the tiny mode runs evaluate, export and smoke on that adapter.
# A CPU without bfloat16 arithmetic emulates it far too slowly for the suite's time: there they are skipped,
# and the other kinds (Intel Xeon with AMX, AMD EPYC Zen 4 and 5) run them.
BFLOAT16_CPU = pytest.mark.skipif(not cpu_computes_bfloat16(), reason="this CPU has no bfloat16 arithmetic "
                                  "(avx512_bf16 or amx_bf16): torch emulates it, 68x float32's matmul time on Zen 2")
# The stand-in is the tiny model, not the 8B: two completions of a prompt (the recipe's) are often alike, so
# groups of four; four groups a step, as 40% of its groups of four had no reward spread (and a run whose
# groups all had none moves nothing: dvc-full once failed so with one group a step); 256 tokens (the floor
# the check keeps) bound its CPU time; and it does not look at the image, so smoke's image-sensitivity gate
# is off (as in the tiny profile). It samples at 0.7, not full's 1.0: at 1.0 in bfloat16 its 16 answers a step
# broke format on an Intel Xeon with AMX (every reward -1 in both steps, so the adapter rightly never moved).
STAND_IN = ("--set", "train.num_generations=4", "--set", "train.per_device_train_batch_size=16",
            "--set", "train.max_completion_length=256", "--set", "train.temperature=0.7",
            "--set", "smoke.min_image_sensitivity=0",
            *(arg for case in HUB_LEAVES_OUT for arg in ("--skip", case)))


def gpu_check(work, env=None, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--work", str(work), "--steps", "2", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result, json.loads((work / "summary.json").read_text())


def check_cpu_summary(result, summary: dict, dvc_cases: list[str], left_out: tuple[str, ...]) -> dict[str, dict]:
    cases = {c["case"]: c for c in summary["cases"]}
    assert list(cases) == ["setup", *TRAINS, *DOWNSTREAM, *dvc_cases]
    assert summary["device"]["cuda"] is False and summary["passed"] is True and summary["steps"] == 2
    for case, reason in CPU_CANNOT.items():
        assert (cases[case]["outcome"], cases[case]["reason"]) == ("skipped", reason), cases[case]
    for case in left_out:
        assert (cases[case]["outcome"], cases[case]["reason"]) == ("skipped", "left out by --skip"), cases[case]
    dtypes = {"hf-float32": ("float32", False), "hf-16bit": ("bfloat16", False), "hf-4bit": ("float32", True)}
    for case, (dtype, four_bit) in dtypes.items():
        if case in left_out:
            continue
        train = cases[case]
        assert train["outcome"] == "passed" and (train["backend"], train["dtype"], train["load_in_4bit"],
                                                 train["steps"]) == ("hf", dtype, four_bit, 2), train
        # both towers' LoRA moved: a 4-bit decoder that stopped the gradient would leave the vision tower's at 0
        assert train["max_lora_b_language"] > 0 and train["max_lora_b_vision"] > 0 and train["seconds_per_step"] > 0
    for case in DOWNSTREAM:
        if case in RUNS_ON_A_CPU and case not in left_out:
            downstream = cases[case]
            assert downstream["outcome"] == "passed" and downstream["smoke_gate"] is True, downstream
            assert downstream["model_released"] is True and downstream["eval_samples_per_second"] > 0
            assert len(downstream["gguf"]) == 2 and all(f["n_gpu_layers"] == 0 for f in downstream["gguf"].values())
    lines = result.stdout.splitlines()
    for case in cases:  # one line each
        assert sum(line.startswith(f"{case} ") for line in lines) == 1, (case, lines)
    return cases


@pytest.mark.slow
@BFLOAT16_CPU
def test_gpu_check_runs_on_a_cpu_with_the_tiny_model(tmp_path):
    skips = (arg for case in TINY_LEAVES_OUT for arg in ("--skip", case))
    result, summary = gpu_check(tmp_path / "check", None, *skips)
    cases = check_cpu_summary(result, summary, ["dvc-tiny"], TINY_LEAVES_OUT)
    assert cases["hf-4bit"]["outcome"] == cases["downstream-hf-16bit"]["outcome"] == "passed"
    assert summary["model"] == "tiny"
    # the case params are the tiny profile's, with the case's dtype, backend and 4-bit
    params = yaml.safe_load((tmp_path / "check" / "hf-4bit.yaml").read_text())
    assert (params["profile"], params["train"]["load_in_4bit"], params["train"]["optim"]) == ("tiny", True,
                                                                                            "adamw_8bit")


@pytest.mark.slow
@BFLOAT16_CPU
def test_gpu_check_runs_on_a_cpu_with_a_hub_model(tiny_base, tmp_path):
    """Hub mode: the base stage downloads the model (the warm-started tiny Qwen3-VL) from the stand-in at
    the revision given, and every stage after it runs on that commit, with the knobs of the profiles the
    8B runs: `full` for the 16-bit cases, `gpu16` for the 4-bit ones, then `dvc exp run` of gpu16 in a clone."""
    files = tmp_path / "repo"
    shutil.copytree(tiny_base, files, ignore=shutil.ignore_patterns("source.json"))
    with FakeHub() as hub:
        sha = hub.add_repo("Qwen/Qwen3-VL-Tiny-Test", files)
        env = hub.client_env(tmp_path / "hf", MODEL="Qwen/Qwen3-VL-Tiny-Test")
        result, summary = gpu_check(tmp_path / "check", env, *STAND_IN)
        assert any(r.startswith("GET /cdn-lfs/") for r in hub.requests)
    cases = check_cpu_summary(result, summary, ["dvc-full", "dvc-gpu16"], HUB_LEAVES_OUT)
    assert (summary["model"], summary["revision"], cases["setup"]["base"]) == ("Qwen/Qwen3-VL-Tiny-Test", "main", sha)
    dvc = cases["dvc-gpu16"]
    assert dvc["outcome"] == "passed" and dvc["smoke_gate"] is True and dvc["max_lora_b_vision"] > 0, dvc
    # train loaded that commit (from the cache: later stages never ask the hub) and recorded it
    train = json.loads((tmp_path / "check" / "hf-16bit" / "reports/train/metrics.json").read_text())
    assert (train["base_model"], train["base_revision"]) == (f"Qwen/Qwen3-VL-Tiny-Test@{sha}", sha)
    # the 8B's recipe, not the tiny profile's: its completions, evaluation tokens and bfloat16 merge
    sixteen = yaml.safe_load((tmp_path / "check" / "hf-16bit.yaml").read_text())
    four = yaml.safe_load((tmp_path / "check" / "dvc-gpu16" / "params.yaml").read_text())  # as dvc exp run composed it
    assert (sixteen["profile"], four["profile"], four["train"]["load_in_4bit"]) == ("full", "gpu16", True)
    for params in (sixteen, four):
        assert params["train"]["max_completion_length"] >= 256 and params["evaluate"]["max_new_tokens"] >= 256
        assert params["export"]["merged_dtype"] == "bfloat16" and params["train"]["max_steps"] == 2
        assert params["evaluate"]["pass_samples"] == {"test": 1}  # pass@k runs, on one image: 7 min at 8 here
    passes = json.loads((tmp_path / "check" / "dvc-gpu16" / "reports/eval/metrics.json").read_text())["test"]
    for model in ("base", "trained"):  # pass@k ran, on gpu16's k (up to 16)
        assert (passes[model]["pass_at_k"]["images"], passes[model]["pass_at_k"]["samples_per_image"]) == (1, 16)


def load_gpu_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_memory_stop_anywhere_in_the_log_is_does_not_fit(tmp_path):
    """Under `dvc exp run` the stage's one-line memory stop is followed by DVC's own ERROR line: the case is
    still "does not fit", with the stage's line as the reason."""
    gpu_check = load_gpu_check()
    check = gpu_check.Check(tmp_path, "tiny", "main", 2, "python")
    stop = ("error: params.yaml: profile full: training is planned at 23.5 GB of GPU memory (...) and Tesla T4 has "
            "14.6 GB free: use profile gpu16 (dvc exp run -S profile=gpu16), which loads the base in 4 bits")
    script = f"echo '{stop}' >&2; echo 'ERROR: failed to reproduce train: exit 2' >&2; exit 1"
    ok, line = check.run("dvc-full", ["sh", "-c", script])
    assert not ok and line == stop
    assert check.failed("dvc-full", "dvc", ok, line, 0.0) is True
    assert check.cases[-1]["outcome"] == "does not fit" and check.cases[-1]["reason"] == stop[len("error: "):]
    crash = "echo 'Traceback' >&2; echo 'ERROR: failed to reproduce' >&2; exit 1"
    ok, line = check.run("dvc-gpu16", ["sh", "-c", crash])
    check.failed("dvc-gpu16", "dvc", ok, line, 0.0)
    assert (check.cases[-1]["outcome"], check.cases[-1]["reason"]) == ("failed", "ERROR: failed to reproduce")


def test_the_script_prefers_the_active_venv_over_the_clones(tmp_path):
    """In the image, /opt/venv is active (VIRTUAL_ENV) and a mounted clone may carry a host-built .venv with a
    CPU torch: the active venv's Python runs the check. PYTHON, when set, wins over both."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text("#!/bin/sh\necho \"active venv: $*\"\n")
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "VIRTUAL_ENV": str(venv)}
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh"), "--steps", "1"], env=env, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip() == "active venv: scripts/gpu_check.py --steps 1"
    other = tmp_path / "python"
    other.write_text("#!/bin/sh\necho chosen\n")
    other.chmod(0o755)
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh")], env={**env, "PYTHON": str(other)},
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "chosen"
