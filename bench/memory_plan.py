"""The README's GPU table: for each GPU class and 8B profile, the planned peak GPU memory of train,
evaluate and smoke's merged model (vgrpo/memory.py: the plan the stages check before loading), whether
it fits, and the host RAM export's merge needs. Plans, not measurements: `scripts/gpu_check.sh` measures.

    .venv/bin/python bench/memory_plan.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgrpo import memory  # noqa: E402
from vgrpo.config import compose, config_from_dict  # noqa: E402
from vgrpo.models import lora_target_modules  # noqa: E402

# name, GB free with the CUDA context made (total less ~1 GB), native bf16
GPUS = [("T4 16 GB", 15.0, False), ("L4 / A10 24 GB", 22.5, True), ("A100 40 GB", 39.5, True),
        ("A100 / H100 80 GB", 79.0, True)]
PROFILES = ("full", "book", "gpu16")


def main() -> None:
    print("| GPU | profile | precision | train | evaluate | smoke (merged model) | fits | export's merge |")
    print("|---|---|---|---|---|---|---|---|")
    for gpu, free, bf16 in GPUS:
        for name in PROFILES:
            config = config_from_dict(compose(name))
            dtype = "bfloat16" if bf16 else "float16"
            shape = memory.model_shape(memory.QWEN3_VL_8B, lora_target_modules(config.train), config.train.lora_r)
            plans = [memory.train_plan(config, shape, dtype)["total"],
                     memory.evaluate_plan(config, shape, dtype, shape.lora * 4)["total"],
                     memory.smoke_plan(config, shape, dtype)["total"]]
            fits = "yes" if max(plans) <= free else f"does not fit ({free:g} GB free)"
            merged = memory.weights_bytes(shape, config.export.merged_dtype, False) / memory.GB
            on_gpu = bf16 and merged + 1 <= free  # vgrpo.export.merge_device
            merge = "on the GPU" if on_gpu else f"on the CPU: ~{merged + 2:.0f} GB host RAM"
            precision = dtype + (", 4-bit" if config.train.load_in_4bit else "")
            print(f"| {gpu} | {name} | {precision} | {plans[0]:g} GB | {plans[1]:g} GB | {plans[2]:g} GB | {fits} "
                  f"| {merge} |")
    for name in ("full", "gpu16"):
        config = config_from_dict(compose(name))
        shape = memory.model_shape(memory.QWEN3_VL_8B, lora_target_modules(config.train), config.train.lora_r)
        parts = memory.train_plan(config, shape, "float16")
        print(f"train, profile {name}, float16: " + ", ".join(f"{part} {gb:g} GB" for part, gb in parts.items()))


if __name__ == "__main__":
    main()
