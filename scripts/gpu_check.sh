#!/usr/bin/env bash
# GPU validation, end to end on one CUDA machine in under 10 minutes: the unsloth backend on the tiny
# model for 10 GRPO steps (peak VRAM, seconds per step), then export and smoke with CUDA.
# Run it inside the Docker image, or after `EXTRAS=gpu ./setup.sh` with a CUDA build of torch:
#   scripts/gpu_check.sh [WORK_DIR]        # default WORK_DIR: /tmp/vgrpo-gpu-check
# It prints one summary line per stage and exits non-zero when any stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/vgrpo-gpu-check}
python=${PYTHON:-python}
mkdir -p "$work"

"$python" - "$work/params.yaml" <<'PY'
import sys, yaml
raw = yaml.safe_load(open("params.yaml"))
raw["profile"] = "tiny"
tiny = raw["profiles"]["tiny"]
tiny["train"].update(backend="unsloth", optim="adamw_8bit", gradient_checkpointing=True, max_steps=10,
                     save_steps=10, learning_rate=1e-4)
tiny["model"]["dtype"] = "bfloat16"
yaml.safe_dump(raw, open(sys.argv[1], "w"), sort_keys=False)
PY

"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('gpu:', torch.cuda.get_device_name(0))"
start=$(date +%s)
"$python" stages/generate.py --params "$work/params.yaml" --out "$work/data/shapes"
"$python" stages/train.py --params "$work/params.yaml" --data "$work/data/shapes" --adapter "$work/models/adapter" \
    --checkpoints "$work/checkpoints" --reports "$work/reports/train"
"$python" stages/evaluate.py --params "$work/params.yaml" --data "$work/data/shapes" \
    --adapter "$work/models/adapter" --reports "$work/reports/eval"
"$python" stages/export.py --params "$work/params.yaml" --adapter "$work/models/adapter" \
    --merged "$work/models/merged" --gguf "$work/models/gguf" --data "$work/data/shapes" --eval-metrics "$work/reports/eval/metrics.json"
"$python" stages/smoke.py --params "$work/params.yaml" --merged "$work/models/merged" --gguf "$work/models/gguf" \
    --data "$work/data/shapes" --reports "$work/reports/smoke"

"$python" - "$work" "$start" <<'PY'
import json, sys, time
work, start = sys.argv[1], int(sys.argv[2])
train = json.load(open(f"{work}/reports/train/metrics.json"))
print(f"train: backend {train['backend']}, {train['steps']} steps, {train['seconds_per_step']} s/step, "
      f"peak VRAM {train['peak_vram_gb']} GB")
print(f"smoke: {json.dumps(json.load(open(f'{work}/reports/smoke/metrics.json')))[:600]}")
print(f"total: {time.time() - start:.0f} s")
PY
