"""setup.sh's checks of the machine, in seconds and without installing anything.

Each test runs a copy of setup.sh (with pyproject.toml) on a PATH that holds only the few tools the
script uses plus fakes: interpreters that print a version, compilers, `id` (root or not), `apt-get`,
and a venv python whose pip "compiles" llama-cpp-python. SETUP_PREREQS_ONLY=1 stops after the checks.
The real install (a fresh clone on Python 3.11, 3.12 and 3.13) is measured by hand: see the README.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = (ROOT / "pyproject.toml").read_text()
LLAMA = re.search(r'"llama-cpp-python==([^"]+)"', PYPROJECT).group(1)
# What setup.sh runs besides the fakes; a new external command in it must be added here.
TOOLS = ["bash", "env", "sed", "cat", "sha256sum", "cut", "dirname", "mktemp", "rm", "mv", "cp", "tar", "grep",
         "tail", "sleep", "setsid", "find"]
# The Dockerfile's llama.cpp CUDA architectures, which setup.sh builds too (T4 7.5 to H100 9.0).
CUDA_ARCHITECTURES = "75-real;80-real;86-real;89-real;90-real;90-virtual"


def executable(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def fake_python(path: Path, version: str | None, *, venv_module: bool = True, llama: str | None = None,
                pip: str = 'echo "unexpected: $*" >&2; exit 99') -> Path:
    """An interpreter that answers setup.sh's questions; version None: it does not run (a pyenv shim)."""
    if version is None:
        return executable(path, 'echo "pyenv: python: command not found" >&2; exit 127\n')
    return executable(path, f"""case "$*" in
  *sys.version_info*) echo {version} ;;
  *ensurepip*) exit {0 if venv_module else 1} ;;
  *llama_cpp_python*) {f"echo {llama}" if llama else "exit 1"} ;;
  *) {pip} ;;
esac
""")


class Machine:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.repo = tmp / "repo"
        self.repo.mkdir()
        shutil.copy2(ROOT / "setup.sh", self.repo / "setup.sh")
        (self.repo / "pyproject.toml").write_text(PYPROJECT)
        self.bin = tmp / "bin"
        self.bin.mkdir()
        for tool in TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        self.venv = tmp / "venv"  # VENV_DIR: never the repo's .venv, and no openssh-server install
        self.apt_log = tmp / "apt-get.log"
        self.uid(1000)

    def python(self, name: str, version: str | None, **kw) -> Path:
        return fake_python(self.bin / name, version, **kw)

    def compilers(self, where: Path | None = None) -> None:
        for name in ("cc", "c++"):
            executable((where or self.bin) / name, "exit 0\n")

    def uid(self, uid: int) -> None:
        executable(self.bin / "id", f"echo {uid}\n")

    def apt_get(self, *, brings_compilers: bool) -> None:
        """apt-get that logs its arguments; `install build-essential` puts cc and c++ on PATH."""
        self.compilers(self.tmp / "debs")
        copy = f'cp {self.tmp}/debs/cc {self.tmp}/debs/c++ {self.bin}/' if brings_compilers else ":"
        executable(self.bin / "apt-get", f"""echo "$*" >> {self.apt_log}
case "$*" in *install*build-essential*) {copy} ;; esac
""")

    def run(self, *, prereqs_only: bool = True, **env: str) -> subprocess.CompletedProcess:
        env = {"PATH": str(self.bin), "HOME": str(self.tmp), "VENV_DIR": str(self.venv),
               **({"SETUP_PREREQS_ONLY": "1"} if prereqs_only else {}), **env}
        return subprocess.run([self.repo / "setup.sh"], env=env, capture_output=True, text=True, timeout=60)


def output(result: subprocess.CompletedProcess) -> list[str]:
    return (result.stdout + result.stderr).splitlines()


def one_line_failure(result: subprocess.CompletedProcess) -> str:
    lines = output(result)
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, lines)
    assert lines[0].startswith("setup: ")
    return lines[0]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


