"""The README's commands are the ones CI and the tests run: a command here that no test runs fails."""

from __future__ import annotations

import re
import shlex

from conftest import ROOT, stage

README = (ROOT / "README.md").read_text()

# Every command in the README's bash blocks and performance table -> the file that runs it.
RUN_BY = {
    "./setup.sh": ".ci/run",
    ".venv/bin/python -m pytest -q": ".ci/run",
    "dvc exp run -S profile=tiny": "bench/pipeline.py",  # run by the tiny_pipeline fixture (tests/conftest.py)
    "dvc repro generate": "tests/test_dvc_pipeline.py",
    "dvc exp run -S profile=tiny -S evaluate.batch_size=4": "tests/test_evaluate.py",
    "dvc exp show": "tests/test_pipeline_e2e.py",
    "dvc metrics show": "tests/test_evaluate.py",
    "dvc plots show": "tests/test_evaluate.py",
    "dvc remote modify storage url s3://my-bucket/vgrpo": "tests/test_remote.py",
    "dvc remote modify storage url ssh://user@host/srv/vgrpo": "tests/test_remote.py",
    "dvc remote modify --local storage keyfile ~/.ssh/id_ed25519": "tests/test_remote.py",
    'git add -A && git commit -qm "pipeline run"': "tests/test_remote.py",
    "dvc push --run-cache": "tests/test_remote.py",
    "git clone -q <repo> <clone>": "tests/test_remote.py",
    "cd <clone>": "tests/test_remote.py",
    "dvc pull": "tests/test_remote.py",
    "dvc status": "tests/test_remote.py",
    "dvc repro": "tests/test_remote.py",
    "dvc pull models/gguf": "tests/test_remote.py",
    "dvc pull smoke": "tests/test_remote.py",
    "dvc checkout --relink": "tests/test_remote.py",
    "python bench/generate.py --images 4000": "tests/test_benchmarks.py",
    "python bench/pipeline.py": "tests/conftest.py",
    "python bench/evaluate_speed.py": "tests/test_benchmarks.py",
    "python bench/gguf_vs_hf.py --images 8": "tests/test_smoke.py",
    "python bench/sampling.py": "tests/test_benchmarks.py",
}
NOT_RUNNABLE_HERE = ("docker ",)  # no Docker engine: the README says the image was not built here


def readme_commands() -> list[str]:
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.DOTALL):
        for line in block.splitlines():
            command = line.split("  #")[0].strip()
            if command:
                commands.append(command)
    commands += re.findall(r"`(python bench/[^`]*)`", README)
    return commands


def runs(command: str, text: str) -> bool:
    """The command appears as a Python argv list or as shell text in `text`."""
    argv = shlex.split(command, comments=True)
    if argv[0] == "python":  # a script: its file name, however the path is built
        return f'"{argv[1].rsplit("/", 1)[-1]}"' in text or argv[1] in text
    as_list = ", ".join(f'"{a}"' for a in argv)
    return as_list in text or command in text


def test_ci_runs_the_readme_setup_and_test_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.DOTALL).group(1).split("\n")
    assert [line for line in first_block if line] == ["./setup.sh", ".venv/bin/python -m pytest -q"]
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith(("#", "set ",
                                                                                                          "cd "))]
    assert ci == ["./setup.sh", ".venv/bin/python -m pytest -q"]


def test_every_readme_command_is_run_by_a_test_or_ci():
    commands = readme_commands()
    assert len(commands) >= 15
    for command in commands:
        if command.startswith(NOT_RUNNABLE_HERE):
            assert "has not been built" in README
            continue
        assert command in RUN_BY, f"README command {command!r} is not run by any test: add one, then list it here"
        assert runs(command, (ROOT / RUN_BY[command]).read_text()), (command, RUN_BY[command])


def test_every_stage_has_help():
    for name in ("generate", "train", "evaluate", "export", "smoke"):
        result = stage(name, "--help")
        assert result.returncode == 0 and "--params" in result.stdout, name
