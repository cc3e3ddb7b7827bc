"""Which training backend runs, decided before anything heavy is imported.

`unsloth` (FastVisionModel, CUDA only) or `hf` (transformers + PEFT). `auto` picks unsloth only when
CUDA is present and unsloth imports. Unsloth patches transformers and TRL when it is imported, so it
must be imported first, and only on a CUDA machine: CPU machines never import it.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import urllib.request

import torch

from vgrpo.config import ConfigError, TrainParams

log = logging.getLogger(__name__)

def check_device_options(train: TrainParams, cuda: bool) -> None:
    """Options that only work with CUDA fail here, in one line, before a model loads. (bitsandbytes' 4-bit
    weights and 8-bit optimizers run on a CPU too, through its CPU backend.)"""
    if cuda:
        return
    if train.backend == "unsloth":
        raise ConfigError("params.yaml: train.backend: unsloth needs a CUDA GPU and none is available "
                          "(use backend: hf or auto on a CPU)")
    if train.use_vllm:
        raise ConfigError("params.yaml: train.use_vllm: vLLM needs a CUDA GPU and none is available "
                          "(set it to false on a CPU)")


LOGGERS = {"wandb": "wandb", "trackio": "trackio", "tensorboard": "tensorboard"}  # train.report_to -> module


def check_report_to(train: TrainParams) -> None:
    """Each logger in `train.report_to` is installed, or one line says how to get it (checked without
    importing it: only the trainer imports a logger, and only one that was asked for)."""
    import importlib.util

    for name in train.report_to:
        module = LOGGERS[name]
        if importlib.util.find_spec(module) is None and not (name == "tensorboard"
                                                              and importlib.util.find_spec("tensorboardX")):
            raise ConfigError(f"params.yaml: train.report_to: {name} is not installed (pip install {module} in "
                              f"the venv), or remove it from train.report_to")


def check_vllm_server(train: TrainParams, poll_seconds: float = 2.0) -> None:
    """In `vllm_mode: server`, the rollout server answers at its address before a model loads (TRL
    waits up to the same timeout, then fails with a traceback deep inside the trainer)."""
    if not (train.use_vllm and train.vllm_mode == "server"):
        return
    url = train.vllm_server_base_url.rstrip("/") + "/health/"
    deadline = time.monotonic() + train.vllm_server_timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=max(0.5, min(5.0, train.vllm_server_timeout))) as response:
                if response.status == 200:
                    return
        except (OSError, ValueError):  # refused, unreachable, timed out, not HTTP
            pass
        if time.monotonic() + poll_seconds > deadline:
            raise ConfigError(f"params.yaml: train.vllm_server_base_url: no vLLM server answers at {url} after "
                              f"{train.vllm_server_timeout:g} s (start `trl vllm-serve --model <base>` there first, "
                              "or fix the address)")
        time.sleep(poll_seconds)


def resolve_backend(requested: str, cuda: bool | None = None) -> str:
    """The backend to use: `requested`, or for `auto` unsloth when CUDA is present and it imports."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if requested != "auto":
        return requested
    if not cuda:
        log.info("backend auto -> hf (no CUDA)")
        return "hf"
    try:
        import_unsloth()
    except Exception as err:  # noqa: BLE001 - any import failure means: fall back to hf
        log.warning("backend auto -> hf (unsloth does not import: %s)", err)
        return "hf"
    log.info("backend auto -> unsloth")
    return "unsloth"


def import_unsloth():
    """Import unsloth before transformers/TRL are used, so its patches apply. Unsloth writes the modules
    it compiles into UNSLOTH_COMPILE_LOCATION, read when it is imported (default: ./unsloth_compiled_cache,
    which would land in the clone): unless the user chose a place, it goes beside the other local builds."""
    from vgrpo.vendor import cache_dir

    os.environ.setdefault("UNSLOTH_COMPILE_LOCATION", str(cache_dir() / "unsloth_compiled_cache"))
    return importlib.import_module("unsloth")
