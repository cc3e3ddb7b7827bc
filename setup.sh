#!/usr/bin/env bash
# One-command setup: creates .venv/ with everything the CPU path needs, plus llama.cpp's GGUF
# converter and vocab files taken from the pinned llama-cpp-python sdist (same llama.cpp as the
# runtime). Rerunning is quick: nothing happens when pyproject.toml and this file are unchanged.
#   ./setup.sh            # CPU machine (tests, the tiny profile)
#   EXTRAS=gpu ./setup.sh # CUDA machine (adds unsloth, bitsandbytes); the Docker image does this
# VENV_DIR puts the venv elsewhere (the Docker image: /opt/venv, so that mounting a clone over
# /workspace does not hide it); code finds the converter at <venv>/llama.cpp.
set -euo pipefail
cd "$(dirname "$0")"

python=${PYTHON:-python3.11}
extras=${EXTRAS:-}
venv=${VENV_DIR:-.venv}
llama_version=$(sed -n 's/.*"llama-cpp-python==\([^"]*\)".*/\1/p' pyproject.toml)
llama_sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

# The tests start a throwaway sshd on 127.0.0.1 (DVC's SSH remote); a dev or CI checkout (the
# default venv) gets Debian's openssh-server when it is missing and we are allowed to install it.
if [ -z "${VENV_DIR:-}" ] && [ ! -x /usr/sbin/sshd ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null
fi

stamp="$venv/.setup-stamp"
want=$(cat pyproject.toml setup.sh | sha256sum | cut -d' ' -f1)-${extras}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "setup: $venv is up to date"
    exit 0
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet -e ".[dev${extras:+,$extras}]"

# llama.cpp's converter + gguf-py + vocab files, from the sdist of the installed llama-cpp-python.
# VERSION names the sdist and what we take from it; bump the suffix when that list changes.
llama_files_version="${llama_version}+files2"
if [ "$(cat "$venv/llama.cpp/VERSION" 2>/dev/null)" != "$llama_files_version" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==${llama_version}" -d "$tmp"
    echo "${llama_sdist_sha256}  $tmp/llama_cpp_python-${llama_version}.tar.gz" | sha256sum --check --quiet
    src="llama_cpp_python-${llama_version}/vendor/llama.cpp"
    tar -xzf "$tmp/llama_cpp_python-${llama_version}.tar.gz" -C "$tmp" \
        "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" \
        "$src/models/ggml-vocab-qwen2.gguf" "$src/models/ggml-vocab-qwen2.gguf.inp" \
        "$src/models/ggml-vocab-qwen2.gguf.out"
    echo "$llama_files_version" > "$tmp/$src/VERSION"
    rm -rf "$venv/llama.cpp"
    mv "$tmp/$src" "$venv/llama.cpp"
fi

echo "$want" > "$stamp"
echo "setup: done ($venv ready; activate with: source $venv/bin/activate)"
