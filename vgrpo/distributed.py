"""Multi-process training through `accelerate launch` (DDP, DeepSpeed ZeRO-2/3). TRL does the
distributed work; this module only decides how to launch the train stage and checks the request.

With `train.num_processes > 1` the train stage re-executes itself under `accelerate launch`; each
child sees LOCAL_RANK and trains as one rank. For DDP `--multi_gpu` is passed even on a CPU machine:
there accelerate then runs MULTI_CPU over gloo, while its `--cpu` launcher would silently start a
single process without mpirun (docs/design.md, the facts); tests check the world size for that reason. DeepSpeed
configs get no `--multi_gpu`, which would override their `distributed_type: DEEPSPEED`.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import yaml

from vgrpo.config import ConfigError, TrainParams

CONFIGS_DIR = Path(__file__).parent / "accelerate_configs"
BUILT_IN = {path.stem: path for path in sorted(CONFIGS_DIR.glob("*.yaml"))}


def accelerate_config_path(name: str) -> Path:
    """A built-in config (ddp, zero2, zero3) or a path to an accelerate config file."""
    path = BUILT_IN.get(name, Path(name))
    if not path.is_file():
        raise ConfigError(f"params.yaml: train.accelerate_config: {name} not found (expected "
                          f"{', '.join(BUILT_IN)} or the path of an accelerate config file)")
    return path


def is_launched() -> bool:
    """True inside a process started by `accelerate launch` / torchrun."""
    return "LOCAL_RANK" in os.environ


def check_processes(train: TrainParams, cuda_devices: int, cpus: int | None = None) -> None:
    """More processes than devices (GPUs, or CPU cores without GPUs) is a params error."""
    if train.num_processes == 1:
        return
    accelerate_config_path(train.accelerate_config)
    if cuda_devices:
        available, kind = cuda_devices, "CUDA devices"
    else:
        available, kind = cpus or os.cpu_count() or 1, "CPU cores (no CUDA device)"
    if train.num_processes > available:
        raise ConfigError(f"params.yaml: train.num_processes: {train.num_processes} processes but only {available} "
                          f"{kind} available")


def launch_command(train: TrainParams, argv: list[str]) -> list[str]:
    """`accelerate launch` running the same command (`argv`: script and its arguments)."""
    config = accelerate_config_path(train.accelerate_config)
    deepspeed = yaml.safe_load(config.read_text()).get("distributed_type") == "DEEPSPEED"
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or "accelerate"
    return [accelerate, "launch", "--config_file", str(config), "--num_processes", str(train.num_processes),
            "--num_machines", "1", *([] if deepspeed else ["--multi_gpu"]), *argv]
