"""Shared test helpers: the repo's params, the cached tiny model, and throwaway DVC repos."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# What a pipeline needs to run (the benchmarks' clones hold the same files): copied, not linked, so tests
# can edit freely.
sys.path.insert(0, str(ROOT / "bench"))
from pipeline import FILES as PIPELINE_FILES  # noqa: E402  (bench/pipeline.py)

# No hub here: a test that needs one starts tests/hub_server.py and points HF_ENDPOINT at it.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Torch's OpenMP threads spin while waiting: with another job on one of the 2 cores, a 2-thread step runs
# up to 10x slower (measured), and the suite runs stages in subprocesses beside its own process.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The slow tests write model copies, DVC caches and GGUF files under the temp dir: 8.1 GB at the peak of
# a full run (Intel Xeon, pytest's tmp_path_retention_policy "failed", pyproject.toml). A full disk fails
# hundreds of tests with OSError; say so once, before any of them runs.
SLOW_TESTS_NEED_GIB = float(os.environ.get("VGRPO_TEST_NEED_GIB", "12"))


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU does bfloat16 arithmetic itself (AVX512-BF16 or AMX-BF16). Elsewhere torch emulates
    it: a bfloat16 matmul took 68 times float32's time on an AMD EPYC Zen 2 (AVX2), where the 2 bfloat16 steps
    of gpu_check's hub mode had not ended after 17 minutes (the whole test: 4.5 minutes on an Intel Xeon with AMX)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags = set(cpuinfo.read_text().split()) if cpuinfo.is_file() else set()
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@pytest.hookimpl(trylast=True)  # after -m has deselected
def pytest_collection_modifyitems(config, items) -> None:
    if not any(item.get_closest_marker("slow") for item in items):
        return
    temp = Path(tempfile.gettempdir())
    free_gib = shutil.disk_usage(temp).free / 2**30
    if free_gib < SLOW_TESTS_NEED_GIB:
        pytest.exit(f"{temp} has {free_gib:.1f} GiB free; the slow tests need {SLOW_TESTS_NEED_GIB:g} GiB "
                    f"(VGRPO_TEST_NEED_GIB): free space or run the fast tier (-m \"not slow\")", returncode=1)


def load_params() -> dict:
    """params.yaml as committed: profile full, composed from conf/."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


_COMPOSED: dict[str, dict] = {}


def profile_params(profile: str) -> dict:
    """params.yaml as `dvc exp run -S profile=<profile>` writes it (composed once per test session)."""
    from vgrpo.config import compose

    if profile not in _COMPOSED:
        _COMPOSED[profile] = compose(profile)
    return copy.deepcopy(_COMPOSED[profile])


@pytest.fixture
def params() -> dict:
    """A fresh, editable copy of params.yaml."""
    return copy.deepcopy(load_params())


def write_params(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def tiny_params(**overrides) -> dict:
    """params.yaml of the tiny profile, plus `group: {key: value}` overrides."""
    raw = profile_params("tiny")
    for group, values in overrides.items():
        raw[group].update(values)
    return raw


def run(cmd: list[str] | str, cwd: Path, check: bool = True, env: dict | None = None, timeout: float = 1800):
    """Run a command with the venv on PATH and `cwd` first on PYTHONPATH (its own vgrpo copy)."""
    full_env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(cwd),
                **(env or {})}
    result = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
                            shell=isinstance(cmd, str))
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def stage(name: str, *args: str, cwd: Path = ROOT, check: bool = False, env: dict | None = None):
    """Run `python stages/<name>.py args...` as DVC would."""
    return run([sys.executable, str(ROOT / "stages" / f"{name}.py"), *args], cwd=cwd, check=check, env=env)


def make_pipeline_repo(dest: Path) -> Path:
    """A throwaway git + DVC repo holding this pipeline, with one commit (dvc exp run needs it)."""
    dest.mkdir(parents=True, exist_ok=True)
    run(["git", "init", "-q", "-b", "main"], dest)
    run(["git", "config", "user.email", "tests@example.com"], dest)
    run(["git", "config", "user.name", "tests"], dest)
    run(["dvc", "init", "-q"], dest)
    for rel in PIPELINE_FILES:  # after `dvc init`, so the project's .dvc/config (remote, cache links) wins
        src = ROOT / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / rel)
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-qm", "pipeline"], dest)
    return dest


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The cached tiny Qwen3-VL (built once per machine, ~30 s the first time)."""
    from vgrpo.tiny import tiny_model_dir as build

    return build(seed=0)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory, tiny_dataset) -> Path:
    """models/base of the tiny profile (warm-started on the tiny dataset's warmup split), written once by
    the base stage. Read it; copy it to change it."""
    out = tmp_path_factory.mktemp("tiny-base") / "base"
    params = write_params(out.parent / "params.yaml", tiny_params())
    result = stage("base", "--params", str(params), "--data", str(tiny_dataset), "--out", str(out), "--reports",
                   str(out.parent / "reports"))
    assert result.returncode == 0, result.stderr
    return out


def tiny_config(**train_changes):
    """The tiny profile's Config, with `train` knobs changed."""
    import dataclasses

    from vgrpo.config import config_from_dict

    config = config_from_dict(tiny_params())
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **train_changes))


def lora_model(base_dir: Path, config=None):
    """The tiny base with LoRA attached as the train stage attaches it (hf backend, float32), and its processor."""
    from vgrpo import models
    from vgrpo.base import base_model_path

    config = config or tiny_config()
    return models.load_for_training(base_model_path(base_dir), config.model, config.train, "hf", "float32")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> Path:
    """data/shapes of the tiny profile, written once by the generate stage. Read it; copy it to change it."""
    out = tmp_path_factory.mktemp("tiny-data") / "shapes"
    params = write_params(out.parent / "params.yaml", tiny_params())
    result = stage("generate", "--params", str(params), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory) -> Path:
    """The whole pipeline run once on the tiny profile (`dvc exp run -S profile=tiny`) in a throwaway
    repo, by the pipeline benchmark (which prints its wall time and peak memory into the test log).
    Tests that only read its outputs share it; tests that change things work on `copy_repo`."""
    repo = make_pipeline_repo(tmp_path_factory.mktemp("pipeline") / "repo")
    result = run([sys.executable, str(ROOT / "bench" / "pipeline.py"), "--repo", str(repo)], ROOT)
    print(result.stdout)
    return repo


def copy_repo(repo: Path, dest: Path) -> Path:
    """A full copy (git history, DVC cache, outputs) that a test may change."""
    shutil.copytree(repo, dest, symlinks=True)
    return dest


def tiny_adapter(out_dir: Path, base_dir: Path, seed: int = 0, scale: float = 0.02) -> Path:
    """A LoRA adapter for the tiny base in seconds, instead of a training run: LoRA attached as `train`
    attaches it, with B (zero at initialisation) set to small random values (standard deviation `scale`)
    so that merging it changes the model; at 0.1 it changes about half the warm-started model's answers
    on 8 test images, still in format."""
    import torch

    from vgrpo.training import save_adapter

    model, processor = lora_model(base_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    save_adapter(model, processor, out_dir)
    return out_dir
