"""Published artifacts: `dvc push` to a remote, a fresh clone, `dvc pull`, nothing to rerun; a local
remote and a real SSH remote (an sshd on 127.0.0.1 started here)."""

from __future__ import annotations

import getpass
import re
import socket
import subprocess
import time
import types
from pathlib import Path

import pytest
from conftest import ROOT, copy_repo, run

pytestmark = pytest.mark.slow  # a real SSH remote, push and pull

OUTPUTS = ["data/shapes", "models/base", "models/adapter", "models/merged", "models/gguf", "models/README.md",
           "reports/base/metrics.json", "reports/train/metrics.json", "reports/eval/metrics.json",
           "reports/smoke/metrics.json", "reports/smoke/predictions.jsonl"]


def test_default_remote_and_link_types_are_configured():
    config = (ROOT / ".dvc" / "config").read_text()
    assert "remote = storage" in config and "['remote \"storage\"']" in config
    assert 'type = "reflink,hardlink,symlink,copy"' in config


# The README's "Published artifacts" sequence, exactly (test_readme_publish_block_is_this_sequence):
# publish in the repo that ran the pipeline, then a fresh git clone pulls it and has nothing to run.
PUBLISH = """\
git add -A && git commit -qm "pipeline run"
dvc push --run-cache
git clone -q <repo> <clone>
cd <clone>
dvc pull
dvc status
dvc repro
"""


def run_publish_sequence(repo: Path, clone: Path) -> dict[str, str]:
    """Each line of PUBLISH in order, `cd` moving between the two repos; returns each command's output."""
    cwd, outputs = repo, {}
    for line in PUBLISH.splitlines():
        command = line.replace("<repo>", str(repo)).replace("<clone>", str(clone))
        if command.startswith("cd "):
            cwd = Path(command[3:])
            continue
        outputs[line] = run(command, cwd).stdout
    return outputs


@pytest.fixture(scope="module")
def published(tiny_pipeline, tmp_path_factory) -> Path:
    """The tiny pipeline's repo after the README's publish steps (commit, push) and a fresh clone's pull."""
    root = tmp_path_factory.mktemp("published")
    repo = copy_repo(tiny_pipeline, root / "repo")  # next to it, the default remote: root/vgrpo-dvc-storage
    assert (repo / "checkpoints").is_dir()  # train's last checkpoint, a DVC output: a clone can resume from it
    outputs = run_publish_sequence(repo, root / "clone")
    return types.SimpleNamespace(repo=repo, clone=root / "clone", remote=root / "vgrpo-dvc-storage", outputs=outputs)


def fresh_clone(repo: Path, dest: Path, remote_url: str | None = None, keyfile: Path | None = None) -> Path:
    run(["git", "clone", "-q", str(repo), str(dest)], dest.parent)
    if remote_url:
        run(["dvc", "remote", "modify", "--local", "storage", "url", remote_url], dest)
    if keyfile:
        run(["dvc", "remote", "modify", "--local", "storage", "keyfile", str(keyfile)], dest)
    return dest


def assert_restored(clone: Path) -> None:
    for output in OUTPUTS:
        assert (clone / output).exists(), output
    assert list((clone / "models/gguf").glob("mmproj-*.gguf"))
    status = run(["dvc", "status"], clone).stdout
    assert "Data and pipelines are up to date." in status, status
    assert "Running stage" not in run(["dvc", "repro"], clone).stdout


def test_a_published_run_pulls_clean_into_a_fresh_clone(published):
    outputs = published.outputs
    assert "pushed" in outputs["dvc push --run-cache"].lower()
    assert (published.remote / "runs").is_dir()  # the run-cache went too
    assert list((published.clone / "checkpoints").glob("checkpoint-*"))  # pulled: resuming works in the clone
    assert "Data and pipelines are up to date." in outputs["dvc status"], outputs["dvc status"]
    assert "Running stage" not in outputs["dvc repro"] and "Stage 'train' didn't change" in outputs["dvc repro"]
    assert_restored(published.clone)
    assert_linked(published.clone)  # pulled outputs are links into the cache, not second copies


def test_readme_publish_block_is_this_sequence():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Publish and pull"):readme.index("## The stages")]
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", section, re.DOTALL) if "dvc push --run-cache" in b]
    assert len(blocks) == 1
    commands = [line.split("  #")[0].strip() for line in blocks[0].splitlines() if line.strip()]
    assert commands[:len(PUBLISH.splitlines())] == PUBLISH.splitlines()  # then the partial pulls and the relink


