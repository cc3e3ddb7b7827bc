"""Every command the README and docs/ show exists and runs: in a code block of any kind, or inline. A
`dvc`, `git` or setup command is run by the test or CI file listed for it; a script (`bench/*.py`,
`stages/*.py`, `scripts/*`) exists, accepts every option the command gives it, and a test runs it (a
benchmark's reporting path on the tiny run, with short settings). Docker commands cannot run here: the
README says the image was never built."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import ROOT, stage

# docs/design.md is the agreed design and the record of facts as they were measured (with the commands of
# their day), not a guide to follow: the guides are the README and the other docs.
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "design.md")]
# A command: what a shell line or an inline code span starts with.
COMMAND = re.compile(r"^(?:\$ )?((?:[A-Z_]+=\S+ )*(?:\.venv/bin/python |python |dvc |docker |git |\./setup\.sh"
                     r"|scripts/|cd <clone>)[^`]*)$")

# dvc, git and setup commands -> the file that runs them (as an argv list or as shell text).
RUN_BY = {
    "./setup.sh": ".ci/run",
    "EXTRAS=gpu ./setup.sh": "tests/test_setup.py",  # a fake nvcc, and none: both builds' commands
    "PYTHON=python3.12 ./setup.sh": "tests/test_setup.py",  # the interpreter it names, or one line why not
    ".venv/bin/python -m pytest -q": ".ci/run",
    '.venv/bin/python -m pytest -q -m "not slow"': "tests/test_fast_tier.py",
    "dvc exp run -S profile=tiny": "bench/pipeline.py",  # run by the tiny_pipeline fixture (tests/conftest.py)
    "dvc exp run -S profile=cpu": "bench/cpu_run.py",
    "dvc repro generate": "tests/test_dvc_pipeline.py",
    "dvc exp run -S profile=tiny -S evaluate.batch_size=4": "tests/test_evaluate.py",
    "dvc exp run -S profile=tiny -S generate.seed=7 generate": "tests/test_dvc_pipeline.py",
    "dvc exp show": "tests/test_pipeline_e2e.py",
    "dvc exp show --drop '.*' --keep 'Experiment|profile|test\\.(trained|gain|low|high)$|ood\\.trained|passed'":
        "tests/test_pipeline_e2e.py",
    "dvc exp run --queue -S profile=tiny -S train.learning_rate=5e-5": "tests/test_dvc_queue.py",
    "dvc exp run --queue -S profile=tiny -S train.learning_rate=2e-4": "tests/test_dvc_queue.py",
    "dvc queue start": "tests/test_dvc_queue.py",
    "dvc queue status": "tests/test_dvc_queue.py",
    "dvc exp apply <experiment>": "tests/test_dvc_queue.py",
    "dvc exp branch <experiment> <branch>": "tests/test_dvc_queue.py",
    "dvc params diff": "tests/test_pipeline_e2e.py",
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
}
NOT_RUNNABLE_HERE = ("docker ",)


def shown_commands() -> list[tuple[str, str]]:
    """(doc, command) for every command in a code block (any language, or none) or an inline code span."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.findall(r"```[^\n]*\n(.*?)```", text, re.DOTALL):
            for line in block.splitlines():
                match = COMMAND.match(line.split("  #")[0].strip())
                if match:
                    found.append((doc.name, match[1].strip()))
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        for span in re.findall(r"`([^`\n]+)`", prose):
            match = COMMAND.match(span.strip())
            if match and " " in match[1]:  # a command, not a word such as `dvc`
                found.append((doc.name, match[1].strip()))
    return found


def script_of(command: str) -> tuple[str, list[str]] | None:
    """The script a command runs and its arguments: `python bench/x.py ...`, `scripts/gpu_check.sh ...`."""
    argv = [a for a in shlex.split(command, comments=True) if not re.match(r"^[A-Z_]+=", a)]
    if argv[0].endswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
        return argv[1], argv[2:]
    if argv[0].startswith("scripts/"):
        return argv[0], argv[1:]
    return None


def runs(command: str, text: str) -> bool:
    """The command appears as a Python argv list or as shell text in `text`; one with environment variables
    (`EXTRAS=gpu ./setup.sh`) as its script's name and each variable set, as a test sets them."""
    argv = shlex.split(command, comments=True)
    env = [a for a in argv if re.match(r"^[A-Z_]+=", a)]
    if env:
        script = argv[len(env)].rsplit("/", 1)[-1]
        return script in text and all(re.search(rf'{key}=["\']?{re.escape(value)}\b', text)
                                      for key, value in (a.split("=", 1) for a in env))
    as_list = ", ".join(f'"{a}"' for a in argv)
    return as_list in text or command in text


def all_test_sources() -> str:
    return "\n".join(path.read_text() for path in sorted((ROOT / "tests").glob("*.py")))


