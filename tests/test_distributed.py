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

pytestmark = pytest.mark.slow  # DDP and DeepSpeed runs


@pytest.fixture
def data(tiny_dataset):
    return tiny_dataset


def run_train(tmp_path, data, base, **train):
    params = write_params(tmp_path / "params.yaml", tiny_params(train=train))
    result = stage("train", "--params", str(params), "--data", str(data), "--base", str(base), "--adapter",
                   str(tmp_path / "adapter"), "--checkpoints", str(tmp_path / "ckpt"), "--reports",
                   str(tmp_path / "reports"))
    assert result.returncode == 0, result.stderr[-4000:]
    return result, json.loads((tmp_path / "reports" / "metrics.json").read_text())


def test_two_process_ddp_run_writes_once(data, tiny_base, tmp_path):
    result, metrics = run_train(tmp_path, data, tiny_base, num_processes=2, accelerate_config="ddp", max_steps=2,
                                save_steps=2)
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


def test_deepspeed_zero2_runs_on_cpu(data, tiny_base, tmp_path):
    result, metrics = run_train(tmp_path, data, tiny_base, num_processes=2, accelerate_config="zero2", max_steps=2,
                                save_steps=2)
    assert "zero2.yaml" in result.stdout and "--multi_gpu" not in result.stdout
    assert metrics["distributed"] == "deepspeed" and metrics["world_size"] == 2 and metrics["steps"] == 2
    assert (tmp_path / "adapter/adapter_model.safetensors").exists()


def test_gradients_are_synchronised(data, tiny_base, tmp_path):
    """2 ranks x 4 completions give the same adapter as 1 process x 8, far closer than the update."""
    script = str(ROOT / "tests" / "grpo_equivalence_run.py")
    one, two = tmp_path / "one.safetensors", tmp_path / "two.safetensors"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, script, str(one), "8", str(data), str(tiny_base)], cwd=ROOT, check=True,
                   capture_output=True, env=env)
    launch = [str(VENV_BIN / "accelerate"), "launch", "--config_file", str(distributed.BUILT_IN["ddp"]),
              "--num_processes", "2", "--num_machines", "1", "--multi_gpu", script, str(two), "4", str(data),
              str(tiny_base)]
    subprocess.run(launch, cwd=ROOT, check=True, capture_output=True, env=env)
    assert safe_open(str(two), "pt").metadata()["world_size"] == "2"
    a, b = load_file(one), load_file(two)
    assert a.keys() == b.keys()
    # lora_B starts at zero, so its values are the update itself. lora_A is left out: its gradient is
    # zero on step 1 (B is 0) and still tiny on the next steps, and Adam divides each gradient by its own
    # running size, so rounding differences between the two reductions become steps of up to lr there
    # (7e-5 on an AMD EPYC).
    lora_b = [k for k in a if "lora_B" in k]
    difference = max((a[k] - b[k]).abs().max().item() for k in lora_b)
    update = max(a[k].abs().max().item() for k in lora_b)
    assert update > 1e-3
    assert difference < update / 100


def test_launch_command():
    ddp = config_from_dict(tiny_params(train={"num_processes": 2})).train
    command = distributed.launch_command(ddp, ["stages/train.py", "--params", "p.yaml"])
    assert command[1:3] == ["launch", "--config_file"] and command[3].endswith("accelerate_configs/ddp.yaml")
    assert command[-4:] == ["--multi_gpu", "stages/train.py", "--params", "p.yaml"]
    zero3 = config_from_dict(tiny_params(train={"num_processes": 2, "accelerate_config": "zero3"})).train
    assert "--multi_gpu" not in distributed.launch_command(zero3, ["x.py"])


