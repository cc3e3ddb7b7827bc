"""vgrpo/controls.py's data, without training: the prompts GRPO draws (how many, in which order) and the
full-label control's answers. `tests/test_benchmarks.py` trains both controls on a finished run."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from vgrpo import controls
from vgrpo.prompts import reference_answer

COLOURS = {"triangles": "red", "circles": "green", "squares": "blue"}


def split(size: int):
    """A train split's columns that the controls read (no images: nothing here renders one)."""
    from datasets import Dataset

    counts = [{"triangles": i % 3, "circles": i % 5, "squares": 1} for i in range(size)]
    return Dataset.from_dict({"index": list(range(size)), "counts": counts,
                              "target_shape": ["circles"] * size, "answer": [str(c["circles"]) for c in counts]})


def test_grpo_prompts_are_as_many_as_grpo_draws_in_the_seeds_order():
    config = tiny_config(max_steps=5, per_device_train_batch_size=8, num_generations=4, seed=3)
    prompts = controls.grpo_prompts(split(7), config)
    assert len(prompts) == 5 * 8 // 4  # 10 prompts: the run wraps round a 7-row split
    again = controls.grpo_prompts(split(7), config)
    assert prompts["index"] == again["index"]
    assert sorted(set(prompts["index"])) == list(range(7))
    other = controls.grpo_prompts(split(7), tiny_config(max_steps=5, per_device_train_batch_size=8,
                                                        num_generations=4, seed=4))
    assert other["index"] != prompts["index"]
    # dynamic sampling draws twice the groups it trains on, gradient accumulation twice the rows a step
    drawn = controls.grpo_prompts(split(7), tiny_config(max_steps=5, per_device_train_batch_size=8, num_generations=4,
                                                        seed=3, prompt_oversampling=2, gradient_accumulation_steps=2))
    assert len(drawn) == 5 * 8 * 2 * 2 // 4


def test_full_labels_repeat_each_prompt_as_grpo_samples_it_with_its_full_label():
    config = tiny_config(num_generations=3)
    prompts = split(2)
    rows, answers = controls.full_labels(prompts, COLOURS, config)
    assert [row["index"] for row in rows] == [0, 0, 0, 1, 1, 1]
    assert answers[3] == reference_answer(prompts[1]["counts"], COLOURS, "circles")
    assert "1 green circles" in answers[3]


def test_an_unknown_control_is_refused_before_any_model_loads(tmp_path):
    with pytest.raises(ValueError, match="unknown control 'dpo' \\(expected one of rft, full_label_sft\\)"):
        controls.train_control("dpo", tiny_config(), str(tmp_path / "missing"), split(2), COLOURS, tmp_path / "out")
