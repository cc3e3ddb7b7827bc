"""Load the base model and processor and attach LoRA: one code path for the tiny model and the 8B.

The `hf` backend is transformers' `AutoModelForImageTextToText` + PEFT `LoraConfig`; the `unsloth`
backend is `FastVisionModel` (CUDA only, imported lazily). Both put LoRA on the same modules, which
this project decides (`lora_target_modules`) and hands to both: the language decoder's and the vision
tower's attention and MLP projections, the vision merger included, each part switchable. Both load
the base in the same dtype (`vgrpo.devices`) and, with `train.load_in_4bit`, in 4-bit NF4, straight
onto the GPU when there is one. In float16 the vision tower stays in float32 (`keep_vision_in_float32`).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from vgrpo.config import ConfigError, ModelParams, TrainParams, VgrpoError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Module names in Qwen3VLForConditionalGeneration (8B and tiny alike).
TEXT_ATTENTION = r"model\.language_model\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)"
TEXT_MLP = r"model\.language_model\.layers\.\d+\.mlp\.(gate_proj|up_proj|down_proj)"
VISION_ATTENTION = r"model\.visual\.blocks\.\d+\.attn\.(qkv|proj)"
VISION_MLP = r"model\.visual\.(blocks\.\d+\.mlp|merger|deepstack_merger_list\.\d+)\.(linear_fc1|linear_fc2)"


def load_processor(path: str, model: ModelParams):
    """The processor with the image-token budget from params, padding on the left for generation."""
    processor = AutoProcessor.from_pretrained(path, min_pixels=model.min_pixels, max_pixels=model.max_pixels)
    processor.tokenizer.padding_side = "left"
    return processor


def load_model(path: str, dtype: str, load_in_4bit: bool = False, attn_implementation: str | None = None,
               device: str | None = None, vision_float32: bool = True):
    """The model in `dtype` (already resolved, never `auto`), or with 4-bit NF4 weights computing in
    `dtype` (bitsandbytes: CUDA, or its CPU backend). `device`: where the weights load, "cuda" (this process's GPU:
    LOCAL_RANK under a launcher) or "cpu"; by default the GPU when there is one, loaded there directly
    (a device_map), so a 16-bit 8B does not pass through 17.5 GB of host RAM. "none": no device_map, for
    DeepSpeed ZeRO-3, which places the weights itself. `vision_float32`: in float16, the vision tower in
    float32 (`keep_vision_in_float32`); off for a merge, which saves the weights in one dtype."""
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if load_in_4bit:
        kwargs["quantization_config"] = quantization_config(dtype)
    if device == "cuda":
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", 0))}
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=DTYPES[dtype], **kwargs)
    if dtype == "float16" and vision_float32:
        keep_vision_in_float32(model)
    return model


def keep_vision_in_float32(model) -> None:
    """Qwen3-VL's vision MLP overflows float16 (its activations pass 65,504; unsloth-zoo pull request 787,
    found on Apple M-series): where float16 is the compute dtype (GPUs without native bf16: T4, V100),
    the vision tower keeps float32 weights and runs with autocast off, so a float16 trainer's autocast
    does not put it back in float16. Qwen3-VL casts its outputs to the decoder's dtype itself
    (get_image_features, _deepstack_process)."""
    visual = model.get_base_model().model.visual if hasattr(model, "get_base_model") else model.model.visual
    visual.float()
    forward = visual.forward

    @functools.wraps(forward)
    def float32_forward(hidden_states, *args, **kwargs):
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return forward(hidden_states.float(), *args, **kwargs)

    visual.forward = float32_forward


# Modules 4-bit loading leaves in the model's dtype: the vision tower (small, sensitive to quantization,
# and in float32 under float16) and the output layer. transformers 5 skips a module when a pattern is a
# prefix of its name followed by a dot, the whole name, or a suffix (`should_convert_module`): "visual"
# alone would miss `model.visual.blocks.0.attn.qkv`. Unsloth patches that matcher, in its own process only.
NOT_QUANTIZED = ["model.visual", "lm_head"]


def quantization_config(dtype: str):
    """QLoRA's 4-bit setting: NF4 with double quantization, computing in the model's dtype, with the vision
    tower and lm_head left unquantized (`NOT_QUANTIZED`)."""
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                              bnb_4bit_compute_dtype=DTYPES[dtype], llm_int8_skip_modules=NOT_QUANTIZED)


def quantized_modules(model) -> list[str]:
    """The names of the model's 4-bit linear layers (bitsandbytes' Linear4bit)."""
    return [name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"]


def is_quantized(model) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_loaded_in_8bit", False))


def keep_4bit_layers_differentiable(model) -> None:
    """bitsandbytes 0.50's CPU backend, on a CPU with AVX512-BF16 (AMD Zen 4/5, Intel Sapphire Rapids),
    repacks a 4-bit layer's weights for its inference kernel at the first forward in eval mode without
    gradients (a held-out evaluation, a finiteness check), and from then on runs that kernel, which has no
    backward: the gradient stops at every 4-bit layer, and nothing before the decoder (the vision tower's
    LoRA) learns again. A model that trains keeps the layout that backpropagates."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False


def keep_trainable_in_float32(model) -> int:
    """Trainable (LoRA) parameters back in float32 on a quantized model. TRL 1.14's GRPOTrainer casts them
    to bfloat16 whenever the model is quantized; under float16 mixed precision the GradScaler then cannot
    unscale their bfloat16 gradients on a GPU (no bfloat16 kernel for that), and the first optimizer step
    fails. Unsloth removes the cast for that reason; PEFT keeps adapters in float32 without quantization.
    Returns how many parameters were cast back."""
    cast = 0
    for parameter in model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()
            cast += 1
    return cast