def test_too_many_processes(tmp_path, data, tiny_base):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"num_processes": 64}))
    result = stage("train", "--params", str(params), "--data", str(data), "--base", str(tiny_base), "--adapter",
                   str(tmp_path / "a"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: params.yaml: train.num_processes: 64 processes but only")
    with pytest.raises(ConfigError, match="only 2 CUDA devices available"):
        distributed.check_processes(config_from_dict(tiny_params(train={"num_processes": 4})).train, cuda_devices=2)


def test_missing_accelerate_config(tmp_path, data, tiny_base):
    params = write_params(tmp_path / "params.yaml", tiny_params(
        train={"num_processes": 2, "accelerate_config": "configs/nowhere.yaml"}))
    result = stage("train", "--params", str(params), "--data", str(data), "--base", str(tiny_base), "--adapter",
                   str(tmp_path / "a"))
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

    args = grpo_config(config.train, "/tmp/unused", "float32", cuda=False)
    assert args.use_vllm is True and args.vllm_mode == config.train.vllm_mode


# --- DeepSpeed ZeRO-3 ------------------------------------------------------------------------------

def zero3_everything_partitioned(tmp_path):
    """zero3.yaml with one change: DeepSpeed partitions every parameter. By default it keeps those under
    100k elements whole on every rank, which covers every LoRA matrix of the tiny model (on the 8B, the
    larger ones are partitioned), so a save that forgets to gather would still look right here."""
    import yaml

    ds = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                "stage3_gather_16bit_weights_on_model_save": True},
          "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    (tmp_path / "ds_zero3.json").write_text(json.dumps(ds))
    config = yaml.safe_load(distributed.BUILT_IN["zero3"].read_text())
    config["deepspeed_config"] = {"deepspeed_config_file": str(tmp_path / "ds_zero3.json"), "zero3_init_flag": True}
    del config["mixed_precision"]  # the DeepSpeed file says it (accelerate refuses both)
    (tmp_path / "zero3-all.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "zero3-all.yaml"


def test_deepspeed_zero3_trains_and_saves_a_complete_adapter(data, tiny_base, tmp_path):
    from conftest import lora_model
    from peft import PeftModel

    from vgrpo.base import base_model_path
    from vgrpo.models import load_model

    accelerate_config = zero3_everything_partitioned(tmp_path)
    result, metrics = run_train(tmp_path, data, tiny_base, num_processes=2, accelerate_config=str(accelerate_config),
                                max_steps=2, save_steps=2)
    assert metrics["distributed"] == "deepspeed" and metrics["world_size"] == 2 and metrics["steps"] == 2
    assert metrics["zero3_init"] is True  # GRPOConfig came first: the weights were partitioned as they loaded
    saved = load_file(str(tmp_path / "adapter/adapter_model.safetensors"))
    expected = {name.replace(".default", ""): tuple(p.shape) for name, p in lora_model(tiny_base)[0].named_parameters()
                if "lora_" in name}
    assert {name: tuple(t.shape) for name, t in saved.items()} == expected  # every matrix, gathered whole
    assert all(t.numel() > 0 for t in saved.values())
    assert any(t.abs().max() > 0 for name, t in saved.items() if "lora_A" in name)
    model = PeftModel.from_pretrained(load_model(base_model_path(tiny_base), "float32"), str(tmp_path / "adapter"))
    assert sum("lora_" in name for name, _ in model.named_parameters()) == len(expected)


@pytest.mark.parametrize("zero3, dtype", [(True, "bfloat16"), (False, "float32")])
def test_adapters_take_the_base_dtype_under_zero3(zero3, dtype, tiny_base):
    """ZeRO-3 gathers parameters into buffers of one dtype: fp32 adapters on a bf16 base fail on the
    first optimizer step. Outside ZeRO-3, PEFT's fp32 adapters are what mixed precision wants."""
    import torch
    from conftest import tiny_config

    from vgrpo import models
    from vgrpo.base import base_model_path

    config = tiny_config()
    model, _ = models.load_for_training(base_model_path(tiny_base), config.model, config.train, "hf", "bfloat16",
                                        zero3=zero3)
    dtypes = {p.dtype for name, p in model.named_parameters() if "lora_" in name}
    assert dtypes == {models.DTYPES[dtype]}
    assert {p.dtype for name, p in model.named_parameters() if "lora_" not in name} == {torch.bfloat16}


# --- vLLM rollouts on another machine ---------------------------------------------------------------

def test_vllm_server_address_reaches_trl(tmp_path):
    from vgrpo.training import grpo_config

    config = config_from_dict(tiny_params(train={"use_vllm": True, "vllm_mode": "server",
                                                 "finetune_vision_layers": False,
                                                 "vllm_server_base_url": "http://10.1.2.3:8011",
                                                 "vllm_server_timeout": 30.0}))
    args = grpo_config(config.train, tmp_path, "float32", cuda=False)
    assert (args.vllm_mode, args.vllm_server_base_url, args.vllm_server_timeout) == ("server", "http://10.1.2.3:8011",
                                                                                      30.0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_vllm_server_is_one_line_naming_it():
    from vgrpo.backends import check_vllm_server

    url = f"http://127.0.0.1:{free_port()}"
    train = config_from_dict(tiny_params(train={"use_vllm": True, "vllm_mode": "server",
                                                "finetune_vision_layers": False, "vllm_server_base_url": url,
                                                "vllm_server_timeout": 1.0})).train
    with pytest.raises(ConfigError) as err:
        check_vllm_server(train, poll_seconds=0.2)
    assert str(err.value) == (
        f"params.yaml: train.vllm_server_base_url: no vLLM server answers at {url}/health/ after 1 s (start "
        "`trl vllm-serve --model <base>` there first, or fix the address)")


def test_a_vllm_server_that_answers_passes_the_check():
    """A stand-in that answers /health/ as `trl vllm-serve` does."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from vgrpo.backends import check_vllm_server

    class Health(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200 if self.path == "/health/" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        train = config_from_dict(tiny_params(train={
            "use_vllm": True, "vllm_mode": "server", "finetune_vision_layers": False,
            "vllm_server_base_url": f"http://127.0.0.1:{server.server_address[1]}", "vllm_server_timeout": 2.0})).train
        check_vllm_server(train, poll_seconds=0.2)
    finally:
        server.shutdown()


def test_vllm_server_address_must_be_a_url():
    with pytest.raises(ConfigError, match=r"^params.yaml: train.vllm_server_base_url: expected an address like "
                                          r"http://10.0.0.2:8000 \(where `trl vllm-serve` listens\), got '10.0.0.2'$"):
        config_from_dict(tiny_params(train={"vllm_server_base_url": "10.0.0.2"}))
