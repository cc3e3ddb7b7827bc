#!/usr/bin/env bash
# One-command setup: creates .venv/ with everything the CPU path needs, plus llama.cpp's GGUF
# converter and vocab files taken from the pinned llama-cpp-python sdist (same llama.cpp as the
# runtime). Rerunning is quick: nothing happens when pyproject.toml and this file are unchanged.
#   ./setup.sh                        # CPU machine (tests, the tiny profile)
#   EXTRAS=gpu ./setup.sh             # CUDA machine (adds unsloth, bitsandbytes; llama.cpp with CUDA when nvcc
#                                     # is on PATH); the Docker image does this
#   PYTHON=python3.13 ./setup.sh      # this interpreter, not the first supported one on PATH
#   SETUP_PREREQS_ONLY=1 ./setup.sh   # only the checks below (and the root installs), no venv
# It also builds llama.cpp's llama-mtmd-cli and llama-server from the same sdist, once per machine, into
# ~/.cache/vgrpo (VGRPO_CACHE), linked into the venv's bin/.
# VENV_DIR puts the venv elsewhere (the Docker image: /opt/venv, so that mounting a clone over
# /workspace does not hide it); code finds the converter at <venv>/llama.cpp.
#
# What it needs from the machine, checked first, each failure one line:
# - Python: PYTHON, else the first of python3.11, python3.12, ... (pyproject's requires-python),
#   python3 whose version is supported; with its venv module (Debian/Ubuntu: pythonX.Y-venv).
#   An existing venv keeps its interpreter.
# - A C and C++ compiler, when llama-cpp-python (no wheels on PyPI) is not yet in the venv: pip
#   compiles it with scikit-build-core, which takes CMake and Ninja from PyPI when the system has
#   none; it is a ctypes binding, so no Python headers. As root with apt-get, missing compilers
#   mean `apt-get install build-essential`; otherwise it stops and names that package.
# - As root with apt-get, for the default venv: openssh-server (the SSH-remote test's sshd).
# - With EXTRAS=gpu: nvcc (the CUDA toolkit) on PATH, to compile llama.cpp's CUDA kernels for
#   CUDA_ARCHITECTURES (default below: T4 to H100, as the Dockerfile). Without nvcc it says so in one
#   line and builds for the CPU (smoke then runs the GGUF files on the CPU). A CPU build already in
#   the venv is rebuilt with CUDA once nvcc is there.
# The compile and the install print a line every SETUP_HEARTBEAT_S seconds (30), the compile with
# ninja's build step.
set -euo pipefail
cd "$(dirname "$0")"

extras=${EXTRAS:-}
venv=${VENV_DIR:-.venv}
heartbeat_s=${SETUP_HEARTBEAT_S:-30}
llama_version=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
llama_sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

die() {
    echo "setup: $*" >&2
    exit 1
}

# --- Python: the versions requires-python (">=3.A,<3.B") allows ---------------------------------
read -r py_min py_end < <(sed -n 's/^requires-python = ">=3\.\([0-9]*\),<3\.\([0-9]*\)".*/\1 \2/p' pyproject.toml) ||
    die "cannot read requires-python (\">=3.A,<3.B\") from pyproject.toml"
supported=()
for ((minor = py_min; minor < py_end; minor++)); do supported+=("3.$minor"); done
wanted="Python ${supported[0]} to ${supported[-1]}"

py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
is_supported() { [[ " ${supported[*]} " == *" $1 "* ]]; }

choose_python() { # sets python and version: PYTHON, else the first supported one on PATH
    if [ -n "${PYTHON:-}" ]; then
        python=$PYTHON
        version=$(py_version "$python") || die "PYTHON=$PYTHON does not run; point it at $wanted, or unset it"
        is_supported "$version" || die "PYTHON=$PYTHON is Python $version; this project needs $wanted"
        return
    fi
    for python in "${supported[@]/#/python}" python3; do
        version=$(py_version "$python") && is_supported "$version" && return
    done
    die "no $wanted found (looked for ${supported[*]/#/python} python3 on PATH): install one" \
        "(Debian 12/13, Ubuntu 24.04: apt-get install python3-venv; elsewhere e.g. pyenv install ${supported[-1]})" \
        "or set PYTHON=/path/to/python3.X"
}

if [ -x "$venv/bin/python" ]; then # an existing venv keeps its interpreter
    python=$venv/bin/python
    version=$(py_version "$python") || die "$python does not run: remove $venv (rm -rf $venv) and rerun"
    is_supported "$version" || die "$venv is Python $version; this project needs $wanted: remove $venv and rerun"
    if [ -n "${PYTHON:-}" ]; then
        venv_version=$version
        choose_python
        [ "$version" = "$venv_version" ] ||
            die "$venv is Python $venv_version but PYTHON=$PYTHON is $version: remove $venv (rm -rf $venv) to switch"
        python=$venv/bin/python
    fi
