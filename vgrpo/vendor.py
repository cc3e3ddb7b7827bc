"""Where things that are not Python packages live: llama.cpp's converter and vocab files, and the
cache for locally built models."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from vgrpo.config import VgrpoError


def llama_cpp_dir() -> Path:
    """llama.cpp's `convert_hf_to_gguf.py`, `gguf-py` and vocab files, unpacked by ./setup.sh from the
    sdist of the pinned llama-cpp-python (so converter and runtime are the same llama.cpp)."""
    path = Path(os.environ.get("VGRPO_LLAMA_CPP_DIR", Path(sys.prefix) / "llama.cpp"))
    if not (path / "convert_hf_to_gguf.py").is_file():
        raise VgrpoError(f"{path}: llama.cpp converter not found (run ./setup.sh, or set VGRPO_LLAMA_CPP_DIR)")
    return path


def cache_dir() -> Path:
    """Models built locally (the tiny Qwen3-VL), shared by every checkout on this machine."""
    path = Path(os.environ.get("VGRPO_CACHE", Path.home() / ".cache" / "vgrpo"))
    path.mkdir(parents=True, exist_ok=True)
    return path
