"""Answers from a transformers model: batched greedy (or sampled) generation with the shared prompt,
decoded completions, the quick held-out accuracy the warm start and GRPO log along the way, and the
next-token logits of one prompt. Used by the warm start (base), train and evaluate; it knows nothing
of where a model comes from."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from vgrpo.prompts import hf_messages, parse_answer
from vgrpo.rewards import REWARDS


def batch_inputs(processor, rows, device):
    conversations = [hf_messages(row["question"], row["image"]) for row in rows]
    return processor.apply_chat_template(conversations, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt", processor_kwargs={"padding": True}).to(device)


def append_tokens(inputs, tokens: torch.Tensor) -> dict:
    """A processor batch with text tokens appended after each prompt (`tokens`: one row per example, on
    the batch's device): input ids, an attention mask of ones, text (0) as their multimodal token type.
    Left padding ends every prompt at the same column, so the tokens follow each prompt directly."""
    out = dict(inputs)
    out["input_ids"] = torch.cat([inputs["input_ids"], tokens], dim=1)
    out["attention_mask"] = torch.cat([inputs["attention_mask"], torch.ones_like(tokens)], dim=1)
    out["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(tokens)], dim=1)
    return out


@torch.no_grad()
def generate(model, processor, rows, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
             bad_words_ids: list[list[int]] | None = None, top_p: float = 1.0, top_k: int = 0,
             logits_processors: list | None = None) -> list[list[int]]:
    """Completion token ids for a batch of rows (left padding, so all prompts end together); greedy
    unless `do_sample` (at `temperature`, `top_p`, `top_k`: 0 for the whole vocabulary); never the token
    sequences in `bad_words_ids`; `logits_processors` run after the sampling settings."""
    inputs = batch_inputs(processor, rows, model.device)
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k} if do_sample
                else {"do_sample": False})
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, bad_words_ids=bad_words_ids,
                            logits_processor=LogitsProcessorList(logits_processors or []), **sampling)
    new = output[:, inputs["input_ids"].shape[1]:]
    stop = {processor.tokenizer.eos_token_id, processor.tokenizer.pad_token_id}
    completions = []
    for ids in new.tolist():
        end = next((i for i, token in enumerate(ids) if token in stop), len(ids))
        completions.append(ids[:end])
    return completions


@torch.no_grad()
def completion_texts(model, processor, rows, max_new_tokens: int, batch_size: int = 16, **sampling) -> list[str]:
    """The decoded completions for `rows`, `batch_size` at a time (`sampling`: `generate`'s options)."""
    texts = []
    for begin in range(0, len(rows), batch_size):
        ids = generate(model, processor, rows[begin:begin + batch_size], max_new_tokens, **sampling)
        texts += processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    return texts


def greedy_accuracy(model, processor, rows, samples: int, max_new_tokens: int = 64, batch_size: int = 16) -> dict:
    """Greedy answers to the first `samples` rows: accuracy and answer-format rate. The quick held-out
    measure the warm start and GRPO log along the way (the evaluate stage measures far more)."""
    rows = [rows[i] for i in range(min(samples, len(rows)))]
    if not rows:
        return {"samples": 0, "accuracy": None, "format_compliance": None}
    texts = completion_texts(model, processor, rows, max_new_tokens, batch_size)
    correct = [parse_answer(t) == int(r["answer"]) for t, r in zip(texts, rows, strict=True)]
    formatted = [f == 1.0 for f in REWARDS["format_tags"](texts)]
    return {"samples": len(rows), "accuracy": round(sum(correct) / len(rows), 4),
            "format_compliance": round(sum(formatted) / len(rows), 4)}


@torch.no_grad()
def next_token_logits(model, processor, row) -> torch.Tensor:
    """The next-token logits after one row's prompt, in float32."""
    return model(**batch_inputs(processor, [row], model.device)).logits[0, -1].float()
