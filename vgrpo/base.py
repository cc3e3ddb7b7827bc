"""Where the model GRPO starts from: the `base` stage, and how later stages find that model.

`models/base/source.json` always says where the base comes from:

- a hub id (`model.name: Qwen/Qwen3-VL-8B-Instruct`): downloaded with huggingface_hub at
  `model.revision` (a commit sha, a tag or a branch), only the files the model and processor need.
  The weights stay in the Hugging Face cache (no 17 GB copy in DVC's cache); `source.json` records
  the repo, the commit the revision resolved to, and each weight file's name, size and hash as the
  hub reports them. Later stages load exactly that commit from the cache, never from the network.
- a local directory: its path and its weight files' sizes and hashes.
- `tiny`: the tiny Qwen3-VL is built into `models/base/` itself (see `vgrpo.tiny`).

Nothing here forces offline mode: a user's own `HF_HUB_OFFLINE=1` is respected (the cache must
then hold the model). Every failure is one line that names `model.name` or `model.revision`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from vgrpo.config import Config, ModelParams, VgrpoError
from vgrpo.files import atomic_dir, write_json
from vgrpo.memory import check_cpu_can_run

SOURCE_FILE = "source.json"
# What Qwen3-VL's model and processor read: weights and their index, configs, tokenizer, chat template.
ALLOW_PATTERNS = ["*.safetensors", "*.json", "*.jinja", "merges.txt", "vocab.txt", "tokenizer.model"]
WEIGHTS = ".safetensors"


class BaseModelError(VgrpoError):
    """The base model cannot be resolved, downloaded or found."""


# --- The stage ------------------------------------------------------------------------------------

def prepare_base(config: Config, base_dir: Path, data_dir: Path, reports_dir: Path, log=print) -> dict:
    """Write `base_dir` (source.json, plus the weights of a model built here) and reports_dir/metrics.json;
    return source.json."""
    model = config.model
    if model.name == "tiny":
        source = build_tiny_base(config, base_dir, data_dir, reports_dir, log)
    elif Path(model.name).is_dir():
        source = record_local_base(model, base_dir)
    else:
        source = download_hub_base(model, base_dir)
    if source["kind"] != "tiny":
        write_json(reports_dir / "metrics.json", {"base_model": describe(source), "sha": source.get("sha")})
    (reports_dir / "plots" / "metrics").mkdir(parents=True, exist_ok=True)  # declared in dvc.yaml; empty without SFT
    return source


def write_source(base_dir: Path, source: dict, model_dir: Path | None = None) -> None:
    """Replace `base_dir` with source.json (and the files of `model_dir`, moved in), atomically."""
    with atomic_dir(base_dir) as tmp:
        if model_dir is not None:
            for item in model_dir.iterdir():
                shutil.move(str(item), tmp / item.name)
        (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")


def build_tiny_base(config: Config, base_dir: Path, data_dir: Path, reports_dir: Path, log=print) -> dict:
    """The tiny random Qwen3-VL (from the local build cache), warm-started by supervised fine-tuning
    when `base.sft_steps` > 0 (vgrpo.warm_start), into `base_dir`."""
    from vgrpo.tiny import tiny_model_dir

    model = config.model
    built = tiny_model_dir(model.tiny_seed, model.min_pixels, model.max_pixels)
    staging = base_dir.with_name(f".{base_dir.name}.build-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(built, staging)
    try:
        if config.base.sft_steps:
            from vgrpo.warm_start import warm_start

            warm = warm_start(staging, model, config.base, data_dir, reports_dir, log)
        else:
            warm = {"sft_steps": 0}
            write_json(reports_dir / "metrics.json", warm)
        if config.base.sft_steps:  # its answer styles: evaluate and the card read them
            warm = {**warm, "seed": config.base.seed, "described_share": config.base.described_share,
                    "brief_answers": config.base.brief_answers}
        source = {"kind": "tiny", "name": "tiny", "seed": model.tiny_seed, "warm_start": warm,
                  "files": weight_files_on_disk(staging)}
        write_source(base_dir, source, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return source


def record_local_base(model: ModelParams, base_dir: Path) -> dict:
    """A model directory on this machine: recorded by path and weight hashes, not copied."""
    path = Path(model.name).resolve()
    if not (path / "config.json").is_file() or not weight_files(path):
        raise BaseModelError(f"params.yaml: model.name: {path} is a directory but holds no model (config.json and "
                             "*.safetensors); give a hub id, a model directory, or tiny")
    source = {"kind": "local", "name": model.name, "path": str(path), "files": weight_files_on_disk(path)}
    check_machine_can_run(model, source["files"])
    write_source(base_dir, source)
    return source


def download_hub_base(model: ModelParams, base_dir: Path) -> dict:
    """Resolve `model.revision` to a commit, download that commit's model files into the Hugging Face
    cache (with a progress bar), and record it. When the hub cannot be reached (or HF_HUB_OFFLINE=1),
    the cache answers instead, if it holds that revision whole."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        sha, files = cached_revision(model, why="HF_HUB_OFFLINE=1 is set")
        origin = "cache (HF_HUB_OFFLINE=1)"
    else:
        try:
            sha, files = hub_revision(model)
            check_machine_can_run(model, files)  # before the download
            check_sizes(model, sha, Path(download(model, sha)), files)
            origin = "hub"
        except Unreachable as err:
            sha, files = cached_revision(model, why=str(err))
            origin = "cache (hub unreachable)"
    check_machine_can_run(model, files)  # a cached model, too, before any stage loads it
    source = {"kind": "hub", "name": model.name, "revision": model.revision, "sha": sha,
              "endpoint": constants.ENDPOINT, "origin": origin, "files": files}
    write_source(base_dir, source)
    return source