def test_ci_runs_the_readme_setup_and_test_commands():
    """The setup command opens the README's first block; the test command opens the block that runs pytest."""
    readme = (ROOT / "README.md").read_text()
    blocks = [[line.split("  #")[0].strip() for line in block.splitlines() if line]
              for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)]
    assert blocks[0][0] == "./setup.sh"
    tests = next(b for b in blocks if b[0].startswith(".venv/bin/python -m pytest"))
    assert tests[0] == ".venv/bin/python -m pytest -q"
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith(("#", "set ",
                                                                                                          "cd "))]
    assert ci == ["./setup.sh", ".venv/bin/python -m pytest -q"]


def test_commands_are_found_in_every_kind_of_block():
    commands = shown_commands()
    assert len(commands) >= 25
    assert any(doc != "README.md" for doc, _ in commands)  # docs/ is read too
    assert ("README.md", "dvc exp run -S profile=tiny") in commands


def test_every_shown_dvc_git_and_setup_command_is_run_by_a_test_or_ci():
    for doc, command in shown_commands():
        if command.startswith(NOT_RUNNABLE_HERE):
            assert "never built" in (ROOT / "README.md").read_text()
            continue
        if script_of(command):
            continue  # the next test
        test_file = re.fullmatch(r"\.venv/bin/python -m pytest (?:-\w+ )*(tests/test_\w+\.py)(?: -k (\w+))?", command)
        if test_file:  # one file of the suite, or tests of it picked by -k: CI runs the file whole
            path = ROOT / test_file[1]
            assert path.is_file(), f"{doc}: {command!r}: no {test_file[1]}"
            if test_file[2]:
                picked = re.search(rf"^def test_\w*{test_file[2]}", path.read_text(), re.M)
                assert picked, f"{doc}: {command!r}: no test matches"
            continue
        if command.startswith("dvc exp run") and command not in RUN_BY:
            check_gpu_run(doc, command)
            continue
        assert command in RUN_BY, f"{doc}: command {command!r} is not run by any test: add one, then list it here"
        assert runs(command, (ROOT / RUN_BY[command]).read_text()), (command, RUN_BY[command])


def check_gpu_run(doc: str, command: str) -> None:
    """A `dvc exp run` of the 8B cannot run here: its overrides must compose into valid params (a key that
    does not exist fails), for a profile that needs a GPU, and the README must say none has run."""
    from vgrpo.config import ConfigError, compose, config_from_dict

    overrides = [a for flag, a in zip(shlex.split(command), shlex.split(command)[1:], strict=False) if flag == "-S"]
    profile = next((o.split("=", 1)[1] for o in overrides if o.startswith("profile=")), "full")
    try:
        config = config_from_dict(compose(profile, [o for o in overrides if not o.startswith("profile=")]))
    except ConfigError as err:
        raise AssertionError(f"{doc}: {command!r} does not compose: {err}") from None
    assert config.model.name != "tiny", f"{doc}: {command!r} runs on a CPU: a test should run it (RUN_BY)"
    assert "**never run**" in (ROOT / "README.md").read_text()


def test_every_shown_script_exists_takes_its_options_and_a_test_runs_it():
    tests = all_test_sources()
    helps: dict[str, str] = {}
    for doc, command in shown_commands():
        found = script_of(command)
        if not found:
            continue
        script, args = found
        path = ROOT / script
        assert path.is_file(), f"{doc}: {command!r}: no {script}"
        name = path.name
        assert f'"{name}"' in tests or f"/{name}" in tests, f"{doc}: no test runs {script}"
        options = [a.split("=")[0] for a in args if a.startswith("--")]
        if options and path.suffix == ".py":
            if script not in helps:
                helps[script] = subprocess.run([sys.executable, str(path), "--help"], cwd=ROOT, capture_output=True,
                                               text=True, timeout=120).stdout
            for option in options:
                assert option in helps[script], f"{doc}: {command!r}: {script} has no option {option}"


def test_the_first_screen_holds_the_pitch_the_picture_setup_and_the_demo():
    first = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for shown in ("docs/preview.png", "./setup.sh", "dvc exp run -S profile=tiny", "dvc exp show", "dvc metrics show"):
        assert shown in first, shown
    assert (ROOT / "docs/preview.png").stat().st_size > 10_000


def test_no_sentence_runs_past_50_words():
    """Prose only: code blocks, tables and inline code spans are not sentences."""
    for doc in (ROOT / "README.md",):
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
        prose = " ".join(line for line in text.splitlines() if not line.lstrip().startswith(("|", "#", "![")))
        prose = re.sub(r"`[^`]*`", "X", prose)
        for sentence in re.split(r"(?<=[.!?:;])\s+(?=[A-Z(`*\[-])", prose):
            assert len(sentence.split()) <= 50, sentence


def test_every_stage_has_help():
    for name in ("generate", "base", "train", "evaluate", "export", "smoke", "card"):
        result = stage(name, "--help")
        assert result.returncode == 0 and "--params" in result.stdout, name
