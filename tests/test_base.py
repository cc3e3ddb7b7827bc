"""The base stage: the model comes from the hub at a pinned revision, over real HTTP (a stand-in hub on
127.0.0.1 serving the tiny model's files in the hub's URL layout, tests/hub_server.py), and later
stages load exactly the recorded commit from the cache. Every way the hub can refuse is one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, VENV_BIN, tiny_params, write_params
from hub_server import FakeHub

from vgrpo.base import sha256

REPO = "Qwen/Qwen3-VL-Tiny-Test"


def hub_params(tmp_path: Path, name: str = REPO, revision: str = "main") -> Path:
    """The tiny profile with the model from the hub (no warm start: that is for the model built here)."""
    return write_params(tmp_path / "params.yaml", hub_raw(name, revision))


def hub_raw(name: str = REPO, revision: str = "main", **groups) -> dict:
    raw = tiny_params(**groups)
    raw["model"]["name"] = name
    raw["base"]["sft_steps"] = 0
    raw["model"]["revision"] = revision
    return raw


def run_base(params: Path, out: Path, env: dict) -> subprocess.CompletedProcess:
    """`python stages/base.py` as DVC runs it, in the given (hub client) environment."""
    env = {**env, "PATH": f"{VENV_BIN}:{env['PATH']}", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / "stages" / "base.py"), "--params", str(params), "--out",
                           str(out), "--reports", str(out.parent / f"{out.name}-reports")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def load_from(base_dir: Path, env: dict) -> dict:
    """What a later stage sees: the directory it loads from and the config found there (no network)."""
    code = ("import json, sys; from pathlib import Path; from vgrpo.base import base_model_path; "
            "from transformers import AutoConfig; path = base_model_path(Path(sys.argv[1])); "
            "print(json.dumps({'path': path, 'hidden': AutoConfig.from_pretrained(path).text_config.hidden_size}))")
    result = subprocess.run([sys.executable, "-c", code, str(base_dir)], cwd=ROOT, capture_output=True, text=True,
                            env={**env, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}, check=True)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def tiny_files(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model's files, as a hub repo would hold them (plus a README the download must skip)."""
    files = tmp_path_factory.mktemp("repo") / "files"
    shutil.copytree(tiny_model_dir, files)
    (files / "README.md").write_text("# tiny\n")
    return files