else
    choose_python
    "$python" -c 'import ensurepip' 2>/dev/null ||
        die "$python (Python $version) cannot create a venv: install python$version-venv (Debian/Ubuntu) and rerun"
fi

# --- openssh-server ------------------------------------------------------------------------------
# The tests start a throwaway sshd on 127.0.0.1 (DVC's SSH remote); a dev or CI checkout (the
# default venv) gets Debian's openssh-server when it is missing and we are allowed to install it.
if [ -z "${VENV_DIR:-}" ] && [ ! -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
fi

stamp="$venv/.setup-stamp"
want=$(cat pyproject.toml setup.sh | sha256sum | cut -d' ' -f1)-${extras}-$(command -v nvcc || true)
if [ -z "${SETUP_PREREQS_ONLY:-}" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ -x "$venv/bin/llama-server" ] && [ -x "$venv/bin/llama-mtmd-cli" ]; then
    echo "setup: $venv is up to date"
    exit 0
fi

# --- Build tools, only when llama-cpp-python will be compiled ------------------------------------
compilers_work() { # cc and c++ compile and link a program that uses the C and C++ libraries' headers
    local dir status=0
    dir=$(mktemp -d)
    printf '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n' >"$dir/c.c"
    printf '#include <vector>\nint main() { return std::vector<int>(1)[0]; }\n' >"$dir/cxx.cpp"
    { "${CC:-cc}" "$dir/c.c" -o "$dir/c" && "${CXX:-c++}" "$dir/cxx.cpp" -o "$dir/cxx"; } >/dev/null 2>&1 || status=1
    rm -rf "$dir"
    return $status
}

installed_llama=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' \
    2>/dev/null) || true
# llama.cpp's CUDA kernels: for EXTRAS=gpu when nvcc is there. The same architectures as the Dockerfile.
llama_cmake_args=
if [[ ",$extras," == *",gpu,"* ]]; then
    if command -v nvcc >/dev/null; then
        llama_cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-75-real;80-real;86-real;89-real;90-real;90-virtual}"
    else
        echo "setup: no nvcc on PATH: llama-cpp-python is built for the CPU, so smoke runs the GGUF files on the CPU" \
            "(install the CUDA toolkit and rerun EXTRAS=gpu ./setup.sh for llama.cpp on the GPU)"
    fi
fi
has_cuda_build() { [ -n "$(find "$venv" -name 'libggml-cuda.so*' -print -quit 2>/dev/null)" ]; }
compile_llama=
if [ "$installed_llama" != "$llama_version" ] || { [ -n "$llama_cmake_args" ] && ! has_cuda_build; }; then
    compile_llama=1
    if ! compilers_work; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            echo "setup: no working C/C++ compiler for the llama-cpp-python build: installing build-essential (apt-get)"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential >/dev/null
            compilers_work || die "build-essential is installed but cc/c++ still cannot build a test program"
        else
            die "compiling llama-cpp-python needs a C and C++ compiler (cc, c++):" \
                "install build-essential (Debian/Ubuntu: sudo apt-get install build-essential) and rerun"
        fi
    fi
fi

if [ -n "${SETUP_PREREQS_ONLY:-}" ]; then
    echo "setup: prerequisites ok: $python (Python $version)${compile_llama:+; C/C++ compiler for llama-cpp-python}"
    exit 0
fi

# --- The venv ------------------------------------------------------------------------------------
tmp=$(mktemp -d)
job=
trap 'if [ -n "$job" ]; then kill -- -"$job" 2>/dev/null || true; fi; rm -rf "$tmp"' EXIT

# Runs a command in its own process group with its output in a log; prints a line every
# heartbeat_s seconds (with ninja's [step/total] once the log has one); on failure shows the log's
# tail and stops.
run_logged() { # what log command...
    local what=$1 log=$2 start=$SECONDS next step
    shift 2
    setsid "$@" >"$log" 2>&1 &
    job=$!
    next=$((start + heartbeat_s))
    while kill -0 "$job" 2>/dev/null; do
        sleep 1
        if [ "$SECONDS" -ge "$next" ] && kill -0 "$job" 2>/dev/null; then
            step=$(grep -o '\[[0-9]*/[0-9]*\]' "$log" | tail -n 1) || true
            echo "setup: still $what: $((SECONDS - start)) s${step:+, build step ${step:1:-1}}"
            next=$((next + heartbeat_s))
        fi
    done
    if ! wait "$job"; then
        job=
        tail -n 25 "$log" >&2
        die "$what failed after $((SECONDS - start)) s (the lines above end its log)"
    fi
    job=
    echo "setup: done $what in $((SECONDS - start)) s"
}

if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv with $python (Python $version)"
    "$python" -m venv "$venv"
fi

