"""Writing outputs so that an interrupted run never leaves a half-written one."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_dir(path: str | Path, swap: bool = True):
    """Yield an empty temp dir beside `path`. When the block succeeds it replaces `path` (a rename);
    when it fails it is deleted and `path` is left as it was. With swap=False the block does the
    replacing itself (`replace_dir`), e.g. to swap in two directories only once both are complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if swap:
        replace_dir(tmp, path)
    else:
        shutil.rmtree(tmp, ignore_errors=True)  # left over only if the block did not swap it in


def replace_dir(new: Path, path: Path) -> None:
    """Put the directory `new` where `path` is, by renames: `path` is never half old, half new."""
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        path.rename(old)
    new.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def write_json(path: str | Path, data) -> None:
    """Write JSON through a temp file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def write_text(path: str | Path, text: str) -> None:
    """Write a text file through a temp file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_jsonl(path: str | Path, rows) -> None:
    """Write one JSON object per line through a temp file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tmp.replace(path)


def detach(path: str | Path) -> None:
    """Give every file under `path` a copy of its own. DVC links outputs to its cache (hard links or
    symlinks); a stage that appends to an output in place, like a resumed DVCLive run, must first
    stop sharing it, or it would write into the cache."""
    for file in [p for p in Path(path).rglob("*") if p.is_file() or p.is_symlink()]:
        data = file.read_bytes()
        tmp = file.with_name(f".{file.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(file)