def check_finite(logits: torch.Tensor, dtype: str, where: str) -> None:
    """Logits with inf or nan mean float16 overflowed (or the weights are damaged): every answer after
    them would be garbage, so the stage stops here, in one line."""
    if not torch.isfinite(logits).all():
        raise VgrpoError(f"{where}: the model's next-token logits are not finite (inf or nan) in {dtype}: float16 "
                         "overflowed or the weights are damaged; set model.dtype: float32, or bfloat16 on a GPU that "
                         "runs it natively")


def check_adapter(adapter_dir: Path) -> None:
    """A LoRA adapter written by the train stage is there, or a one-line error says how to make it."""
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / "adapter_config.json").is_file() or not (adapter_dir / "adapter_model.safetensors").is_file():
        raise VgrpoError(f"{adapter_dir}: no LoRA adapter here (run the train stage: dvc repro train)")


def lora_target_modules(train: TrainParams) -> str:
    """A regex (PEFT full-matches it against module names) for the parts LoRA should adapt."""
    parts = []
    if train.finetune_language_layers:
        parts += [TEXT_ATTENTION] * train.finetune_attention_modules + [TEXT_MLP] * train.finetune_mlp_modules
    if train.finetune_vision_layers:
        parts += [VISION_ATTENTION] * train.finetune_attention_modules + [VISION_MLP] * train.finetune_mlp_modules
    if not parts:
        raise ConfigError("params.yaml: train.finetune_*: LoRA has nothing to adapt (enable language or vision "
                          "layers, and attention or MLP modules)")
    return "|".join(f"(?:{p})" for p in parts)


def is_vision_parameter(name: str) -> bool:
    return ".visual." in name or name.startswith("visual.")


def load_for_training(path: str, model: ModelParams, train: TrainParams, backend: str, dtype: str,
                      zero3: bool = False):
    """Base model (from `path`, in `dtype`) with LoRA attached, and its processor. Under DeepSpeed
    ZeRO-3 the adapters stay in the base's dtype: ZeRO-3 gathers parameters into buffers of one dtype,
    and fp32 adapters on a bf16 base fail on the first optimizer step (TRL's own comment, trl#6089)."""
    if backend == "unsloth":
        peft_model, processor = _unsloth_lora(path, model, train, dtype)
    else:
        peft_model, processor = _hf_lora(path, model, train, dtype, zero3)
    if train.vision_lr_scale == 0:  # the vision LoRA stays at its (identity) initialisation
        for name, parameter in peft_model.named_parameters():
            if is_vision_parameter(name) and "lora_" in name:
                parameter.requires_grad_(False)
    return peft_model, processor


def _hf_lora(path: str, model: ModelParams, train: TrainParams, dtype: str, zero3: bool):
    from peft import LoraConfig, get_peft_model

    base = load_model(path, dtype, load_in_4bit=train.load_in_4bit, device="none" if zero3 else None)
    if train.load_in_4bit:
        keep_4bit_layers_differentiable(base)
    config = LoraConfig(r=train.lora_r, lora_alpha=train.lora_alpha, lora_dropout=train.lora_dropout,
                        bias=train.lora_bias, target_modules=lora_target_modules(train))
    torch.manual_seed(train.seed)  # LoRA A matrices are random: same seed, same adapter
    peft_model = get_peft_model(base, config, autocast_adapter_dtype=not zero3)
    if train.gradient_checkpointing:
        peft_model.enable_input_require_grads()
    return peft_model, load_processor(path, model)


def _unsloth_lora(path: str, model: ModelParams, train: TrainParams, dtype: str):
    from unsloth import FastVisionModel

    checkpointing = "unsloth" if train.gradient_checkpointing else False
    base, processor = FastVisionModel.from_pretrained(
        path, load_in_4bit=train.load_in_4bit, use_gradient_checkpointing=checkpointing, dtype=DTYPES[dtype],
    )
    if dtype == "float16":  # Unsloth's list of models it runs in float32 has no Qwen3-VL
        keep_vision_in_float32(base)
    # Our regex, not Unsloth's own target builder (which leaves out the vision merger and deepstack
    # mergers): a string is used as given, and the finetune_* switches are already in it.
    peft_model = FastVisionModel.get_peft_model(
        base, target_modules=lora_target_modules(train),
        r=train.lora_r, lora_alpha=train.lora_alpha, lora_dropout=train.lora_dropout, bias=train.lora_bias,
        random_state=train.seed, use_gradient_checkpointing=checkpointing,
    )
    processor.image_processor.size = {"shortest_edge": model.min_pixels, "longest_edge": model.max_pixels}
    processor.tokenizer.padding_side = "left"
    return peft_model, processor


def optimizer_groups(model: torch.nn.Module, learning_rate: float, weight_decay: float, vision_lr_scale: float):
    """Parameter groups: the decoder's LoRA at `learning_rate`, the vision tower's at
    `learning_rate * vision_lr_scale` (absent when 0: frozen). Biases and norms get no weight decay."""
    groups: dict[tuple[str, bool], list] = {}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        part = "vision" if is_vision_parameter(name) else "language"
        groups.setdefault((part, parameter.ndim >= 2), []).append(parameter)
    rates = {"language": learning_rate, "vision": learning_rate * vision_lr_scale}
    return [{"params": params, "lr": rates[part], "weight_decay": weight_decay if decays else 0.0, "name": part}
            for (part, decays), params in sorted(groups.items()) if rates[part] > 0]


def trainable_summary(model: torch.nn.Module) -> dict[str, int]:
    counts = {"language": 0, "vision": 0}
    for name, parameter in model.named_parameters():
        if parameter.requires_grad:
            counts["vision" if is_vision_parameter(name) else "language"] += parameter.numel()
    return counts

