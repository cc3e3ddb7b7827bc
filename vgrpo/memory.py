"""How much GPU memory a run needs, planned before a model loads, and the checks that stop a run in one
line when it cannot fit, naming the profile to use instead.

A plan counts bytes; it does not measure them. It takes the model's shape (parameters by part, read
from its config on the meta device: no weights load) and the run's params:

- weights: every parameter in the dtype it loads in; with `train.load_in_4bit`, the decoder's linear
  layers in NF4 with double quantization (4.13 bits a weight) and the rest in 16 bits. The vision
  tower loads in float32 where float16 is the compute dtype (vgrpo.models: float16 overflows its MLP).
- LoRA: its weights, gradients and AdamW state in float32 (an 8-bit optimizer keeps 2 bytes of state).
- training activations at per_device_train_batch_size x (prompt + max_completion_length) tokens: with
  gradient checkpointing one hidden state per layer plus one layer recomputed, else every layer's;
  the completion logits (model dtype, their gradient, and one sequence in float32 at a time, as TRL's
  selective_log_softmax does); the KV cache of generation.
- a fixed 1 GB: CUDA context, cuBLAS workspace, allocator slack.

`scripts/gpu_check.sh` measures the real peaks; the README's table is `python bench/memory_plan.py`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from vgrpo.config import Config, VgrpoError

GB = 1e9
NF4_BYTES = 4.127 / 8  # 4-bit NF4, one 8-bit absmax per 64 weights, one float32 per 256 absmax (double quant)
OVERHEAD = 1.0 * GB
PROMPT_TOKENS = 128  # a question with its image: ~110 tokens at 64 image tokens (train checks the real longest)
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_MAX_WEIGHTS = 4 * GB  # above this, a model is for a GPU: on a CPU it loads in float32 and trains for days
SMALL_PROFILE = "gpu16"  # the profile for 16 GB GPUs: the 8B in 4 bits
CPU_PROFILES = "tiny (the plumbing check) or cpu (GRPO that learns on 2 cores)"

# Qwen3-VL-8B-Instruct's config.json (the sizes that set its memory): 8.767 B parameters, as published.
QWEN3_VL_8B = {
    "text_config": {"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                    "tie_word_embeddings": False},
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                      "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24],
                      "num_position_embeddings": 2304, "patch_size": 16, "spatial_merge_size": 2},
    "tie_word_embeddings": False,
}


@dataclass(frozen=True)
class ModelShape:
    """Parameter counts by part, and the sizes that set activation and cache memory."""
    decoder_linear: int  # the language decoder's linear weights: what 4-bit loading quantizes
    vision: int
    other: int  # embeddings, lm_head, norms
    lora: int  # LoRA parameters for the run's target modules and rank
    hidden: int
    intermediate: int
    layers: int
    kv_width: int  # key/value heads x head size
    vocab: int

    @property
    def parameters(self) -> int:
        return self.decoder_linear + self.vision + self.other


def model_shape(config_source: str | Path | dict, target_modules: str | None = None, lora_r: int = 0) -> ModelShape:
    """The shape of the model in `config_source` (a model directory, or a config dict), with LoRA of rank
    `lora_r` on the modules that `target_modules` (vgrpo.models.lora_target_modules) full-matches (none
    without them: a merged model, or where the adapter's own file gives its size)."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, Qwen3VLConfig

    if isinstance(config_source, dict):
        config = Qwen3VLConfig(**config_source)
    else:
        config = AutoConfig.from_pretrained(str(config_source))
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    counts = {"decoder_linear": 0, "vision": 0, "other": 0}
    for name, parameter in model.named_parameters():
        if ".visual." in name or name.startswith("visual."):
            counts["vision"] += parameter.numel()
        elif ".language_model.layers." in name and parameter.ndim == 2:
            counts["decoder_linear"] += parameter.numel()
        else:
            counts["other"] += parameter.numel()
    pattern = re.compile(target_modules) if target_modules else None
    lora = sum(lora_r * (module.in_features + module.out_features) for name, module in model.named_modules()
               if pattern and isinstance(module, torch.nn.Linear) and pattern.fullmatch(name))
    text = config.text_config
    return ModelShape(**counts, lora=lora, hidden=text.hidden_size, intermediate=text.intermediate_size,
                      layers=text.num_hidden_layers, kv_width=text.num_key_value_heads * text.head_dim,
                      vocab=text.vocab_size)


def weights_bytes(shape: ModelShape, dtype: str, load_in_4bit: bool) -> float:
    """The weights as loaded in `dtype` (the files may hold another precision), or in 4 bits."""
    size = BYTES[dtype]
    vision = shape.vision * (4 if dtype == "float16" else size)  # float32 under float16: vgrpo.models
    decoder = shape.decoder_linear * (NF4_BYTES if load_in_4bit else size)
    return decoder + shape.other * size + vision


def kv_cache_bytes(shape: ModelShape, sequences: int, tokens: int, dtype: str) -> float:
    return sequences * tokens * shape.layers * 2 * shape.kv_width * BYTES[dtype]


def train_plan(config: Config, shape: ModelShape, dtype: str) -> dict[str, float]:
    """GB by part for one training process (`train`), and the total."""
    t = config.train
    batch, completion = t.per_device_train_batch_size, t.max_completion_length
    tokens = batch * (PROMPT_TOKENS + completion)
    size = BYTES[dtype]
    layer = tokens * (10 * shape.hidden + 4 * shape.intermediate) * size  # one layer's saved activations
    activations = (tokens * shape.hidden * size * shape.layers + layer if t.gradient_checkpointing
                   else layer * shape.layers)
    optimizer_state = 2 if t.optim in ("adamw_8bit", "paged_adamw_8bit") else 8
    shards = t.num_processes if t.accelerate_config == "zero3" else 1
    plan = {
        "weights": weights_bytes(shape, dtype, t.load_in_4bit) / shards,
        "lora_and_optimizer": shape.lora * (4 + 4 + optimizer_state),
        "activations": activations,
        "logits": batch * completion * shape.vocab * 2 * size + completion * shape.vocab * 4,
        "kv_cache": kv_cache_bytes(shape, batch, PROMPT_TOKENS + completion, dtype),
        "overhead": OVERHEAD,
    }
    return _in_gb(plan)


def evaluate_plan(config: Config, shape: ModelShape, dtype: str, adapter_bytes: int) -> dict[str, float]:
    """GB by part for `evaluate`: base + adapter (its file's size), batched greedy generation."""
    e = config.evaluate
    plan = {
        "weights": weights_bytes(shape, dtype, config.train.load_in_4bit) + adapter_bytes,
        "kv_cache": kv_cache_bytes(shape, e.batch_size, PROMPT_TOKENS + e.max_new_tokens, dtype),
        "logits": e.batch_size * shape.vocab * 4,  # one step's, per sequence (generate keeps the last position only)
        "overhead": OVERHEAD,
    }
    return _in_gb(plan)


def smoke_plan(config: Config, shape: ModelShape, dtype: str) -> dict[str, float]:
    """GB by part for the transformers side of `smoke` (the merged model, loaded as train loaded the base);
    llama.cpp comes after it is freed, with as many layers on the GPU as fit (smoke.n_gpu_layers)."""
    s = config.smoke
    plan = {
        "weights": weights_bytes(shape, dtype, config.train.load_in_4bit),
        "kv_cache": kv_cache_bytes(shape, 1, PROMPT_TOKENS + s.max_new_tokens, dtype),
        "logits": s.max_new_tokens * shape.vocab * 4,  # output_logits: every step's, in float32
        "overhead": OVERHEAD,
    }
    return _in_gb(plan)


def _in_gb(plan: dict[str, float]) -> dict[str, float]:
    plan = {part: round(value / GB, 2) for part, value in plan.items()}
    plan["total"] = round(sum(plan.values()), 2)
    return plan


# --- Checks ------------------------------------------------------------------------------------

def stored_weights_bytes(source: dict) -> int:
    """The weight files' size as `base` recorded them (models/base/source.json)."""
    return sum(f["size"] or 0 for f in source.get("files", []))


def check_cpu_can_run(weights: int, name: str) -> None:
    """Without CUDA, a model above CPU_MAX_WEIGHTS stops before it downloads or loads: it would load in
    float32 (twice its 16-bit size) and train for days on a CPU."""
    if weights > CPU_MAX_WEIGHTS:
        raise VgrpoError(f"params.yaml: model.name: {name} has {weights / GB:.1f} GB of weights and this machine has "
                         f"no CUDA GPU (it would load in float32 on the CPU): run it on a GPU, or use a CPU profile: "
                         f"dvc exp run -S profile=tiny, or -S profile=cpu ({CPU_PROFILES})")


def gpu_free_and_name() -> tuple[int, str]:
    """Free bytes of this process's GPU (LOCAL_RANK under a launcher), as the driver reports them, and its name."""
    import torch

    index = int(os.environ.get("LOCAL_RANK", 0))
    return torch.cuda.mem_get_info(index)[0], torch.cuda.get_device_name(index)


def check_fits(plan: dict[str, float], what: str, config: Config, free: int, device_name: str,
               stored_bytes: int | None = None) -> None:
    """Stop in one line when the plan exceeds the GPU's free memory, naming the profile to use.
    `stored_bytes`: the weight files' size that `base` recorded (models/base/source.json), for the message."""
    if plan["total"] * GB <= free:
        return
    parts = ", ".join(f"{part} {gb:g}" for part, gb in plan.items() if part != "total")
    if stored_bytes:
        parts += f"; the weight files: {stored_bytes / GB:.1f} GB, models/base/source.json"
    if not config.train.load_in_4bit:
        fix = (f"use profile {SMALL_PROFILE} (dvc exp run -S profile={SMALL_PROFILE}), which loads the base in 4 bits")
    else:
        fix = ("lower train.max_completion_length, train.per_device_train_batch_size or evaluate.batch_size "
               "(README: what moves memory), or use a larger GPU")
    raise VgrpoError(f"params.yaml: profile {config.profile}: {what} is planned at {plan['total']:g} GB of GPU memory "
                     f"({parts}) and {device_name} has {free / GB:.1f} GB free: {fix}")


def base_shape(base_path: str, config: Config) -> ModelShape:
    from vgrpo.models import lora_target_modules

    return model_shape(base_path, lora_target_modules(config.train), config.train.lora_r)

