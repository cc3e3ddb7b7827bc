"""A tiny, randomly initialised Qwen3-VL that runs every stage on a CPU.

Same model class as Qwen3-VL-8B (`Qwen3VLForConditionalGeneration`), same tokenizer (Qwen's real
151,936-token vocabulary, rebuilt offline from the vocab file llama.cpp ships), same processor class
and chat format; only the sizes differ. Text hidden size 256 keeps llama.cpp's K-quants usable.
Built once per (config, seed) into the cache and saved as safetensors; the same seed gives the same
bytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoTokenizer,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from vgrpo.files import atomic_dir
from vgrpo.vendor import cache_dir, llama_cpp_dir

BUILDER_VERSION = 3  # bump when the recipe below changes, so cached models are rebuilt
VOCAB_FILE = "ggml-vocab-qwen2.gguf"
CHAT_TEMPLATE = (Path(__file__).parent / "chat_template.jinja").read_text()

# Qwen's special tokens above <|im_end|> (151645). The GGUF vocab names them [PAD151646]...; the ids
# agree with Qwen3VLConfig's image_token_id (151655), vision_start/end (151652/151653).
QWEN_SPECIAL_TOKENS = {
    151646: "<|object_ref_start|>", 151647: "<|object_ref_end|>", 151648: "<|box_start|>",
    151649: "<|box_end|>", 151650: "<|quad_start|>", 151651: "<|quad_end|>", 151652: "<|vision_start|>",
    151653: "<|vision_end|>", 151654: "<|vision_pad|>", 151655: "<|image_pad|>", 151656: "<|video_pad|>",
    151657: "<tool_call>", 151658: "</tool_call>", 151659: "<|fim_prefix|>", 151660: "<|fim_middle|>",
    151661: "<|fim_suffix|>", 151662: "<|fim_pad|>", 151663: "<|repo_name|>", 151664: "<|file_sep|>",
    151665: "<tool_response>", 151666: "</tool_response>", 151667: "<think>", 151668: "</think>",
}  # fmt: skip
NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

TINY_CONFIG = {
    "text_config": {
        "vocab_size": 151936,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                            "mrope_section": [8, 12, 12], "mrope_interleaved": True},
        "tie_word_embeddings": True,
    },
    "vision_config": {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 256,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [1],
    },
    "tie_word_embeddings": True,
}


def tiny_model_dir(seed: int = 0, min_pixels: int = 65536, max_pixels: int = 65536) -> Path:
    """The cached tiny model for this seed and image budget, built on first use."""
    recipe = {"builder": BUILDER_VERSION, "config": TINY_CONFIG, "seed": seed, "min_pixels": min_pixels,
              "max_pixels": max_pixels, "transformers": transformers.__version__, "template": CHAT_TEMPLATE}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    path = cache_dir() / f"tiny-qwen3vl-{key}"
    if not (path / "model.safetensors").is_file():
        build_tiny_model(path, seed=seed, min_pixels=min_pixels, max_pixels=max_pixels)
    return path


def build_tiny_model(out_dir: Path, seed: int = 0, min_pixels: int = 65536, max_pixels: int = 65536) -> Path:
    """Build model + processor into `out_dir` (via a temp dir and a rename)."""
    processor = build_processor(min_pixels, max_pixels)
    torch.manual_seed(seed)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**TINY_CONFIG)).to(torch.float32).eval()
    tokenizer = processor.tokenizer
    for config in (model.config, model.config.text_config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        _drop_loading_state(tmp / "tokenizer_config.json")
    return Path(out_dir)


def _drop_loading_state(path: Path) -> None:
    """transformers records how the tokenizer was loaded (e.g. HF_HUB_OFFLINE); the bytes must not
    depend on the environment."""
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "eos_token_id", "pad_token_id", "bos_token_id"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_processor(min_pixels: int, max_pixels: int) -> Qwen3VLProcessor:
    image_processor = Qwen2VLImageProcessor(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
        min_pixels=min_pixels, max_pixels=max_pixels,
    )
    video_processor = Qwen3VLVideoProcessor(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=qwen_tokenizer(),
                            video_processor=video_processor, chat_template=CHAT_TEMPLATE)


def qwen_tokenizer():
    """Qwen's tokenizer from llama.cpp's vocab file, with Qwen's special tokens named (~30 s, cached)."""
    vocab = llama_cpp_dir() / "models" / VOCAB_FILE
    key = hashlib.sha256(vocab.read_bytes()).hexdigest()[:12]
    path = cache_dir() / f"qwen-tokenizer-{key}-v{BUILDER_VERSION}"
    if not (path / "tokenizer.json").is_file():
        _build_tokenizer(vocab, path)
    return AutoTokenizer.from_pretrained(path)


def _build_tokenizer(vocab: Path, out_dir: Path) -> None:
    with atomic_dir(out_dir) as tmp:
        AutoTokenizer.from_pretrained(vocab.parent, gguf_file=vocab.name).save_pretrained(tmp)
        _name_special_tokens(tmp)


def _name_special_tokens(tmp: Path) -> None:

    # Give the placeholder ids their Qwen names, as added tokens (special except tool/think markers).
    data = json.loads((tmp / "tokenizer.json").read_text())
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    for token_id, name in QWEN_SPECIAL_TOKENS.items():
        del data["model"]["vocab"][by_id[token_id]]
        data["model"]["vocab"][name] = token_id
        data["added_tokens"].append({"id": token_id, "content": name, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": name not in NOT_SPECIAL})
    (tmp / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))

    config = json.loads((tmp / "tokenizer_config.json").read_text())
    config.update(eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None,
                  model_max_length=32768)
    (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    _drop_loading_state(tmp / "tokenizer_config.json")
    (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