@pytest.mark.slow
def test_downloads_pins_the_commit_then_works_from_the_cache(tiny_files, tmp_path):
    hf_home, base_dir = tmp_path / "hf", tmp_path / "models" / "base"
    with FakeHub() as hub:
        sha = hub.add_repo(REPO, tiny_files)
        env = hub.client_env(hf_home)
        result = run_base(hub_params(tmp_path), base_dir, env)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"{REPO}@{sha}" in result.stdout  # the resolved commit is printed
        assert any(r.startswith("GET /cdn-lfs/") for r in hub.requests)  # the weights came over HTTP

    source = json.loads((base_dir / "source.json").read_text())
    assert (source["kind"], source["name"], source["revision"], source["sha"]) == ("hub", REPO, "main", sha)
    assert source["files"] == [{"name": "model.safetensors", "size": (tiny_files / "model.safetensors").stat().st_size,
                                "sha256": sha256(tiny_files / "model.safetensors"), "blob_id": source["files"][0][
                                    "blob_id"]}]
    assert sorted(p.name for p in base_dir.iterdir()) == ["source.json"]  # the weights stay in the HF cache
    snapshot = hf_home / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / sha
    assert (snapshot / "model.safetensors").is_file() and not (snapshot / "README.md").exists()
    assert load_from(base_dir, env)["path"] == str(snapshot)

    # The hub is gone (its port is closed): the same run works from the cache and records the same commit.
    again = run_base(hub_params(tmp_path), tmp_path / "again", env)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads((tmp_path / "again" / "source.json").read_text())
    assert (second["sha"], second["origin"]) == (sha, "cache (hub unreachable)")
    assert [(f["name"], f["size"], f["sha256"]) for f in second["files"]] == [
        (f["name"], f["size"], f["sha256"]) for f in source["files"]]

    # A user's own HF_HUB_OFFLINE=1 is respected, and `main` resolves from the cache.
    offline = run_base(hub_params(tmp_path), tmp_path / "offline", {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr[-3000:]
    assert json.loads((tmp_path / "offline" / "source.json").read_text())["sha"] == sha


@pytest.mark.slow
def test_later_stages_load_the_recorded_commit_not_the_branch(tiny_files, tmp_path):
    hf_home = tmp_path / "hf"
    newer = tmp_path / "newer"
    shutil.copytree(tiny_files, newer)
    config = json.loads((newer / "config.json").read_text())
    config["text_config"]["hidden_size"] = 512  # a later push to main changes the model
    (newer / "config.json").write_text(json.dumps(config))
    with FakeHub() as hub:
        first = hub.add_repo(REPO, tiny_files)
        env = hub.client_env(hf_home)
        assert run_base(hub_params(tmp_path), tmp_path / "pinned", env).returncode == 0
        second = hub.add_repo(REPO, newer)  # main moves on
        assert run_base(hub_params(tmp_path, revision=first), tmp_path / "by-sha", env).returncode == 0
        assert run_base(hub_params(tmp_path), tmp_path / "latest", env).returncode == 0
    assert first != second
    assert json.loads((tmp_path / "latest" / "source.json").read_text())["sha"] == second
    assert load_from(tmp_path / "pinned", env)["hidden"] == 256  # still the commit recorded before the push
    assert load_from(tmp_path / "by-sha", env)["hidden"] == 256
    assert load_from(tmp_path / "latest", env)["hidden"] == 512


def error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout[-2000:], result.stderr[-2000:])
    return result.stderr.strip().splitlines()[-1]


def test_unknown_repo(tiny_files, tmp_path):
    with FakeHub() as hub:
        hub.add_repo(REPO, tiny_files)
        line = error_line(run_base(hub_params(tmp_path, name="Qwen/No-Such-Model"), tmp_path / "b",
                                   hub.client_env(tmp_path / "hf")))
        assert line == (f"error: params.yaml: model.name: Qwen/No-Such-Model is not a model repo on {hub.endpoint} "
                        "(check the id; a private repo needs `hf auth login` or HF_TOKEN)")
    assert not (tmp_path / "b").exists()


def test_unknown_revision(tiny_files, tmp_path):
    with FakeHub() as hub:
        hub.add_repo(REPO, tiny_files)
        line = error_line(run_base(hub_params(tmp_path, revision="v9.9"), tmp_path / "b",
                                   hub.client_env(tmp_path / "hf")))
    assert line == (f"error: params.yaml: model.revision: 'v9.9' is not a commit, tag or branch of {REPO} (use one "
                    "that exists on the hub, e.g. main)")


@pytest.mark.slow
def test_gated_repo_without_a_token(tiny_files, tmp_path):
    with FakeHub() as hub:
        hub.add_repo(REPO, tiny_files, gated=True, token="hf_secret")
        env = hub.client_env(tmp_path / "hf")
        line = error_line(run_base(hub_params(tmp_path), tmp_path / "b", env))
        assert line == (f"error: params.yaml: model.name: {REPO} is a gated repo and this machine has no token with "
                        "access: accept its terms on the hub, then `hf auth login` or set HF_TOKEN")
        with_token = run_base(hub_params(tmp_path), tmp_path / "b", {**env, "HF_TOKEN": "hf_secret"})
        assert with_token.returncode == 0, with_token.stderr[-2000:]


@pytest.mark.slow
def test_a_model_too_large_for_a_cpu_stops_before_its_download(tiny_files, tmp_path):
    """No CUDA here: a hub model above the CPU limit of 4 GB (a sparse shard: the hub stand-in hashes it, so
    kept small) stops on its sizes, before any weight is fetched, in one line naming the CPU profiles."""
    large = tmp_path / "large"
    shutil.copytree(tiny_files, large)
    with (large / "model-00002-of-00002.safetensors").open("wb") as f:
        f.truncate(4_200_000_000)  # sparse: no disk used
    with FakeHub() as hub:
        hub.add_repo(REPO, large)
        line = error_line(run_base(hub_params(tmp_path), tmp_path / "b", hub.client_env(tmp_path / "hf")))
        assert not any(r.startswith("GET /cdn-lfs/") for r in hub.requests)  # nothing downloaded
    total = sum(p.stat().st_size for p in large.glob("*.safetensors")) / 1e9
    assert line.startswith(f"error: params.yaml: model.name: {REPO} has {total:.1f} GB of weights and this machine "
                           "has no CUDA GPU (it would load in float32 on the CPU): run it on a GPU, or use a CPU "
                           "profile: dvc exp run -S profile=tiny, or -S profile=cpu")
    assert not (tmp_path / "b").exists()


def test_no_network_fails_fast_naming_the_model(tmp_path):
    hub = FakeHub().start()
    env = hub.client_env(tmp_path / "hf")  # an empty cache
    hub.stop()  # nothing listens on the endpoint any more
    start = time.monotonic()
    line = error_line(run_base(hub_params(tmp_path), tmp_path / "b", env))
    assert time.monotonic() - start < 60
    assert line.startswith(f"error: params.yaml: model.name: could not reach the Hugging Face Hub at {hub.endpoint} "
                           f"to download {REPO}@main (ConnectError: ")
    assert line.endswith("and it is not in the local cache: check the network, a proxy or HF_ENDPOINT")
    assert "offline" not in line.lower()


def test_offline_mode_with_the_model_not_cached(tmp_path):
    hub = FakeHub().start()
    env = hub.client_env(tmp_path / "hf", HF_HUB_OFFLINE="1")
    hub.stop()
    line = error_line(run_base(hub_params(tmp_path), tmp_path / "b", env))
    assert line == (f"error: params.yaml: model.name: HF_HUB_OFFLINE=1 is set and {REPO}@main is not in the Hugging "
                    f"Face cache ({tmp_path / 'hf' / 'hub'}): unset HF_HUB_OFFLINE to download it")


def test_a_recorded_commit_missing_from_the_cache(tmp_path):
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "source.json").write_text(json.dumps({"kind": "hub", "name": REPO, "sha": "a" * 40}))
    code = ("import sys; from pathlib import Path; from vgrpo.base import base_model_path; "
            "base_model_path(Path(sys.argv[1]))")
    result = subprocess.run([sys.executable, "-c", code, str(base_dir)], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)})
    assert f"{REPO}@{'a' * 40} is not in the Hugging Face cache" in result.stderr
    assert "download it with `dvc repro -f base`" in result.stderr


