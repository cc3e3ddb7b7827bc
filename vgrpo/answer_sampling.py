"""A hotter sampler for the answer's number only (`train.answer_temperature`).

On the cpu profile almost every wrong answer is a slot slip: the reasoning states the asked count right and
the answer copies another shape's. The slip is one token, the first after `<SOLUTION>`, and at GRPO's
temperature most images slip in all their samples or in none, so their groups have no reward spread and
teach nothing. Sampling that one token hotter (the reasoning keeps GRPO's temperature, which keeps it well
formed) gives those groups right and wrong answers that differ in the slot alone. It is drawn among the
digits only: over the whole vocabulary a hotter answer token is mostly not a number (the cpu warm start's
answers at 1.4 were malformed 40% of the time, against 23% at 0.7: docs/cpu-research.md). GRPO's rollouts,
RFT's samples and pass@k use the same sampler, so the equal-supervision control sees the same answers.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from vgrpo.prompts import SOLUTION_START, reference_answer


def answer_opening_ids(tokenizer) -> list[int]:
    """The token ids the taught answer format puts right before the answer's number (`><SOLUTION>`, as the
    reasoning's closing tag and the answer's opening tag tokenize together)."""
    colours = {"triangles": "red", "circles": "blue", "squares": "green"}  # any: only words differ
    text = reference_answer({"triangles": 2, "circles": 3, "squares": 1}, colours, "circles")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    opening = SOLUTION_START
    start = 1
    while opening not in tokenizer.decode(ids[:start]):
        start += 1
    begin = start - 1
    while opening not in tokenizer.decode(ids[begin:start]):
        begin -= 1
    return ids[begin:start]


def digit_ids(tokenizer) -> list[int]:
    """The ids of the ten one-digit tokens (Qwen's tokenizer writes every number digit by digit)."""
    return [tokenizer.convert_tokens_to_ids(str(digit)) for digit in range(10)]


class AnswerTemperature(LogitsProcessor):
    """In the rows whose last tokens are `opening_ids`, keeps only the `allowed_ids` and divides their scores
    by `scale`. Custom processors run after `generate`'s own temperature, so a scale of
    answer_temperature / temperature samples the answer token at answer_temperature. `answers` counts the
    rows it drew that way (train reports it: a knob that never fired shows as 0)."""

    def __init__(self, opening_ids: list[int], allowed_ids: list[int], scale: float):
        self.opening = torch.tensor(opening_ids)
        self.allowed = torch.tensor(allowed_ids)
        self.scale = scale
        self.answers = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        width = self.opening.numel()
        if input_ids.size(1) < width:
            return scores
        at_answer = (input_ids[:, -width:] == self.opening.to(input_ids.device)).all(-1)
        if not at_answer.any():
            return scores
        self.answers += int(at_answer.sum())
        allowed = self.allowed.to(scores.device)
        answer = torch.full_like(scores[at_answer], float("-inf"))
        answer[:, allowed] = scores[at_answer][:, allowed] / self.scale
        scores = scores.clone()
        scores[at_answer] = answer
        return scores


def answer_processors(tokenizer, temperature: float, answer_temperature: float | None) -> list:
    """The logits processors `generate` takes for sampling at `temperature` with the answer's first digit at
    `answer_temperature` (none where that is null)."""
    if answer_temperature is None:
        return []
    return [AnswerTemperature(answer_opening_ids(tokenizer), digit_ids(tokenizer), answer_temperature / temperature)]
