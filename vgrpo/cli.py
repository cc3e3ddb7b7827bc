"""What every stage script shares: one-line errors with exit code 2, and quiet third-party logs."""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager

import click

from vgrpo.config import VgrpoError


@contextmanager
def user_errors():
    """Turn a VgrpoError (bad params, missing inputs) into one line on stderr and exit code 2."""
    try:
        yield
    except VgrpoError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)


def quiet_libraries() -> None:
    """Keep stage output to what a user acts on: no tokenizer fork warnings, no DeepSpeed accelerator
    banner, no bitsandbytes notice about an optional kernel. Hub access is left as the user set it: only
    the base stage downloads, and a user's own HF_HUB_OFFLINE=1 is respected."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not _has_cuda_device() else "cuda")
    # bitsandbytes' CPU backend tries an optional kernel from the Hub at import and warns without it;
    # its own 4-bit kernels run instead.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


def _has_cuda_device() -> bool:
    return os.path.exists("/dev/nvidia0") or bool(os.environ.get("CUDA_VISIBLE_DEVICES"))
