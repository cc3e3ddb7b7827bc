"""`scripts/publish.py` uploads a finished run to the Hub, over HTTP, to the local Hub stand-in
(tests/hub_server.py): three repos (GGUF, merged, adapter), the files byte for byte, each card tied to what
the model came from, the GGUF card with the `llama-server -hf` line; the token from the environment, never
written or printed. The real Hub's Xet storage has no stand-in, so the client uploads over LFS
(HF_HUB_DISABLE_XET=1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, copy_repo
from hub_server import FakeHub

from vgrpo import publish as hub_publish
from vgrpo.config import VgrpoError

TOKEN = "hf_vgrpo_test_write_token_0123456789"
NAME = "Qwen3-VL-tiny-shapes-grpo"


def publish(hub: FakeHub, repo, tmp_path, *args: str, token: str | None = TOKEN, check: bool = True):
    """scripts/publish.py in a subprocess whose environment is the stand-in's client's: online, its own HF_HOME."""
    env = hub.client_env(tmp_path / "hf-home", HF_HUB_DISABLE_XET="1", **({"HF_TOKEN": token} if token else {}))
    result = subprocess.run([sys.executable, str(ROOT / "scripts/publish.py"), "--user", "tester", "--run", str(repo),
                             *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert not check or result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    return result


def metadata(readme: bytes) -> dict:
    return yaml.safe_load(readme.decode().split("---\n")[1])


@pytest.fixture(scope="module")
def published(tiny_pipeline, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("publish")
    with FakeHub(write_token=TOKEN) as hub:
        result = publish(hub, tiny_pipeline, tmp)
        repos = {repo: hub.repo_files(repo) for repo in (f"tester/{NAME}", f"tester/{NAME}-LoRA",
                                                         f"tester/{NAME}-GGUF")}
        yield result, repos, hub.requests, tmp


@pytest.mark.slow  # reads the tiny pipeline's run
def test_three_repos_hold_the_run_byte_for_byte(published, tiny_pipeline):
    _, repos, requests, _ = published
    for repo, folder in ((f"tester/{NAME}-GGUF", "models/gguf"), (f"tester/{NAME}", "models/merged"),
                         (f"tester/{NAME}-LoRA", "models/adapter")):
        # the folder's own README.md (PEFT's blank card in the adapter's) is replaced by the repo's card
        local = {p.name: p.read_bytes() for p in (tiny_pipeline / folder).iterdir()
                 if p.is_file() and p.name != "README.md"}
        uploaded = {path: data for path, data in repos[repo].items() if path != "README.md"}
        assert uploaded == local, repo
    assert {f"{NAME}-Q4_K_M.gguf", f"mmproj-{NAME}-F16.gguf"} <= set(repos[f"tester/{NAME}-GGUF"])
    assert sum(r.startswith("PUT /lfs-upload/") for r in requests) >= 4  # gguf and safetensors went over LFS
    assert sum(r.startswith("POST /api/repos/create") for r in requests) == 3


@pytest.mark.slow  # reads the tiny pipeline's run
def test_each_card_says_what_its_model_came_from(published):
    _, repos, _, _ = published
    gguf = repos[f"tester/{NAME}-GGUF"]["README.md"]
    meta = metadata(gguf)
    assert (meta["base_model"], meta["base_model_relation"], meta["library_name"]) == (f"tester/{NAME}", "quantized",
                                                                                       "gguf")
    assert f"llama-server -hf tester/{NAME}-GGUF:Q4_K_M --no-repack" in gguf.decode()
    assert f"-m {NAME}-Q4_K_M.gguf --mmproj mmproj-{NAME}-F16.gguf" in gguf.decode()  # files at the repo's root
    assert {r["dataset"]["split"] for r in meta["model-index"][0]["results"]} == {"test", "ood"}
    for repo, library in ((f"tester/{NAME}", "transformers"), (f"tester/{NAME}-LoRA", "peft")):
        meta = metadata(repos[repo]["README.md"])
        # the tiny base is not on the Hub: no base_model to point at, so no relation either
        assert meta["library_name"] == library and "base_model" not in meta and "base_model_relation" not in meta


@pytest.mark.slow  # reads the tiny pipeline's run
def test_a_hub_base_gets_finetune_and_adapter_relations(tiny_pipeline, tmp_path):
    """The 8B's run: its base is a hub model, which the merged model fine-tunes and the adapter adapts."""
    repo = copy_repo(tiny_pipeline, tmp_path / "repo")
    source_path = repo / "models/base/source.json"
    source = json.loads(source_path.read_text())
    source_path.unlink()  # a DVC cache link: replace it, not the cached file
    source_path.write_text(json.dumps({**source, "kind": "hub", "name": "Qwen/Qwen3-VL-8B-Instruct", "revision": "main",
                                       "sha": "0" * 40}))
    with FakeHub(write_token=TOKEN) as hub:
        publish(hub, repo, tmp_path, "--name", "counter")
        cards = {kind: metadata(hub.repo_files(f"tester/counter{suffix}")["README.md"])
                 for kind, suffix in (("merged", ""), ("adapter", "-LoRA"), ("gguf", "-GGUF"))}
    assert (cards["merged"]["base_model"], cards["merged"]["base_model_relation"]) == ("Qwen/Qwen3-VL-8B-Instruct",
                                                                                       "finetune")
    assert (cards["adapter"]["base_model"], cards["adapter"]["base_model_relation"]) == ("Qwen/Qwen3-VL-8B-Instruct",
                                                                                         "adapter")
    assert (cards["gguf"]["base_model"], cards["gguf"]["base_model_relation"]) == ("tester/counter", "quantized")