def check_machine_can_run(model: ModelParams, files: list[dict]) -> None:
    """Without CUDA, a model too large for a CPU stops here, before its download, in one line that
    names the CPU profiles (vgrpo.memory.check_cpu_can_run)."""
    import torch

    if not torch.cuda.is_available():
        check_cpu_can_run(sum(f["size"] or 0 for f in files), model.name)


class Unreachable(Exception):
    """The hub did not answer (network, DNS, proxy, timeout): the cache may still hold the model."""


def hub_revision(model: ModelParams) -> tuple[str, list[dict]]:
    """The commit `model.revision` points at (also recorded in the cache's refs/, so an offline run finds
    it later), and its weight files as the hub reports them."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        sha = str(api.resolve_revision(model.name, revision=model.revision).resolved)
        info = api.model_info(model.name, revision=sha, files_metadata=True)
    except Exception as err:  # noqa: BLE001 - every failure becomes one line naming the key to fix
        raise hub_error(err, model) from None
    files = [{"name": s.rfilename, "size": s.size, "sha256": s.lfs.sha256 if s.lfs else None,
              "blob_id": s.blob_id} for s in info.siblings or [] if s.rfilename.endswith(WEIGHTS)]
    if not files:
        raise BaseModelError(f"params.yaml: model.name: {model.name}@{sha} has no *.safetensors weights "
                             "(this pipeline loads safetensors only)")
    return sha, sorted(files, key=lambda f: f["name"])


def download(model: ModelParams, sha: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model.name, revision=sha, allow_patterns=ALLOW_PATTERNS)
    except Exception as err:  # noqa: BLE001
        raise hub_error(err, model) from None


def cached_revision(model: ModelParams, why: str) -> tuple[str, list[dict]]:
    """The commit the local cache holds for `model.revision` (whole), and its weights."""
    from huggingface_hub import constants, snapshot_download

    try:
        snapshot = Path(snapshot_download(model.name, revision=model.revision, allow_patterns=ALLOW_PATTERNS,
                                          local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, or cached in part: the same fix
        where = f"{model.name}@{model.revision}"
        if why.startswith("HF_HUB_OFFLINE"):
            raise BaseModelError(f"params.yaml: model.name: {why} and {where} is not in the Hugging Face cache "
                                 f"({constants.HF_HUB_CACHE}): unset HF_HUB_OFFLINE to download it") from None
        raise BaseModelError(f"params.yaml: model.name: could not reach the Hugging Face Hub at {constants.ENDPOINT} "
                             f"to download {where} ({why}), and it is not in the local cache: check the network, a "
                             "proxy or HF_ENDPOINT") from None
    return snapshot.name, weight_files_on_disk(snapshot)


def hub_error(err: Exception, model: ModelParams) -> Exception:
    """One line for each way the hub can refuse, naming the key to change and the fix; `Unreachable`
    when it did not answer at all."""
    import httpx
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        RevisionResolutionError,
    )

    if isinstance(err, GatedRepoError):  # a subclass of RepositoryNotFoundError: test it first
        return BaseModelError(f"params.yaml: model.name: {model.name} is a gated repo and this machine has no token "
                              "with access: accept its terms on the hub, then `hf auth login` or set HF_TOKEN")
    if isinstance(err, RevisionNotFoundError):
        return BaseModelError(f"params.yaml: model.revision: {model.revision!r} is not a commit, tag or branch of "
                              f"{model.name} (use one that exists on the hub, e.g. main)")
    if isinstance(err, RepositoryNotFoundError):
        return BaseModelError(f"params.yaml: model.name: {model.name} is not a model repo on {constants.ENDPOINT} "
                              "(check the id; a private repo needs `hf auth login` or HF_TOKEN)")
    if isinstance(err, RevisionResolutionError):  # resolve_revision: no answer and no cached ref; say why
        err = err.__cause__ or err.__context__ or err
    if isinstance(err, httpx.TransportError | LocalEntryNotFoundError | RevisionResolutionError | ConnectionError
                  | TimeoutError):
        return Unreachable(f"{type(err).__name__}: {' '.join(str(err).split())[:100]}")
    if isinstance(err, HfHubHTTPError):
        status = err.response.status_code if err.response is not None else "?"
        return BaseModelError(f"params.yaml: model.name: the Hugging Face Hub at {constants.ENDPOINT} answered HTTP "
                              f"{status} for {model.name}@{model.revision}; try again later")
    return BaseModelError(f"params.yaml: model.name: cannot get {model.name}@{model.revision} "
                          f"({type(err).__name__}: {err})")


def check_sizes(model: ModelParams, sha: str, snapshot: Path, files: list[dict]) -> None:
    for file in files:
        path = snapshot / file["name"]
        if not path.is_file() or (file["size"] is not None and path.stat().st_size != file["size"]):
            raise BaseModelError(f"params.yaml: model.name: {model.name}@{sha}: {file['name']} did not download "
                                 "whole; run the base stage again")


# --- What later stages load ---------------------------------------------------------------------

def read_source(base_dir: Path) -> dict:
    path = Path(base_dir) / SOURCE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BaseModelError(f"{path}: no base model recorded here (run the base stage: dvc repro base)") from None
    except ValueError as err:
        raise BaseModelError(f"{path}: not valid JSON ({err}); run the base stage again (dvc repro -f base)") from None


def base_model_path(base_dir: Path) -> str:
    """The directory to load the base model from: `base_dir` itself for a model built here, the local
    directory, or the cached snapshot of the recorded hub commit (no network)."""
    base_dir = Path(base_dir)
    source = read_source(base_dir)
    if source["kind"] == "hub":
        return cached_snapshot(source, base_dir)
    if source["kind"] == "local":
        if not Path(source["path"]).is_dir():
            raise BaseModelError(f"{base_dir / SOURCE_FILE}: the base model directory {source['path']} is gone")
        return source["path"]
    if not (base_dir / "config.json").is_file():
        raise BaseModelError(f"{base_dir}: the base model's files are missing (run the base stage: dvc repro -f base)")
    return str(base_dir)


def cached_snapshot(source: dict, base_dir: Path) -> str:
    from huggingface_hub import constants, snapshot_download

    try:
        return snapshot_download(source["name"], revision=source["sha"], allow_patterns=ALLOW_PATTERNS,
                                 local_files_only=True)
    except Exception:  # noqa: BLE001
        raise BaseModelError(f"{base_dir / SOURCE_FILE}: {source['name']}@{source['sha']} is not in the Hugging Face "
                             f"cache ({constants.HF_HUB_CACHE}): download it with `dvc repro -f base`") from None


def describe(source: dict) -> str:
    """`Qwen/Qwen3-VL-8B-Instruct@0c351dd` or `tiny (seed 0, warm-started 600 SFT steps, base.seed 1)`: for logs,
    metrics and the model card. The first seed is the random model's (model.tiny_seed), the last the warm start's."""
    if source["kind"] == "hub":
        return f"{source['name']}@{source['sha']}"
    if source["kind"] == "local":
        return source["path"]
    warm = source.get("warm_start") or {}
    if not warm.get("sft_steps"):
        return f"tiny (seed {source.get('seed')}, random)"
    warm_seed = f", base.seed {warm['seed']}" if "seed" in warm else ""  # recorded since 2026-12-06
    return f"tiny (seed {source.get('seed')}, warm-started {warm['sft_steps']} SFT steps{warm_seed})"


# --- Files --------------------------------------------------------------------------------------

def weight_files(path: Path) -> list[Path]:
    return sorted(p for p in path.glob(f"*{WEIGHTS}"))


def weight_files_on_disk(path: Path) -> list[dict]:
    """Name, size and sha256 of each weight file. A hub cache names LFS blobs by their sha256, so a
    cached snapshot's hashes come from its blob names, without reading gigabytes."""
    files = []
    for file in weight_files(path):
        blob = file.resolve().name
        digest = blob if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob) else sha256(file)
        files.append({"name": file.name, "size": file.stat().st_size, "sha256": digest})
    return files


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
