"""`train.answer_temperature`: the token after `<SOLUTION>` is sampled hotter, everything else as before
(tests/test_training.py shows GRPO's rollouts run it)."""

from __future__ import annotations

import torch

from vgrpo.answer_sampling import AnswerTemperature, answer_opening_ids, answer_processors
from vgrpo.prompts import SOLUTION_START


def test_the_opening_is_the_tokens_right_before_the_answers_number(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    opening = answer_opening_ids(tokenizer)
    text = tokenizer.decode(opening)
    assert text.endswith(SOLUTION_START) and len(text) < len(SOLUTION_START) + 3  # `><SOLUTION>`: no more
    taught = tokenizer("<REASONING>I count the red triangles.</REASONING><SOLUTION>4</SOLUTION>",
                       add_special_tokens=False)["input_ids"]
    at = next(i for i in range(len(taught)) if taught[i - len(opening):i] == opening)
    assert tokenizer.decode(taught[at]) == "4"


def test_only_rows_at_the_answer_are_scaled_and_kept_to_the_allowed_tokens():
    processor = AnswerTemperature([5, 6], allowed_ids=[0, 1], scale=2.0)
    input_ids = torch.tensor([[1, 5, 6], [5, 6, 1], [6, 5, 6]])
    scores = torch.tensor([[2.0, -4.0, 9.0]] * 3)
    out = processor(input_ids, scores)
    inf = float("-inf")
    assert torch.equal(out, torch.tensor([[1.0, -2.0, inf], [2.0, -4.0, 9.0], [1.0, -2.0, inf]]))
    assert torch.equal(scores, torch.tensor([[2.0, -4.0, 9.0]] * 3))  # the caller's scores are left as they were
    assert processor.answers == 2
    assert torch.equal(processor(torch.tensor([[6]]), scores[:1]), scores[:1])  # shorter than the opening


def test_the_scale_makes_the_answer_token_sampled_at_the_answer_temperature(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert answer_processors(tokenizer, 0.7, None) == []
    (processor,) = answer_processors(tokenizer, 0.7, 1.4)
    assert processor.scale == 2.0 and processor.opening.tolist() == answer_opening_ids(tokenizer)
    assert [tokenizer.decode([i]) for i in processor.allowed.tolist()] == [str(d) for d in range(10)]