# llama-cpp-python alone first (--no-deps: the project install below brings its pinned deps), -v so
# that the log shows the compile's steps. Seconds instead of minutes when pip cached an earlier build.
# With CUDA: --no-cache-dir and --force-reinstall, because pip's wheel cache does not know CMAKE_ARGS and
# would hand back a CPU build compiled earlier.
if [ -n "$compile_llama" ]; then
    if [ -n "$llama_cmake_args" ]; then
        echo "setup: compiling llama-cpp-python $llama_version with CUDA ($llama_cmake_args; 20-40 minutes)..."
        run_logged "compiling llama-cpp-python" "$tmp/llama-build.log" env CMAKE_ARGS="$llama_cmake_args" \
            "$venv/bin/python" -m pip install -v --no-deps --no-cache-dir --force-reinstall \
            "llama-cpp-python==$llama_version"
        has_cuda_build || die "llama-cpp-python was compiled, but without its CUDA library (libggml-cuda.so):" \
            "see the build log above"
    else
        echo "setup: compiling llama-cpp-python $llama_version from source (6-8 minutes on 2 cores; seconds if pip cached a build)..."
        run_logged "compiling llama-cpp-python" "$tmp/llama-build.log" \
            "$venv/bin/python" -m pip install -v --no-deps "llama-cpp-python==$llama_version"
    fi
fi

echo "setup: installing the pinned dependencies into $venv${extras:+ (extras: $extras)}"
run_logged "installing the pinned dependencies" "$tmp/install.log" \
    "$venv/bin/python" -m pip install --quiet -e ".[dev${extras:+,$extras}]"

# llama.cpp's converter + gguf-py + vocab files, from the sdist of the installed llama-cpp-python.
# VERSION names the sdist and what we take from it; bump the suffix when that list changes.
# --no-binary names the package: pip prepares the sdist's metadata, and with :all: the CMake and
# Ninja that scikit-build-core asks for (on a machine without them) would be built from source.
llama_files_version="${llama_version}+files2"
sdist="$tmp/llama_cpp_python-${llama_version}.tar.gz"
src="llama_cpp_python-${llama_version}/vendor/llama.cpp"
fetch_sdist() {
    [ -f "$sdist" ] && return
    "$venv/bin/python" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==${llama_version}" -d "$tmp"
    echo "${llama_sdist_sha256}  $sdist" | sha256sum --check --quiet
}
if [ "$(cat "$venv/llama.cpp/VERSION" 2>/dev/null)" != "$llama_files_version" ]; then
    fetch_sdist
    tar -xzf "$sdist" -C "$tmp" \
        "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" \
        "$src/models/ggml-vocab-qwen2.gguf" "$src/models/ggml-vocab-qwen2.gguf.inp" \
        "$src/models/ggml-vocab-qwen2.gguf.out"
    echo "$llama_files_version" > "$tmp/$src/VERSION"
    rm -rf "$venv/llama.cpp"
    mv "$tmp/$src" "$venv/llama.cpp"
fi

# llama.cpp's own command-line tools, llama-mtmd-cli and llama-server, from the same sdist (the model card's
# commands; the tests run them). Built once per machine into the cache (a few minutes on 2 cores), then
# linked into the venv's bin/. For this CPU (GGML_NATIVE), without HTTPS and the web UI download: the card's
# `llama-server -hf` line wants a llama.cpp with HTTPS, as release builds have.
tools_dir="${VGRPO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vgrpo}/llama.cpp-tools-${llama_version}-$(uname -m)"
if [ ! -x "$tools_dir/llama-server" ] || [ ! -x "$tools_dir/llama-mtmd-cli" ]; then
    command -v cmake >/dev/null || die "building llama-mtmd-cli and llama-server needs cmake (Debian: apt-get install cmake)"
    fetch_sdist
    tar -xzf "$sdist" -C "$tmp" "$src"
    generator=()
    if command -v ninja >/dev/null; then generator=(-G Ninja); fi
    echo "setup: building llama-mtmd-cli and llama-server (once per machine, a few minutes on 2 cores)..."
    run_logged "configuring llama.cpp's tools" "$tmp/tools-configure.log" cmake -S "$tmp/$src" -B "$tmp/tools" \
        "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF
    run_logged "building llama.cpp's tools" "$tmp/tools-build.log" cmake --build "$tmp/tools" \
        --target llama-mtmd-cli llama-server -j "$(nproc)"
    mkdir -p "$tools_dir.new"
    cp "$tmp/tools/bin/llama-mtmd-cli" "$tmp/tools/bin/llama-server" "$tools_dir.new/"
    rm -rf "$tools_dir"
    mv "$tools_dir.new" "$tools_dir"
fi
ln -sf "$tools_dir/llama-mtmd-cli" "$tools_dir/llama-server" "$venv/bin/"

echo "$want" > "$stamp"
echo "setup: done ($venv ready; activate with: source $venv/bin/activate)"
