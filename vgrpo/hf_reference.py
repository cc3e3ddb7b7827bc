"""The transformers side of smoke: the merged model, loaded as `train` loaded the base (dtype, 4-bit),
answers the smoke images greedily, gives its log-probabilities where it states its first count (also
with a blank image) and its vision tower's image embeddings; then it is freed for real, so llama.cpp
gets its memory."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import numpy as np
import torch

from vgrpo import models
from vgrpo.answers import Answer, Run, blank_image, count_position, count_positions, log_softmax
from vgrpo.config import Config
from vgrpo.prompts import hf_messages


@torch.no_grad()
def hf_forced_logprobs(model, processor, question: str, image, prefix: list[int]) -> np.ndarray:
    """The next-token log-probabilities after the prompt (with `image`) and the answer tokens `prefix`."""
    from vgrpo.generation import append_tokens, batch_inputs

    inputs = batch_inputs(processor, [{"question": question, "image": image}], model.device)
    inputs = append_tokens(inputs, torch.tensor([prefix], device=model.device, dtype=inputs["input_ids"].dtype))
    return log_softmax(model(**inputs, logits_to_keep=1).logits[0, -1].double().cpu().numpy())


@torch.no_grad()
def hf_answer(model, processor, question: str, image, max_new_tokens: int) -> Answer:
    """Greedy answer from transformers, with the same prompt and image-token budget, its log-probabilities
    where it states its first count, and the same with a blank image in place of the real one."""
    inputs = processor.apply_chat_template(hf_messages(question, image), add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt").to(model.device)
    start = time.perf_counter()
    out = model.generate(**inputs, do_sample=False, repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                         output_logits=True, return_dict_in_generate=True)
    seconds = time.perf_counter() - start
    ids = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    text = processor.tokenizer.decode(ids, skip_special_tokens=True)
    at = count_position(ids, processor.tokenizer)
    count = blank = None
    if at is not None:
        count = log_softmax(out.logits[at][0].double().cpu().numpy())
        blank = hf_forced_logprobs(model, processor, question, blank_image(image), ids[:at])
    ended = {processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id}
    cut = len(ids) >= max_new_tokens and not ended & set(ids)
    return Answer(text, ids, log_softmax(out.logits[0][0].double().cpu().numpy()), seconds, count, blank, cut)


@torch.no_grad()
def hf_image_embeddings(model, processor, image) -> np.ndarray:
    """The same from the transformers model: its vision tower's merged features, then its deepstack
    features, one row per image token."""
    inputs = processor.image_processor(images=[image], return_tensors="pt").to(model.device)
    out = model.model.get_image_features(inputs["pixel_values"].to(model.dtype), inputs["image_grid_thw"])
    parts = [out.pooler_output[0], *(features[0] if isinstance(features, list | tuple) else features
                                     for features in out.deepstack_features)]
    return torch.cat(parts, dim=-1).double().cpu().numpy()


def run_hf(merged_dir: Path, config: Config, dtype: str, samples: list[dict]) -> tuple[Run, dict]:
    """The merged model's answers, loaded as `train` loaded the base (dtype, 4-bit), straight onto the GPU
    when there is one; then the model is freed for real, so llama.cpp gets its GPU memory. Returns the run
    and what freeing gave back: the GPU's free memory with the model loaded and after (the driver's
    figures, torch.cuda.mem_get_info, after PyTorch's cache is emptied), or on a CPU the weights' bytes;
    and whether the model object is gone."""
    run, model_ref, free_loaded, weights = _merged_model_answers(merged_dir, config, dtype, samples)
    gc.collect()  # the model lived only in that call's frame; a cycle inside it needs the collector
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()  # PyTorch's caching allocator keeps freed blocks for itself until told
    free_after = torch.cuda.mem_get_info()[0] if cuda else None
    freed = (free_after - free_loaded) if cuda else weights
    return run, {"model_released": model_ref() is None, "memory_freed_gb": round(freed / 2**30, 3),
                 "gpu_free_gb_loaded": None if free_loaded is None else round(free_loaded / 2**30, 3),
                 "gpu_free_gb_after": None if free_after is None else round(free_after / 2**30, 3)}


def _merged_model_answers(merged_dir: Path, config: Config, dtype: str, samples: list[dict]):
    """The model exists only in this frame: no caller can keep it alive. Returns the run, a weak reference
    to the model, the GPU's free bytes while it is loaded (None on a CPU) and its weights' bytes."""
    start = time.perf_counter()
    processor = models.load_processor(str(merged_dir), config.model)
    model = models.load_model(str(merged_dir), dtype, load_in_4bit=config.train.load_in_4bit).eval()
    load_seconds = time.perf_counter() - start
    answers = [hf_answer(model, processor, s["question"], s["image"], config.smoke.max_new_tokens) for s in samples]
    models.check_finite(torch.from_numpy(answers[0].first_logprobs), dtype, f"smoke: the merged model ({merged_dir})")
    positions = [count_positions(a.token_ids, processor.tokenizer) for a in answers]
    embeddings = [hf_image_embeddings(model, processor, s["image"]) for s in samples]
    free_loaded = torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return (Run(answers, load_seconds, embeddings, count_positions=positions), weakref.ref(model), free_loaded,
            weights)