def test_pull_one_stage_or_one_directory(published, tmp_path):
    """A single stage's outputs only: `dvc pull smoke` brings the smoke reports, not the dataset or models;
    `dvc pull models/gguf` only the GGUF directory."""
    partial = fresh_clone(published.repo, published.repo.parent / "partial")
    run(["dvc", "pull", "smoke"], partial)
    assert (partial / "reports/smoke/metrics.json").exists()
    assert not (partial / "data/shapes").exists() and not (partial / "models/adapter").exists()
    run(["dvc", "pull", "models/gguf"], partial)
    assert list((partial / "models/gguf").glob("*.gguf")) and not (partial / "models/merged").exists()


def assert_linked(repo: Path) -> None:
    """A model file is stored once: the workspace file is the cache's (this machine's filesystem has no
    reflinks, so DVC falls back to hard links)."""
    for model_file in [*(repo / "models/gguf").glob("*.gguf"), repo / "models/merged/model.safetensors"]:
        assert model_file.is_symlink() or model_file.stat().st_nlink > 1, model_file


def test_relink_stores_fresh_outputs_once(published):
    """DVC copies what a stage just wrote into its cache; `dvc checkout --relink` swaps the copies for links."""
    run(["dvc", "checkout", "--relink"], published.repo)
    assert_linked(published.repo)
    assert "up to date" in run(["dvc", "status"], published.repo).stdout


# --- A real SSH remote ----------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """Debian's sshd on 127.0.0.1 with a throwaway config, key auth only; yields (url prefix, key)."""
    sshd_bin = Path("/usr/sbin/sshd")
    assert sshd_bin.exists(), "openssh-server is missing: ./setup.sh installs it (as root) for this test"
    work = tmp_path / "ssh"
    work.mkdir()
    key, host_key = work / "client_key", work / "host_key"
    for path in (key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
    port = free_port()
    config = work / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"AuthorizedKeysFile {work}/authorized_keys",
        f"PidFile {work}/sshd.pid", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "PermitRootLogin prohibit-password", "UsePAM no",
        "StrictModes no",  # the keys live in pytest's temp dir, which other users can read
        "Subsystem sftp internal-sftp", ""]))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
    process = subprocess.Popen([str(sshd_bin), "-D", "-e", "-f", str(config)], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, process.stdout.read()
            time.sleep(0.1)
    yield f"ssh://{getpass.getuser()}@127.0.0.1:{port}", key
    process.terminate()
    process.wait(timeout=10)


def test_ssh_remote_push_and_pull(published, sshd, tmp_path):
    url_prefix, key = sshd
    url = f"{url_prefix}{tmp_path / 'ssh-remote'}"
    repo = copy_repo(published.repo, tmp_path / "repo")
    run(["dvc", "remote", "modify", "--local", "storage", "url", url], repo)
    run(["dvc", "remote", "modify", "--local", "storage", "keyfile", str(key)], repo)
    run(["dvc", "push", "--run-cache"], repo)
    assert (tmp_path / "ssh-remote" / "files").is_dir() and (tmp_path / "ssh-remote" / "runs").is_dir()

    clone = fresh_clone(repo, tmp_path / "clone", url, keyfile=key)
    run(["dvc", "pull", "--run-cache"], clone)
    assert_restored(clone)


def test_pointing_the_remote_at_s3_or_ssh(published, tmp_path):
    """The README's commands change the project's remote URL and the local key file."""
    clone = fresh_clone(published.repo, tmp_path / "clone")
    run(["dvc", "remote", "modify", "storage", "url", "s3://my-bucket/vgrpo"], clone)
    assert "url = s3://my-bucket/vgrpo" in (clone / ".dvc/config").read_text()
    run(["dvc", "remote", "modify", "storage", "url", "ssh://user@host/srv/vgrpo"], clone)
    assert "url = ssh://user@host/srv/vgrpo" in (clone / ".dvc/config").read_text()
    run(["dvc", "remote", "modify", "--local", "storage", "keyfile", "~/.ssh/id_ed25519"], clone)
    assert "keyfile" in (clone / ".dvc/config.local").read_text()


def test_readme_shows_s3_ssh_and_warns_about_host_keys():
    readme = (ROOT / "README.md").read_text()
    assert "dvc remote modify storage url s3://" in readme
    assert "dvc remote modify storage url ssh://" in readme
    assert "host key" in readme.lower()
