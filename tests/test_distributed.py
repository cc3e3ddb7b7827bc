"""Multi-process GRPO through accelerate, for real on the CPU: DDP over gloo and DeepSpeed ZeRO-2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, VENV_BIN, stage, tiny_params, write_params
from safetensors import safe_open
from safetensors.torch import load_file

from vgrpo import distributed
from vgrpo.config import ConfigError, config_from_dict


@pytest.fixture
def data(tiny_dataset):
    return tiny_dataset


def run_train(tmp_path, data, **train):
    params = write_params(tmp_path / "params.yaml", tiny_params(train=train))
    result = stage("train", "--params", str(params), "--data", str(data), "--adapter", str(tmp_path / "adapter"),
                   "--checkpoints", str(tmp_path / "ckpt"), "--reports", str(tmp_path / "reports"))
    assert result.returncode == 0, result.stderr[-4000:]
    return result, json.loads((tmp_path / "reports" / "metrics.json").read_text())


def test_two_process_ddp_run_writes_once(data, tmp_path):
    result, metrics = run_train(tmp_path, data, num_processes=2, accelerate_config="ddp", max_steps=2, save_steps=2)
    assert "accelerate launch" in result.stdout and "--multi_gpu" in result.stdout
    assert metrics["world_size"] == 2  # the silent one-process case would say 1
    assert metrics["distributed"] == "MULTI_CPU"
    assert result.stdout.count("backend hf") == 2  # both ranks trained...
    assert result.stdout.count("world size 2, adapter in") == 1  # ...and only rank 0 reported
    rows = (tmp_path / "reports/plots/metrics/train/reward.tsv").read_text().splitlines()[1:]
    assert [r.split("\t")[0] for r in rows] == ["1", "2"]  # one writer: no duplicate rows
    assert (tmp_path / "adapter/adapter_model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "ckpt/checkpoint-2").glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]


def test_deepspeed_zero2_runs_on_cpu(data, tmp_path):
    result, metrics = run_train(tmp_path, data, num_processes=2, accelerate_config="zero2", max_steps=2, save_steps=2)
    assert "zero2.yaml" in result.stdout and "--multi_gpu" not in result.stdout
    assert metrics["distributed"] == "deepspeed" and metrics["world_size"] == 2 and metrics["steps"] == 2
    assert (tmp_path / "adapter/adapter_model.safetensors").exists()


def test_gradients_are_synchronised(data, tmp_path):
    """2 ranks x 4 completions give the same adapter as 1 process x 8, far closer than the update."""
    script = str(ROOT / "tests" / "grpo_equivalence_run.py")
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, script, str(one), "8", str(data)], cwd=ROOT, check=True, capture_output=True,
                   env=env)
    launch = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(distributed.BUILT_IN["ddp"]),
              "--num_processes", "2", "--num_machines", "1", "--multi_gpu", script, str(two), "4", str(data)]
    subprocess.run(launch, cwd=ROOT, check=True, capture_output=True, env=env)
    assert safe_open(str(two), "pt").metadata()["world_size"] == "2"
    a, b = load_file(one), load_file(two)
    assert a.keys() == b.keys()
    difference = max((a[k] - b[k]).abs().max().item() for k in a)
    update = max(a[k].abs().max().item() for k in a if "lora_B" in k)  # lora_B starts at zero
    assert update > 1e-3
    assert difference < update / 100


def test_launch_command():
    ddp = config_from_dict(tiny_params(train={"num_processes": 2})).train
    command = distributed.launch_command(ddp, ["stages/train.py", "--params", "p.yaml"])
    assert command[1:3] == ["launch", "--config_file"] and command[3].endswith("accelerate_configs/ddp.yaml")
    assert command[-4:] == ["--multi_gpu", "stages/train.py", "--params", "p.yaml"]
    zero3 = config_from_dict(tiny_params(train={"num_processes": 2, "accelerate_config": "zero3"})).train
    assert "--multi_gpu" not in distributed.launch_command(zero3, ["x.py"])


def test_too_many_processes(tmp_path, data):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"num_processes": 64}))
    result = stage("train", "--params", str(params), "--data", str(data), "--adapter", str(tmp_path / "a"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: params.yaml: train.num_processes: 64 processes but only")
    with pytest.raises(ConfigError, match="only 2 CUDA devices available"):
        distributed.check_processes(config_from_dict(tiny_params(train={"num_processes": 4})).train, cuda_devices=2)


def test_missing_accelerate_config(tmp_path, data):
    params = write_params(tmp_path / "params.yaml", tiny_params(
        train={"num_processes": 2, "accelerate_config": "configs/nowhere.yaml"}))
    result = stage("train", "--params", str(params), "--data", str(data), "--adapter", str(tmp_path / "a"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: params.yaml: train.accelerate_config: configs/nowhere.yaml not found (expected ddp, zero2, zero3 "
        "or the path of an accelerate config file)")


def test_vllm_with_vision_lora_says_which_knob():
    with pytest.raises(ConfigError, match="vLLM cannot apply LoRA to vision layers: set "
                                          "train.finetune_vision_layers: false"):
        config_from_dict(tiny_params(train={"use_vllm": True}))
    config = config_from_dict(tiny_params(train={"use_vllm": True, "finetune_vision_layers": False}))
    from vgrpo.training import grpo_config

    args = grpo_config(config.train, "/tmp/unused", cuda=False)
    assert args.use_vllm is True and args.vllm_mode == config.train.vllm_mode