@pytest.mark.parametrize(("on_path", "chosen"), [
    ({"python3.11": "3.11", "python3.12": "3.12", "python3": "3.11"}, "python3.11 (Python 3.11)"),
    # python3.11 a pyenv shim that does not run, python3 too old: the first that runs and fits
    ({"python3.11": None, "python3.12": "3.12", "python3.13": "3.13", "python3": "3.10"}, "python3.12 (Python 3.12)"),
    ({"python3.13": "3.13", "python3.14": "3.14"}, "python3.13 (Python 3.13)"),
    ({"python3": "3.13"}, "python3 (Python 3.13)"),  # Debian 13: plain python3 is enough
])
def test_setup_chooses_the_first_supported_python_on_path(machine, on_path, chosen):
    machine.compilers()
    for name, version in on_path.items():
        machine.python(name, version)
    result = machine.run()
    assert result.returncode == 0, output(result)
    assert output(result) == [f"setup: prerequisites ok: {chosen}; C/C++ compiler for llama-cpp-python"]


def test_setup_without_a_supported_python_says_so_in_one_line(machine):
    machine.compilers()
    machine.python("python3", "3.10")
    machine.python("python3.14", "3.14")
    machine.python("python3.11", None)
    line = one_line_failure(machine.run())
    assert "no Python 3.11 to 3.13 found" in line
    assert "python3.11 python3.12 python3.13 python3" in line  # what it looked for
    assert "apt-get install python3-venv" in line and "PYTHON=" in line  # how to get one


def test_setup_takes_its_versions_from_requires_python(machine):
    machine.compilers()
    machine.python("python3.13", "3.13")
    assert machine.run().returncode == 0
    narrowed = PYPROJECT.replace('requires-python = ">=3.11,<3.14"', 'requires-python = ">=3.11,<3.13"')
    assert narrowed != PYPROJECT
    (machine.repo / "pyproject.toml").write_text(narrowed)
    assert "no Python 3.11 to 3.12 found" in one_line_failure(machine.run())


def test_python_overrides_the_choice_and_is_checked(machine):
    machine.compilers()
    machine.python("python3.11", "3.11")
    custom = fake_python(machine.tmp / "opt" / "python", "3.13")
    result = machine.run(PYTHON=str(custom))
    assert output(result) == [f"setup: prerequisites ok: {custom} (Python 3.13); C/C++ compiler for llama-cpp-python"]

    old = fake_python(machine.tmp / "opt" / "python3.10", "3.10")
    assert one_line_failure(machine.run(PYTHON=str(old))) == (
        f"setup: PYTHON={old} is Python 3.10; this project needs Python 3.11 to 3.13")
    assert "PYTHON=python3.12 does not run" in one_line_failure(machine.run(PYTHON="python3.12"))


def test_missing_venv_module_names_the_debian_package(machine):
    machine.compilers()
    machine.python("python3.12", "3.12", venv_module=False)
    line = one_line_failure(machine.run())
    assert "python3.12 (Python 3.12) cannot create a venv: install python3.12-venv" in line


def test_an_existing_venv_keeps_its_python(machine):
    fake_python(machine.venv / "bin" / "python", "3.11", llama=LLAMA)
    machine.python("python3.12", "3.12")
    result = machine.run()
    assert output(result) == [f"setup: prerequisites ok: {machine.venv}/bin/python (Python 3.11)"]
    line = one_line_failure(machine.run(PYTHON="python3.12"))
    assert f"{machine.venv} is Python 3.11 but PYTHON=python3.12 is 3.12: remove {machine.venv}" in line
    fake_python(machine.venv / "bin" / "python", "3.10", llama=LLAMA)
    assert "is Python 3.10; this project needs Python 3.11 to 3.13" in one_line_failure(machine.run())


def test_no_compiler_and_not_root_names_the_package_in_one_line(machine):
    machine.python("python3.12", "3.12")
    machine.apt_get(brings_compilers=True)  # there, but not ours to run
    line = one_line_failure(machine.run())
    assert "compiling llama-cpp-python needs a C and C++ compiler" in line
    assert "sudo apt-get install build-essential" in line
    assert not machine.apt_log.exists()
    machine.compilers()
    assert machine.run().returncode == 0


