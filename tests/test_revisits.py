"""`train.revisit_unsolved`: the queue of prompts whose answers were all wrong (vgrpo/revisits.py), on rows laid
out as TRL's RepeatSampler lays them, and TRL's own rollouts drawing a queued prompt again."""

from __future__ import annotations

import hashlib

import pytest
from conftest import lora_model, tiny_config

from vgrpo.revisits import UnsolvedPrompts


def group(question: str, answer: str, size: int = 2) -> list[dict]:
    return [{"question": question, "answer": answer, "row": i} for i in range(size)]


def test_only_first_visits_with_no_right_answer_are_queued_and_each_comes_back_once():
    queue = UnsolvedPrompts(per_step=1, group_size=2)
    first = group("a", "1") + group("b", "2") + group("c", "3")
    rows, revisits = queue.splice(first)
    assert (rows, revisits) == (first, [False, False, False])  # nothing queued yet: the batch as drawn
    queue.record(rows, [False, False, True, False, False, False], revisits)  # b had a right answer
    assert [g[0]["question"] for g in queue.queue] == ["a", "c"]

    second = group("d", "4") + group("e", "5") + group("f", "1")
    rows, revisits = queue.splice(second)
    assert [r["question"] for r in rows] == ["a", "a", "e", "e", "f", "f"]  # one a step, in place of d
    assert revisits == [True, False, False]
    queue.record(rows, [False] * 6, revisits)  # a is wrong again, but a revisit is not queued twice
    assert [g[0]["question"] for g in queue.queue] == ["c", "e", "f"]
    assert (queue.queued, queue.revisited) == (4, 1)


def test_as_many_rows_go_out_as_came_in():
    queue = UnsolvedPrompts(per_step=2, group_size=2)
    queue.record(group("a", "1"), [False, False], [False])
    rows, revisits = queue.splice(group("b", "2") + group("c", "3") + group("d", "4"))
    assert len(rows) == 6 and revisits == [True, False, False]  # one queued: one put back, the rest fresh
    assert not queue.queue


def test_a_batch_that_is_not_whole_groups_is_refused():
    queue = UnsolvedPrompts(per_step=1, group_size=2)
    with pytest.raises(ValueError, match="train.revisit_unsolved: the rollout batch is not whole groups of 2"):
        queue.splice(group("a", "1")[:1] + group("b", "2"))
    with pytest.raises(ValueError, match="not whole groups of 2 rows of one prompt each"):
        queue.splice([group("a", "1")[0], group("b", "2")[0]])
    with pytest.raises(ValueError, match="train.revisit_unsolved: 3 answers scored for 2 rows"):
        queue.record(group("a", "1"), [False] * 3, [False])


def image_key(image) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()


def test_the_trainers_rollouts_draw_an_unsolved_prompt_again(tiny_base, tiny_dataset, tmp_path):
    """Through TRL's `_generate_and_score_completions`: a group with no right answer (a correctness reward of 0;
    the other reward's 1.0 does not count) is queued, and the next batch's rollouts answer its image in place of
    the first fresh one's (the reward functions see the rows that were generated for); a group whose correctness
    reward is above 0 is not queued."""
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    seen, right = [], []

    def recording_reward(completions, **kwargs) -> list[float]:
        """1.0 for each answer, not a correctness reward; keeps which image each was for."""
        seen.append([image_key(image) for image in kwargs["image"]])
        return [1.0] * len(completions)

    def correctness_on_request(completions, **kwargs) -> list[float]:
        """2.0 for the first answer once `right` holds anything, else 0.0."""
        return [2.0 if right and i == 0 else 0.0 for i in range(len(completions))]

    config = tiny_config(revisit_unsolved=1)
    model, processor = lora_model(tiny_base, config)
    trainer = build_trainer(config, model, processor, load_dataset(tiny_dataset, ("train",))["train"],
                            [recording_reward, correctness_on_request], [1.0, 1.0], tmp_path / "ckpt")
    assert trainer.unsolved is not None and trainer.unsolved.per_step == 1  # build_trainer reads the knob
    batches = iter(trainer.get_train_dataloader())
    first, second, third = next(batches), next(batches), next(batches)
    first_images = [image_key(row["image"]) for row in first]
    assert first_images != [image_key(row["image"]) for row in second]  # two different draws
    model.train()
    trainer._generate_and_score_completions(first)
    assert trainer.last_correct == [False] * len(first)
    assert (trainer.unsolved.queued, trainer.unsolved.revisited) == (1, 0)
    trainer._generate_and_score_completions(second)
    assert seen == [first_images, first_images]  # the second rollout answered the first, unsolved image again
    assert (trainer.unsolved.queued, trainer.unsolved.revisited) == (1, 1)  # and did not queue it twice
    right.append(True)
    trainer._generate_and_score_completions(third)
    assert trainer.last_correct == [True] + [False] * (len(third) - 1)  # read from the correctness column
    assert (trainer.unsolved.queued, trainer.unsolved.revisited) == (1, 1)  # one right answer: not queued
