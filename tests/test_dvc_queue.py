"""DVC as its users run sweeps: the README's queue block, line by line (experiments queued with -S, run by
`dvc queue start` in temporary copies of the workspace, one kept with `dvc exp apply` and `dvc exp branch`),
and a queued run of the train stage that resumes from the checkpoint its last commit names (checkpoints/ is a DVC
output, so the temporary copy checks it out)."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from conftest import ROOT, copy_repo, run

pytestmark = pytest.mark.slow  # a queued run of the tiny pipeline, and one up to its train stage

# The README's sweep block, exactly (test_the_readme_shows_this_sweep).
SWEEP = """\
dvc exp run --queue -S profile=tiny -S train.learning_rate=5e-5
dvc exp run --queue -S profile=tiny -S train.learning_rate=2e-4
dvc queue start
dvc queue status
dvc exp apply <experiment>
dvc exp branch <experiment> <branch>
"""
# the resume is checked on train's own outputs: its queued run stops after train (a stage target), as
# `dvc exp run train` does, and leaves the downstream stages' minutes to the sweep's run
RESUME = ["dvc", "exp", "run", "--queue", "-S", "profile=tiny", "-S", "train.resume=true", "-S", "train.max_steps=8",
          "train"]


def wait_for_the_queue(repo, timeout: float = 2400) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = run(["dvc", "queue", "status"], repo).stdout
        if not any(word in status for word in ("Queued", "Running")):
            return status
        time.sleep(3)
    raise AssertionError(f"the queue did not finish in {timeout} s:\n{status}")


def experiments(repo) -> dict[str, dict]:
    """name -> the experiment's params.yaml and metrics, from `dvc exp show --json`."""
    found = {}
    for commit in json.loads(run(["dvc", "exp", "show", "--json"], repo).stdout):
        for exp in commit.get("experiments") or []:
            rev = exp["revs"][0]
            data = rev.get("data") or {}
            found[exp.get("name") or rev["rev"]] = {
                "params": data.get("params", {}).get("params.yaml", {}).get("data", {}),
                "metrics": {path: m.get("data", {}) for path, m in data.get("metrics", {}).items()}}
    return found


@pytest.fixture(scope="module")
def swept(tiny_pipeline, tmp_path_factory):
    repo = copy_repo(tiny_pipeline, tmp_path_factory.mktemp("sweep") / "repo")
    # a queued run starts from the last commit and checks out the outputs its dvc.lock names: commit the
    # demo's run, as a user keeps a run, so that its checkpoint is there to resume from
    run(["git", "add", "dvc.lock", "params.yaml", ".gitignore"], repo)
    run(["git", "commit", "-q", "-m", "the tiny run"], repo)
    lines = SWEEP.splitlines()
    run(lines[1], repo)  # the first line differs only in its value: one run of the two saves minutes
    run(RESUME, repo)
    run(lines[2], repo)
    status = wait_for_the_queue(repo)
    return repo, status, experiments(repo)


def test_the_readme_shows_this_sweep():
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in readme.split("```bash\n")[1:] if b.startswith("dvc exp run --queue"))
    assert [line.split("  #")[0].strip() for line in block.split("```")[0].splitlines()] == SWEEP.splitlines()


def test_queued_runs_ran_and_one_is_kept(swept):
    repo, status, found = swept
    assert "Failed" not in status, status
    by_rate = {e["params"]["train"]["learning_rate"]: name for name, e in found.items()
               if e["params"].get("train", {}).get("max_steps") == 6}
    assert 2e-4 in by_rate, found.keys()
    name = by_rate[2e-4]
    assert found[name]["metrics"]["reports/smoke/headline.json"]["passed"] is True  # the whole pipeline ran
    lines = SWEEP.splitlines()
    run(lines[4].replace("<experiment>", name), repo)
    assert yaml.safe_load((repo / "params.yaml").read_text())["train"]["learning_rate"] == 2e-4
    run(lines[5].replace("<experiment>", name).replace("<branch>", "kept-lr-2e-4"), repo)
    assert "kept-lr-2e-4" in run(["git", "branch", "--list", "kept-lr-2e-4"], repo).stdout


def test_a_queued_run_resumes_from_the_workspaces_checkpoint(swept):
    repo, _, found = swept
    resumed = [name for name, e in found.items() if e["params"].get("train", {}).get("resume") is True]
    assert len(resumed) == 1, found.keys()
    assert found[resumed[0]]["metrics"]["reports/train/headline.json"]["steps"] == 8
    run(["dvc", "exp", "apply", resumed[0]], repo)
    train = json.loads((repo / "reports/train/metrics.json").read_text())
    assert (train["steps"], train["resumed_from"]) == (8, "checkpoint-6")  # not trained again from step 0