def test_no_compiler_as_root_installs_build_essential(machine):
    machine.python("python3.12", "3.12")
    machine.uid(0)
    machine.apt_get(brings_compilers=True)
    result = machine.run()
    assert result.returncode == 0, output(result)
    assert output(result) == [
        "setup: no working C/C++ compiler for the llama-cpp-python build: installing build-essential (apt-get)",
        "setup: prerequisites ok: python3.12 (Python 3.12); C/C++ compiler for llama-cpp-python",
    ]
    assert machine.apt_log.read_text().splitlines() == ["update -qq", "install -y -qq build-essential"]


def test_root_install_that_brings_no_compiler_fails_in_one_line(machine):
    machine.python("python3.12", "3.12")
    machine.uid(0)
    machine.apt_get(brings_compilers=False)
    lines = output(machine.run())
    assert lines[-1] == "setup: build-essential is installed but cc/c++ still cannot build a test program"


def test_no_compiler_needed_when_the_venv_has_the_pinned_llama_cpp(machine):
    fake_python(machine.venv / "bin" / "python", "3.12", llama=LLAMA)
    assert output(machine.run()) == [f"setup: prerequisites ok: {machine.venv}/bin/python (Python 3.12)"]
    fake_python(machine.venv / "bin" / "python", "3.12", llama="0.3.1")  # another version: rebuilt
    assert "needs a C and C++ compiler" in one_line_failure(machine.run())


def test_the_compile_reports_progress_and_its_log_on_failure(machine):
    # pip's build log as ninja writes it: [step/total]; it fails after a few seconds
    compile_ = ('echo "[3/10] Building C object ggml.c"; sleep 1; echo "[7/10] Building CXX object llama.cpp"; '
                'sleep 2.5; echo "ninja: build stopped: subcommand failed."; exit 1')
    fake_python(machine.venv / "bin" / "python", "3.12",
                pip=f'case "$*" in *"install -v --no-deps llama-cpp-python=={LLAMA}") {compile_} ;; *) exit 99 ;; esac')
    machine.compilers()
    result = machine.run(prereqs_only=False, SETUP_HEARTBEAT_S="1")
    lines = output(result)
    assert result.returncode == 1, lines
    assert result.stdout.startswith(f"setup: compiling llama-cpp-python {LLAMA} from source (6-8 minutes on 2 cores;")
    beats = [line for line in lines if line.startswith("setup: still compiling llama-cpp-python: ")]
    assert beats and any(line.endswith(" s, build step 7/10") for line in beats), lines
    assert "ninja: build stopped: subcommand failed." in result.stderr  # the log's tail
    assert re.search(r"setup: compiling llama-cpp-python failed after \d+ s", result.stderr)


def test_llama_cpp_compiles_alone_then_the_project_installs_then_the_sdist_comes(machine):
    calls = machine.tmp / "pip.log"
    fake_python(machine.venv / "bin" / "python", "3.12",
                pip=f'echo "$*" >> {calls}; case "$*" in *" download "*) exit 4 ;; esac')
    machine.compilers()
    result = machine.run(prereqs_only=False, SETUP_HEARTBEAT_S="1")
    assert result.returncode == 4, output(result)
    assert re.search(r"^setup: done compiling llama-cpp-python in \d+ s$", result.stdout, re.MULTILINE)
    assert re.search(r"^setup: done installing the pinned dependencies in \d+ s$", result.stdout, re.MULTILINE)
    download = calls.read_text().splitlines()[2]
    assert calls.read_text().splitlines()[:2] == [f"-m pip install -v --no-deps llama-cpp-python=={LLAMA}",
                                                  "-m pip install --quiet -e .[dev]"]
    # Only llama-cpp-python as an sdist: with --no-binary :all:, preparing its metadata on a machine
    # without CMake would build PyPI's cmake from source, which needs make (seen on Python 3.13).
    assert download.startswith("-m pip download --quiet --no-deps --no-binary llama-cpp-python ")
    assert f"llama-cpp-python=={LLAMA}" in download and ":all:" not in download


