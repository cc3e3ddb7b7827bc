"""Publish a finished run to the Hugging Face Hub, where people get models: three repos, each with a card
whose metadata ties it to what it came from, as the Hub's model tree reads it (`base_model`,
`base_model_relation`):

- `<user>/<name>`: the merged model (safetensors, processor, chat template), a fine-tune of the base;
- `<user>/<name>-LoRA`: the LoRA adapter alone, an adapter of the base;
- `<user>/<name>-GGUF`: the GGUF text models and the `mmproj` projector, quantizations of `<user>/<name>`,
  named as llama.cpp's convention wants, so `llama-server -hf <user>/<name>-GGUF:Q4_K_M` finds the file
  and its projector.

A base that is not on the Hub (the tiny model) has no `base_model` to point at: those two cards say so and
carry no relation. The token comes from HF_TOKEN or the Hub's login (huggingface_hub's `get_token`); it is
handed to the client only, never written to a file or printed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from vgrpo import base, card
from vgrpo.config import VgrpoError
from vgrpo.gguf_files import find_gguf_files

SUFFIXES = {"merged": "", "adapter": "-LoRA", "gguf": "-GGUF"}
RELATIONS = {"merged": "finetune", "adapter": "adapter", "gguf": "quantized"}
FOLDERS = {"merged": "models/merged", "adapter": "models/adapter", "gguf": "models/gguf"}


def repo_ids(user: str, name: str) -> dict[str, str]:
    return {kind: f"{user}/{name}{suffix}" for kind, suffix in SUFFIXES.items()}


def check_run(run_dir: Path) -> None:
    """Everything a publish reads is there, or one line names what is missing and the stage that makes it."""
    needs = {"models/merged/config.json": "export", "models/adapter/adapter_config.json": "train",
             "models/base/source.json": "base", "reports/eval/metrics.json": "evaluate",
             "reports/smoke/metrics.json": "smoke", "models/README.md": "card"}
    for path, stage in needs.items():
        if not (run_dir / path).is_file():
            raise VgrpoError(f"{run_dir / path}: not found (run the pipeline through {stage}: dvc exp run)")
    smoke = json.loads((run_dir / "reports/smoke/metrics.json").read_text())
    if not smoke.get("gate", {}).get("passed"):
        raise VgrpoError(f"{run_dir / 'reports/smoke/metrics.json'}: smoke's gate did not pass: the GGUF files are "
                         "not known to answer as the evaluated model, so they are not published")
    find_gguf_files(run_dir / "models/gguf")


def default_name(run_dir: Path) -> str:
    """The GGUF stem (`Qwen3-VL-8B-Instruct-shapes-grpo`): llama.cpp's name for the model."""
    _, projector = find_gguf_files(run_dir / "models/gguf")
    return projector.path.name.removeprefix("mmproj-").rsplit("-", 1)[0]


def repo_card(kind: str, run_dir: Path, ids: dict[str, str], profile: str) -> str:
    """The card of one repo: the run's card (models/README.md) for the GGUF files, a shorter one for the
    merged model and the adapter; metadata with the base model and the relation to it."""
    source = base.read_source(run_dir / "models/base")
    hub_base = source["name"] if source["kind"] == "hub" else None
    base_model = ids["merged"] if kind == "gguf" else hub_base
    return card.hub_card(kind, run_dir, ids, profile, base_model, RELATIONS[kind] if base_model else None)


def publish(run_dir: Path, user: str, name: str | None = None, private: bool = False, log=print) -> dict[str, str]:
    """Create (or reuse) the three repos and upload each folder with its card, one commit per repo.
    Returns kind -> repo id."""
    from huggingface_hub import HfApi, get_token

    check_run(run_dir)
    token = get_token()  # HF_TOKEN, else the login's token file
    if not token:
        raise VgrpoError("no Hugging Face token: set HF_TOKEN (a write token) or log in with `hf auth login`")
    name = name or default_name(run_dir)
    ids = repo_ids(user, name)
    profile = _params(run_dir).get("profile", "full")
    api = HfApi(token=token)
    for kind, repo_id in ids.items():
        with tempfile.TemporaryDirectory() as tmp:
            staging = Path(tmp)
            for item in (run_dir / FOLDERS[kind]).iterdir():
                if item.is_file() and item.name != "README.md":
                    (staging / item.name).symlink_to(item.resolve())
            (staging / "README.md").write_text(repo_card(kind, run_dir, ids, profile))
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(folder_path=staging, repo_id=repo_id,
                                       commit_message=f"Upload the {kind} model of a vgrpo run (profile {profile})")
        log(f"publish: {FOLDERS[kind]} -> {api.endpoint}/{repo_id} (commit {commit.oid})")
    return ids


def _params(run_dir: Path) -> dict:
    import yaml

    path = run_dir / "params.yaml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}
