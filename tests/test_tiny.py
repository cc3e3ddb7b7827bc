"""The tiny Qwen3-VL: the real model class and tokenizer, built offline, same bytes per seed, and it
loads and answers through the code path the 8B model uses."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from vgrpo import tiny
from vgrpo.vendor import llama_cpp_dir


def digests(path):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir()) if p.is_file()}


def test_saved_as_safetensors_with_processor(tiny_model_dir):
    names = set(os.listdir(tiny_model_dir))
    assert {"model.safetensors", "config.json", "tokenizer.json", "processor_config.json",
            "chat_template.jinja"} <= names
    assert not any(n.endswith((".bin", ".pt", ".pth", ".pkl")) for n in names)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    assert config["text_config"]["hidden_size"] == 256
    assert sum(config["text_config"]["rope_parameters"]["mrope_section"]) == 64 // 2


def test_cached_build_is_reused(tiny_model_dir):
    before = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns
    assert tiny.tiny_model_dir(seed=0) == tiny_model_dir
    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_model_dir):
    a = tiny.build_tiny_model(tmp_path / "a", seed=0)
    b = tiny.build_tiny_model(tmp_path / "b", seed=0)
    c = tiny.build_tiny_model(tmp_path / "c", seed=1)
    assert digests(a) == digests(b) == digests(tiny_model_dir)
    assert digests(c)["model.safetensors"] != digests(a)["model.safetensors"]


def test_qwen_special_tokens_are_named(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(tokenizer) == 151936
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|vision_end|>": 151653, "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<think>": 151667}
    assert {t: tokenizer.convert_tokens_to_ids(t) for t in expected} == expected
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # A special token is one token, never split into pieces.
    assert tokenizer("<|vision_start|><|image_pad|><|vision_end|>")["input_ids"] == [151652, 151655, 151653]


def test_tokenizer_matches_llama_cpp_reference(tiny_model_dir):
    """llama.cpp's own reference tokenisations for the Qwen2 vocabulary."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    models = llama_cpp_dir() / "models"
    texts = (models / "ggml-vocab-qwen2.gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = (models / "ggml-vocab-qwen2.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(texts) >= 40
    for text, ids in zip(texts, expected, strict=False):
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == [int(i) for i in ids.split()], repr(text)


def test_loads_offline_through_auto_classes_and_answers_an_image(tiny_model_dir):
    """A fresh process with HF_HUB_OFFLINE=1 loads via AutoModelForImageTextToText/AutoProcessor."""
    code = f"""
import torch
from PIL import Image, ImageDraw
from transformers import AutoModelForImageTextToText, AutoProcessor
from vgrpo.prompts import hf_messages
path = {str(tiny_model_dir)!r}
processor = AutoProcessor.from_pretrained(path)
model = AutoModelForImageTextToText.from_pretrained(path)
image = Image.new("RGB", (256, 256), "white")
ImageDraw.Draw(image).ellipse((40, 40, 90, 90), fill=(30, 60, 220))
inputs = processor.apply_chat_template(hf_messages("How many circles are in the image?", image),
    add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
print(type(model).__name__, type(processor).__name__, int((inputs["input_ids"] == 151655).sum()),
      out.shape[1] - inputs["input_ids"].shape[1])
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    model_class, processor_class, image_tokens, new_tokens = result.stdout.split()[-4:]
    assert (model_class, processor_class) == ("Qwen3VLForConditionalGeneration", "Qwen3VLProcessor")
    assert int(image_tokens) == 64  # 256x256 at patch 16, merge 2
    assert int(new_tokens) >= 1


def test_vision_tower_sees_the_image(tiny_model_dir):
    """Different images give different logits: pixels reach the language model."""
    import torch
    from PIL import Image, ImageDraw
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from vgrpo.prompts import hf_messages

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    logits = []
    for box in [(10, 10, 60, 60), (150, 150, 220, 220)]:
        image = Image.new("RGB", (256, 256), "white")
        ImageDraw.Draw(image).ellipse(box, fill=(30, 60, 220))
        inputs = processor.apply_chat_template(hf_messages("How many circles are in the image?", image),
                                               add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt")
        with torch.no_grad():
            logits.append(model(**inputs).logits[0, -1])
    assert not torch.allclose(logits[0], logits[1])
