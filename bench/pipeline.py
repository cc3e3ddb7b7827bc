"""Benchmark the tiny pipeline end to end on this machine: wall time and peak memory of
`dvc exp run -S profile=tiny` in a throwaway clone (goal: <= 10 min, <= 6 GB on 2 cores), then the
time of a no-op `dvc repro` (goal: <= 5 s).

    .venv/bin/python bench/pipeline.py

Peak memory is the largest resident set of any process the run started (getrusage of children),
which is the stage that loads the most: the stages run one after another.
"""

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
FILES = ["dvc.yaml", "params.yaml", "conf", "stages", "vgrpo", ".dvc/config", ".dvcignore", ".gitignore",
         "data/.gitignore", "bench/controls.py"]  # the controls too: cpu_seeds runs the clone's copy


def cpu_name() -> str:
    """The CPU's model name and whether it has AMX / AVX-512 (what changes float sums between kinds)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    extras = [label for flag, label in (("amx_tile", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
              if flag in flags]
    cores = sum(line.startswith("processor") for line in info.splitlines())
    return f"{name} ({', '.join(extras) or 'no AVX2'}, {cores} cores)"


def environment(repo: Path) -> dict:
    """The venv on PATH and the clone's own vgrpo first on PYTHONPATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(repo)}


def sh(command: list[str], cwd: Path) -> str:
    """Run in `cwd` with its `environment`; stdout + stderr, or exit with both when it fails."""
    result = subprocess.run(command, cwd=cwd, env=environment(cwd), capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-3000:]}"
                         f"\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def make_clone(repo: Path) -> None:
    """The pipeline's files in a new git + DVC repo with one commit (`dvc exp run` needs a commit)."""
    repo.mkdir(parents=True)
    sh(["git", "init", "-q"], repo)
    sh(["dvc", "init", "-q"], repo)
    for rel in FILES:  # after `dvc init`, so the project's .dvc/config (cache link types) wins
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / rel).is_dir() else shutil.copy2
        copy(ROOT / rel, repo / rel)
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "bench"], repo)


@click.command()
@click.option("--repo", "repo_path", type=click.Path(path_type=Path),
              help="Run in this prepared git + DVC repo and keep it (tests do) [default: a temp clone, removed].")
def main(repo_path: Path | None) -> None:
    tmp = None if repo_path else Path(tempfile.mkdtemp(prefix="vgrpo-bench-"))
    repo = repo_path or tmp / "repo"
    if tmp:
        make_clone(repo)

    start = time.perf_counter()
    log = sh(["dvc", "exp", "run", "-S", "profile=tiny"], repo)
    wall = time.perf_counter() - start
    (repo / "exp-run.log").write_text(log)
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB

    start = time.perf_counter()
    out = sh(["dvc", "repro"], repo)
    noop = time.perf_counter() - start
    assert "Running stage" not in out, out

    print(f"tiny pipeline, end to end : {wall:7.1f} s  (goal <= 600 s)")
    print(f"peak memory (largest RSS) : {peak_gb:7.2f} GB (goal <= 6 GB)")
    print(f"no-op dvc repro           : {noop:7.2f} s  (goal <= 5 s)")
    print(f"machine                   : {cpu_name()}")
    if tmp:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
