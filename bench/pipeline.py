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
FILES = ["dvc.yaml", "params.yaml", "stages", "vgrpo", ".dvc/config", ".dvcignore", "data/.gitignore"]


def sh(command: list[str], cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(cwd)}
    return subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@click.command()
@click.option("--keep", is_flag=True, help="Keep the throwaway clone and print its path.")
def main(keep: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="vgrpo-bench-"))
    repo = tmp / "repo"
    for rel in FILES:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / rel).is_dir() else shutil.copy2
        copy(ROOT / rel, repo / rel)
    for command in (["git", "init", "-q"], ["dvc", "init", "-q", "--force"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "bench"]):
        sh(command, repo)

    start = time.perf_counter()
    sh(["dvc", "exp", "run", "-S", "profile=tiny"], repo)
    wall = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB

    start = time.perf_counter()
    out = sh(["dvc", "repro"], repo)
    noop = time.perf_counter() - start
    assert "Running stage" not in out, out

    print(f"tiny pipeline, end to end : {wall:7.1f} s  (goal <= 600 s)")
    print(f"peak memory (largest RSS) : {peak_gb:7.2f} GB (goal <= 6 GB)")
    print(f"no-op dvc repro           : {noop:7.2f} s  (goal <= 5 s)")
    print(f"machine                   : {os.cpu_count()} CPUs")
    if keep:
        print(f"clone kept at {repo}")
    else:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
