"""What the machine can run: which device, and which precision the model is loaded in there.

`model.dtype: auto` picks bfloat16 only where the GPU computes it natively (compute capability 8.0+:
A100, L4, H100...), float16 on older GPUs (T4, V100: `torch.cuda.is_bf16_supported()` says True
there because bf16 is emulated, and Unsloth then loads float16 and refuses a bf16 trainer), and
float32 on a CPU. An explicit dtype the device cannot run is a params error. The trainer's
mixed-precision flags always follow the dtype the model was loaded in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vgrpo.config import ConfigError, ModelParams, TrainParams


@dataclass(frozen=True)
class Device:
    kind: str  # "cuda" or "cpu"
    name: str  # "NVIDIA A100-SXM4-80GB", "cpu"
    capability: tuple[int, int] | None  # CUDA compute capability
    native_bf16: bool


CPU = Device("cpu", "cpu", None, False)


def current_device() -> Device:
    if not torch.cuda.is_available():
        return CPU
    return Device("cuda", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0),
                  torch.cuda.is_bf16_supported(including_emulation=False))


def resolve_dtype(requested: str, device: Device) -> str:
    """The dtype to load the model in: `model.dtype`, with `auto` decided by the device."""
    if device.kind == "cpu":
        if requested == "float16":
            raise ConfigError("params.yaml: model.dtype: float16 needs a CUDA GPU and this machine has none "
                              "(use auto or float32 on a CPU)")
        return "float32" if requested == "auto" else requested
    if requested == "auto":
        return "bfloat16" if device.native_bf16 else "float16"
    if requested == "bfloat16" and not device.native_bf16:
        major, minor = device.capability or (0, 0)
        raise ConfigError(f"params.yaml: model.dtype: bfloat16 is not native on {device.name} (compute capability "
                          f"{major}.{minor}; bf16 needs 8.0 or newer) (use auto or float16)")
    return requested


def trainer_precision(dtype: str) -> dict[str, bool]:
    """GRPOConfig's mixed-precision flags for a model loaded in `dtype`."""
    return {"bf16": dtype == "bfloat16", "fp16": dtype == "float16"}


def check_4bit(load_in_4bit: bool) -> None:
    """4-bit weights come from bitsandbytes (CUDA, or its CPU backend), a dependency of the project."""
    import importlib.util

    if load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError("params.yaml: train.load_in_4bit: 4-bit loading needs bitsandbytes, which is not installed "
                          "(pip install bitsandbytes in the venv, or rerun ./setup.sh)")


def load_dtype(model: ModelParams, train: TrainParams, device: Device | None = None) -> str:
    """How train, evaluate and smoke load the base: the resolved dtype, after checking that the device
    can run it and, with `train.load_in_4bit`, 4-bit weights. Fails in one line before any model loads."""
    device = device or current_device()
    check_4bit(train.load_in_4bit)
    return resolve_dtype(model.dtype, device)