@pytest.mark.slow  # reads the tiny pipeline's run
def test_the_token_is_never_written_or_printed(published, tiny_pipeline):
    result, _, _, tmp = published
    assert TOKEN not in result.stdout + result.stderr
    for root in (tiny_pipeline, tmp):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
                assert TOKEN.encode() not in path.read_bytes(), path


@pytest.mark.slow  # reads the tiny pipeline's run
def test_no_token_or_a_failed_gate_is_one_line(tiny_pipeline, tmp_path):
    with FakeHub(write_token=TOKEN) as hub:
        result = publish(hub, tiny_pipeline, tmp_path, token=None, check=False)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines()[-1] == (
            "error: no Hugging Face token: set HF_TOKEN (a write token) or log in with `hf auth login`")
        repo = tmp_path / "repo"
        shutil.copytree(tiny_pipeline, repo, symlinks=True)
        smoke = repo / "reports/smoke/metrics.json"
        metrics = json.loads(smoke.read_text())
        smoke.unlink()
        smoke.write_text(json.dumps({**metrics, "gate": {"passed": False, "failures": ["x"]}}))
        result = publish(hub, repo, tmp_path, check=False)
        assert result.returncode == 2 and "smoke's gate did not pass" in result.stderr.strip().splitlines()[-1]
        assert not any(r.startswith("POST") for r in hub.requests)  # refused before any upload


def test_repo_ids_name_the_three_repos():
    assert hub_publish.repo_ids("me", "counter") == {"merged": "me/counter", "adapter": "me/counter-LoRA",
                                                      "gguf": "me/counter-GGUF"}


def test_a_run_without_its_outputs_is_refused_naming_the_file_and_its_stage(tmp_path):
    with pytest.raises(VgrpoError, match=r"models/merged/config.json: not found \(run the pipeline through export"):
        hub_publish.check_run(tmp_path)
    for path in ("models/merged/config.json", "models/adapter/adapter_config.json", "models/base/source.json",
                 "reports/eval/metrics.json", "models/README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    with pytest.raises(VgrpoError, match=r"reports/smoke/metrics.json: not found \(run the pipeline through smoke"):
        hub_publish.check_run(tmp_path)
    (tmp_path / "reports/smoke").mkdir()
    (tmp_path / "reports/smoke/metrics.json").write_text('{"gate": {"passed": false}}')
    with pytest.raises(VgrpoError, match="smoke's gate did not pass"):
        hub_publish.check_run(tmp_path)
