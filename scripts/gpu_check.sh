#!/usr/bin/env bash
# GPU check, end to end on one CUDA machine: the train stage under every setting a one-shot run can
# cover, then evaluate, export and smoke with CUDA. One summary line per case: seconds per step and
# peak VRAM. Exits non-zero when any case fails (the others still run).
#
#   scripts/gpu_check.sh [WORK_DIR]           # default WORK_DIR: /tmp/vgrpo-gpu-check
#   MODEL=Qwen/Qwen3-VL-8B-Instruct STEPS=3 scripts/gpu_check.sh   # the real model (needs the hub or its cache)
#
# Cases (each `STEPS` GRPO steps, default 5): backend unsloth and hf; bf16 (only where the GPU runs it
# natively) and fp16; 4-bit on both backends; two processes (DDP) when the machine has two GPUs.
# Run it inside the Docker image, or after `EXTRAS=gpu ./setup.sh` with a CUDA build of torch.
set -uo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/vgrpo-gpu-check}
python=${PYTHON:-python}
model=${MODEL:-tiny}
steps=${STEPS:-5}
mkdir -p "$work"
failed=0

"$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
read -r gpus native_bf16 name < <("$python" -c "import torch; print(torch.cuda.device_count(), \
torch.cuda.is_bf16_supported(including_emulation=False), torch.cuda.get_device_name(0).replace(' ', '_'))")
echo "gpu: $name x $gpus, native bf16: $native_bf16, model: $model"

# params for one case: the tiny profile (or MODEL) with train/model overrides given as key=value pairs.
write_params() {
    local out=$1; shift
    "$python" - "$out" "$model" "$steps" "$@" <<'PY'
import sys, yaml
out, model, steps, *pairs = sys.argv[1:]
raw = yaml.safe_load(open("params.yaml"))
raw["profile"] = "tiny"
tiny = raw["profiles"]["tiny"]
tiny["model"]["name"] = model
tiny["train"].update(optim="adamw_8bit", gradient_checkpointing=True, max_steps=int(steps), save_steps=1000)
for pair in pairs:
    key, value = pair.split("=", 1)
    group, name = key.split(".")
    tiny.setdefault(group, {})[name] = yaml.safe_load(value)
yaml.safe_dump(raw, open(out, "w"), sort_keys=False)
PY
}

stage() {  # stage NAME PARAMS ARGS...: run one stage, log to $work/logs
    local name=$1 params=$2; shift 2
    "$python" "stages/$name.py" --params "$params" "$@" >>"$work/logs/$case.log" 2>&1
}

summary() {  # one line per case from reports/train/metrics.json
    "$python" - "$1" "$2" <<'PY'
import json, sys
case, path = sys.argv[1:]
m = json.load(open(path))
print(f"{case:<22} backend {m['backend']:<8} {m['dtype']:<9} 4-bit {str(m['load_in_4bit']):<5} world {m['world_size']} "
      f"{m['steps']} steps  {m['seconds_per_step']:>6} s/step  peak VRAM {m['peak_vram_gb']} GB  "
      f"adapter changed {m['adapter_changed']}")
PY
}

mkdir -p "$work/logs"
case=setup
write_params "$work/setup.yaml"
stage generate "$work/setup.yaml" --out "$work/data/shapes" && stage base "$work/setup.yaml" --out "$work/models/base" \
    || { echo "generate/base failed: see $work/logs/setup.log"; exit 1; }

cases=("unsloth-fp16 train.backend=unsloth model.dtype=float16"
       "hf-fp16 train.backend=hf model.dtype=float16"
       "unsloth-4bit train.backend=unsloth train.load_in_4bit=true model.dtype=auto"
       "hf-4bit train.backend=hf train.load_in_4bit=true model.dtype=auto")
if [ "$native_bf16" = True ]; then
    cases+=("unsloth-bf16 train.backend=unsloth model.dtype=bfloat16" "hf-bf16 train.backend=hf model.dtype=bfloat16")
else
    echo "bf16 cases skipped: $name computes bf16 only by emulation (model.dtype: auto picks float16 here)"
fi
if [ "$gpus" -ge 2 ]; then
    cases+=("hf-ddp-2gpu train.backend=hf train.num_processes=2 train.accelerate_config=ddp model.dtype=auto")
fi

for spec in "${cases[@]}"; do
    read -r case overrides <<<"$spec"
    params="$work/$case.yaml"
    write_params "$params" $overrides
    if stage train "$params" --data "$work/data/shapes" --base "$work/models/base" --adapter "$work/$case/adapter" \
        --checkpoints "$work/$case/checkpoints" --reports "$work/$case/reports/train"; then
        summary "$case" "$work/$case/reports/train/metrics.json"
    else
        echo "$case FAILED: see $work/logs/$case.log"; failed=1
    fi
done

# The rest of the pipeline with CUDA, on the hf-fp16 adapter (every GPU has it).
case=downstream
params="$work/hf-fp16.yaml"
if stage evaluate "$params" --data "$work/data/shapes" --base "$work/models/base" --adapter "$work/hf-fp16/adapter" \
       --reports "$work/reports/eval" \
   && stage export "$params" --base "$work/models/base" --adapter "$work/hf-fp16/adapter" \
       --merged "$work/models/merged" --gguf "$work/models/gguf" --data "$work/data/shapes" \
       --eval-metrics "$work/reports/eval/metrics.json" \
   && stage smoke "$params" --merged "$work/models/merged" --gguf "$work/models/gguf" --data "$work/data/shapes" \
       --reports "$work/reports/smoke"; then
    "$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
speed = json.load(open(f"{work}/reports/eval/metrics.json"))["speed"]
print(f"evaluate               {speed['samples_per_second']} samples/s, peak VRAM {speed.get('peak_vram_gb')} GB")
smoke = json.load(open(f"{work}/reports/smoke/metrics.json"))
print(f"smoke                  gate passed {smoke['gate']['passed']}, transformers model freed "
      f"{smoke['hf']['memory_freed_gb']} GB before llama.cpp, peak VRAM {smoke.get('peak_vram_gb')} GB")
for name, m in smoke["files"].items():
    print(f"  {name:<40} {m['tokens_per_second']} tokens/s, answer agreement {m['answer_agreement']}")
PY
else
    echo "evaluate/export/smoke FAILED: see $work/logs/downstream.log"; failed=1
fi
exit $failed
