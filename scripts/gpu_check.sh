#!/usr/bin/env bash
# GPU check, end to end, with one JSON summary (scripts/gpu_check.py says what it runs). Runs on a CPU as well,
# where the CUDA-only cases are skipped; the test suite runs it there (tests/test_gpu_check.py).
#
#   scripts/gpu_check.sh [--work DIR] [--steps N]                      # the tiny model
#   MODEL=Qwen/Qwen3-VL-8B-Instruct scripts/gpu_check.sh --steps 2     # the real model (the hub or its cache)
#
# Inside the Docker image, or after `EXTRAS=gpu ./setup.sh` (PYTHON: the venv's python by default).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
exec "$python" scripts/gpu_check.py "$@"
