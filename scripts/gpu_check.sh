#!/usr/bin/env bash
# GPU check, end to end, with one JSON summary (scripts/gpu_check.py says what it runs). Runs on a CPU as well,
# every case a CPU can run; the test suite runs it there (tests/test_gpu_check.py).
#
#   scripts/gpu_check.sh [--work DIR] [--steps N]                      # the tiny model
#   MODEL=Qwen/Qwen3-VL-8B-Instruct scripts/gpu_check.sh --steps 2     # the real model (the hub or its cache)
#
# Inside the Docker image, or after `EXTRAS=gpu ./setup.sh`. The Python: PYTHON, else the active venv's
# ($VIRTUAL_ENV: the image's /opt/venv, so that a mounted clone's own .venv, built on the host, is not
# used), else this clone's .venv, else python on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    python=$VIRTUAL_ENV/bin/python
elif [ -x .venv/bin/python ]; then
    python=.venv/bin/python
else
    python=python
fi
exec "$python" scripts/gpu_check.py "$@"