def test_no_stage_forces_offline_mode(monkeypatch):
    from vgrpo.cli import quiet_libraries

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    quiet_libraries()
    import os

    assert "HF_HUB_OFFLINE" not in os.environ
    for script in (ROOT / "stages").glob("*.py"):
        assert "HF_HUB_OFFLINE" not in script.read_text(), script


def test_tiny_base_is_built_into_models_base(tiny_base):
    source = json.loads((tiny_base / "source.json").read_text())
    assert source["kind"] == "tiny"
    assert (tiny_base / "model.safetensors").is_file() and (tiny_base / "config.json").is_file()
    assert source["files"][0]["sha256"] == sha256(tiny_base / "model.safetensors")


def test_a_local_model_directory_is_recorded_not_copied(tiny_model_dir, tmp_path):
    from vgrpo.base import base_model_path, prepare_base
    from vgrpo.config import config_from_dict

    raw = hub_raw(str(tiny_model_dir))
    source = prepare_base(config_from_dict(raw), tmp_path / "base", tmp_path / "no-data", tmp_path / "reports")
    assert source["kind"] == "local" and source["path"] == str(tiny_model_dir)
    assert sorted(p.name for p in (tmp_path / "base").iterdir()) == ["source.json"]
    assert base_model_path(tmp_path / "base") == str(tiny_model_dir)


def test_a_tiny_base_is_described_by_both_its_seeds():
    """The random model's seed (model.tiny_seed) and the warm start's (base.seed) differ between the cpu seeds'
    runs: a description that named only the first said `seed 0` for every seed's warm start."""
    from vgrpo.base import describe

    warm = {"sft_steps": 600, "seed": 3, "described_share": 0.4}
    described = describe({"kind": "tiny", "seed": 0, "warm_start": warm})
    assert described == "tiny (seed 0, warm-started 600 SFT steps, base.seed 3)"
    assert describe({"kind": "tiny", "seed": 0, "warm_start": {"sft_steps": 0}}) == "tiny (seed 0, random)"
    assert describe({"kind": "hub", "name": "Qwen/Qwen3-VL-8B-Instruct", "sha": "0c351dd"}) == \
        "Qwen/Qwen3-VL-8B-Instruct@0c351dd"