def gpu_install(machine: Machine, *, builds_cuda: bool) -> Path:
    """A venv python whose pip logs each call with its CMAKE_ARGS, and whose CUDA compile writes (or not)
    libggml-cuda.so; the sdist download fails (exit 4) to end the run early."""
    calls = machine.tmp / "pip.log"
    lib = machine.venv / "lib" / "llama_cpp" / "lib"
    make_lib = f"{shutil.which('mkdir')} -p {lib} && : > {lib}/libggml-cuda.so" if builds_cuda else ":"
    fake_python(machine.venv / "bin" / "python", "3.12",
                pip=f'echo "$* | $CMAKE_ARGS" >> {calls}; case "$*" in *" download "*) exit 4 ;; '
                    f'*llama-cpp-python==*) {make_lib} ;; esac')
    machine.compilers()
    return calls


def test_gpu_extra_without_nvcc_builds_for_the_cpu_and_says_so(machine):
    calls = gpu_install(machine, builds_cuda=False)
    result = machine.run(prereqs_only=False, EXTRAS="gpu", SETUP_HEARTBEAT_S="1")
    assert result.returncode == 4, output(result)
    notes = [line for line in output(result) if "nvcc" in line and "installing" not in line]
    assert notes == ["setup: no nvcc on PATH: llama-cpp-python is built for the CPU, so smoke runs the GGUF files on "
                     "the CPU (install the CUDA toolkit and rerun EXTRAS=gpu ./setup.sh for llama.cpp on the GPU)"]
    assert calls.read_text().splitlines()[:2] == [f"-m pip install -v --no-deps llama-cpp-python=={LLAMA} | ",
                                                  "-m pip install --quiet -e .[dev,gpu] | "]


def test_gpu_extra_with_nvcc_compiles_llama_cpp_with_cuda_for_t4_to_h100(machine):
    executable(machine.bin / "nvcc", "exit 0\n")
    calls = gpu_install(machine, builds_cuda=True)
    result = machine.run(prereqs_only=False, EXTRAS="gpu", SETUP_HEARTBEAT_S="1")
    assert result.returncode == 4, output(result)
    assert not any("no nvcc" in line for line in output(result))
    compile_ = calls.read_text().splitlines()[0]
    # pip's wheel cache ignores CMAKE_ARGS: without --no-cache-dir it would reinstall a CPU build made earlier
    assert compile_ == (f"-m pip install -v --no-deps --no-cache-dir --force-reinstall llama-cpp-python=={LLAMA} | "
                        f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={CUDA_ARCHITECTURES}")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f'ARG CUDA_ARCHITECTURES="{CUDA_ARCHITECTURES}"' in dockerfile  # one list of GPUs for both


def test_a_cpu_build_in_the_venv_is_rebuilt_once_nvcc_is_there(machine):
    fake_python(machine.venv / "bin" / "python", "3.12", llama=LLAMA)
    machine.compilers()
    assert output(machine.run(EXTRAS="gpu"))[-1] == f"setup: prerequisites ok: {machine.venv}/bin/python (Python 3.12)"
    executable(machine.bin / "nvcc", "exit 0\n")
    assert output(machine.run(EXTRAS="gpu"))[-1].endswith("; C/C++ compiler for llama-cpp-python")  # compiles again
    lib = machine.venv / "lib" / "llama_cpp" / "lib"
    lib.mkdir(parents=True)
    (lib / "libggml-cuda.so").touch()
    assert output(machine.run(EXTRAS="gpu"))[-1] == f"setup: prerequisites ok: {machine.venv}/bin/python (Python 3.12)"


def test_a_cuda_compile_without_the_cuda_library_fails_in_one_line(machine):
    executable(machine.bin / "nvcc", "exit 0\n")
    gpu_install(machine, builds_cuda=False)
    result = machine.run(prereqs_only=False, EXTRAS="gpu", SETUP_HEARTBEAT_S="1")
    assert result.returncode == 1
    assert output(result)[-1] == ("setup: llama-cpp-python was compiled, but without its CUDA library "
                                  "(libggml-cuda.so): see the build log above")


def test_readme_names_the_supported_versions():
    low, end = map(int, re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', PYPROJECT).groups())
    section = (ROOT / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for minor in range(low, end):
        assert f"3.{minor}" in section
    assert "PYTHON=" in section and "build-essential" in section
    assert "PYTHON=" in (ROOT / "setup.sh").read_text().split("set -euo pipefail")[0]
    assert os.access(ROOT / "setup.sh", os.X_OK)
