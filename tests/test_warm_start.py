"""The warm start's data and loss: its answer styles (`base.described_share`) and the label smoothing
of the answer's number (`base.answer_smoothing`)."""

import dataclasses

import pytest
import torch

from vgrpo.config import ConfigError
from vgrpo.prompts import brief_answer, parse_answer, reasoning_text, reference_answer
from vgrpo.rewards import REWARDS, stated_count
from vgrpo.warm_start import answer_number_ids, answer_number_mask, smoothed_cross_entropy, solution_tags

COLOURS = {"triangles": "red", "circles": "blue", "squares": "green"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def labels_of(tokenizer, answer: str, prompt_tokens: int = 5, padding: int = 3) -> list[int]:
    """A row of SFT labels as the collator makes them: the prompt and the padding are -100."""
    return [-100] * prompt_tokens + tokenizer(answer, add_special_tokens=False)["input_ids"] + [-100] * padding


@pytest.mark.parametrize("counts, asked", [({"triangles": 2, "circles": 3, "squares": 1}, "circles"),
                                           ({"triangles": 5, "circles": 0, "squares": 3}, "triangles"),
                                           ({"triangles": 1, "circles": 1, "squares": 4}, "squares")])
def test_the_mask_holds_exactly_the_answers_number(tokenizer, counts, asked):
    answer = reference_answer(counts, COLOURS, asked)
    row = labels_of(tokenizer, answer)
    mask = answer_number_mask(torch.tensor([row, row]), solution_tags(tokenizer))
    for row_mask in mask:
        assert tokenizer.decode([t for t, m in zip(row, row_mask, strict=True) if m]) == str(counts[asked])


def test_an_answer_without_solution_tags_is_named(tokenizer):
    row = labels_of(tokenizer, "<REASONING>2 red triangles</REASONING>3")
    with pytest.raises(ConfigError, match="base.answer_smoothing"):
        answer_number_mask(torch.tensor([row]), solution_tags(tokenizer))


def test_number_ids_are_one_token_each(tokenizer):
    answers = [reference_answer({"triangles": n, "circles": 1, "squares": 1}, COLOURS, "triangles") for n in (1, 5, 3)]
    ids = answer_number_ids(tokenizer, answers)
    assert [tokenizer.decode([i]) for i in ids] == ["1", "3", "5"]
    with pytest.raises(ConfigError, match="not one token each"):
        answer_number_ids(tokenizer, [answers[0].replace(">1<", ">12<")])


@pytest.mark.parametrize("smoothing", [0.0, 0.5, 1.0])
def test_the_loss_is_minimised_by_the_smoothed_target(smoothing):
    """Logits trained on the loss alone end where the target puts them: at a number position,
    (1 - smoothing) on the right number plus smoothing spread over the numbers; elsewhere the class."""
    torch.manual_seed(0)
    logits = torch.zeros(2, 8, requires_grad=True)
    targets, is_number, numbers = torch.tensor([3, 6]), torch.tensor([True, False]), torch.tensor([1, 2, 3, 4])
    optimizer = torch.optim.Adam([logits], lr=0.1)
    for _ in range(2000):
        optimizer.zero_grad()
        smoothed_cross_entropy(logits, targets, is_number, numbers, smoothing).backward()
        optimizer.step()
    probs = logits.softmax(-1).detach()
    expected = torch.zeros(8)
    expected[numbers] = smoothing / len(numbers)
    expected[3] += 1 - smoothing
    assert torch.allclose(probs[0], expected, atol=0.02)
    assert probs[1, 6] > 0.98  # not a number position: plain cross-entropy


def test_the_base_stage_trainer_smooths_the_answer_when_asked(tiny_model_dir, tiny_dataset, tmp_path):
    """The trainer the base stage builds: with answer_smoothing the same batch gets another loss, the
    smoothed one; without it the trainer has no smoothing at all (the warm start of every profile)."""
    import dataclasses

    from conftest import tiny_config

    from vgrpo.config import WARMUP
    from vgrpo.models import load_model, load_processor
    from vgrpo.shapes import dataset_colours, load_dataset
    from vgrpo.warm_start import sft_dataset, sft_trainer

    config = tiny_config()
    warmup = load_dataset(tiny_dataset, splits=(WARMUP,))[WARMUP].select(range(8))
    examples = sft_dataset(warmup, dataset_colours(tiny_dataset))
    processor = load_processor(str(tiny_model_dir), config.model)
    net = load_model(str(tiny_model_dir), "float32")
    losses = []
    for smoothing in (0.0, 0.0, 1.0):
        params = dataclasses.replace(config.base, answer_smoothing=smoothing, batch_size=8)
        trainer = sft_trainer(net, processor, params, examples, tmp_path / str(len(losses)))
        assert trainer.answer_smoothing == smoothing
        batch = next(iter(trainer.get_train_dataloader()))
        torch.manual_seed(0)  # the same sampled negatives every time
        with torch.no_grad():
            losses.append(trainer.compute_loss(net, batch).item())
    # the random model spreads its mass evenly, so one position in ~30 moves the mean loss by ~1e-3
    assert losses[0] == losses[1] and abs(losses[2] - losses[0]) > 1e-4, losses


def test_the_warm_start_dataset_leaves_generates_output_as_it_was(tiny_dataset, tmp_path):
    """A datasets cache file written into data/shapes would make DVC rerun the pipeline from `base` on
    the next `dvc repro` (it did, whenever the warm start was not cached yet)."""
    import shutil

    from vgrpo.config import WARMUP
    from vgrpo.shapes import dataset_colours, load_dataset
    from vgrpo.warm_start import sft_dataset

    data = shutil.copytree(tiny_dataset, tmp_path / "shapes")
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    examples = sft_dataset(load_dataset(data, splits=(WARMUP,))[WARMUP], dataset_colours(data))
    assert len(examples) > 0 and examples[0]["completion"][0]["content"].startswith("<REASONING>")
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before


def test_a_brief_answer_is_well_formed_and_right_but_states_no_count():
    counts = {"triangles": 2, "circles": 3, "squares": 1}
    answer = brief_answer(counts, COLOURS, "circles")
    assert REWARDS["format_tags"]([answer]) == [1.0] and parse_answer(answer) == 3
    assert stated_count(reasoning_text(answer), "circles") is None
    assert REWARDS["correctness_tags"]([answer], answer=["3"]) == REWARDS["correctness_tags"](
        [reference_answer(counts, COLOURS, "circles")], answer=["3"])


def test_described_share_picks_each_answers_style_by_seed(tiny_dataset):
    """The share of described answers is drawn per image with base.seed: the same seed gives the same
    answers, and share 1.0 gives the reference answers only (the warm start as before the knob)."""
    from vgrpo.config import WARMUP
    from vgrpo.shapes import dataset_colours, load_dataset
    from vgrpo.warm_start import sft_dataset

    warmup, colours = load_dataset(tiny_dataset, splits=(WARMUP,))[WARMUP], dataset_colours(tiny_dataset)
    expected = [reference_answer(row["counts"], colours, row["target_shape"]) for row in warmup]

    def answers(share, seed):
        return [turn[0]["content"] for turn in sft_dataset(warmup, colours, share, seed)["completion"]]

    assert answers(1.0, 0) == expected
    half = answers(0.5, 0)
    described = [a == e for a, e in zip(half, expected, strict=True)]
    assert 0.35 < sum(described) / len(half) < 0.65, sum(described)
    briefs = [row for row, d in zip(warmup, described, strict=True) if not d]
    assert [a for a, d in zip(half, described, strict=True) if not d] == [
        brief_answer(row["counts"], colours, row["target_shape"]) for row in briefs]
    assert answers(0.5, 0) == half and answers(0.5, 1) != half


@pytest.mark.slow
def test_the_warm_start_is_the_same_bytes_whatever_the_thread_count(tiny_model_dir, tiny_dataset, tmp_path,
                                                                     monkeypatch):
    """A fresh machine builds the cached warm start again: on 1 thread or 2 it must get the same weights
    (on 2 threads, without `one_thread`, the cpu profile's warm start came out another model)."""
    import hashlib
    import shutil

    from conftest import tiny_config

    from vgrpo.warm_start import warm_start

    config = tiny_config()
    params = dataclasses.replace(config.base, sft_steps=8)  # thread counts change sums from the first step
    digests = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            monkeypatch.setenv("VGRPO_CACHE", str(tmp_path / f"cache-{n}"))  # nothing cached: build it
            model_dir = shutil.copytree(tiny_model_dir, tmp_path / f"model-{n}")
            torch.set_num_threads(n)
            warm_start(model_dir, config.model, params, tiny_dataset, tmp_path / f"reports-{n}", log=print)
            assert torch.get_num_threads() == n  # given back as it was
            digests.append(hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest())
    finally:
        torch.set_num_threads(threads)
    assert digests[0] == digests[1]


def test_guessed_brief_answers_are_random_counts_and_leave_the_described_ones(tiny_dataset):
    """`brief_answers: guessed` changes only the brief answers' number: drawn with the seed, spread over
    the split's counts, and not the image's count more often than a guess would be."""
    from vgrpo.config import WARMUP
    from vgrpo.shapes import dataset_colours, load_dataset
    from vgrpo.warm_start import sft_dataset

    warmup, colours = load_dataset(tiny_dataset, splits=(WARMUP,))[WARMUP], dataset_colours(tiny_dataset)

    def answers(brief_answers, seed=0):
        return [turn[0]["content"] for turn in sft_dataset(warmup, colours, 0.5, seed, brief_answers)["completion"]]

    right, guessed = answers("right"), answers("guessed")
    described = [a == reference_answer(row["counts"], colours, row["target_shape"])
                 for a, row in zip(right, warmup, strict=True)]
    assert [g for g, d in zip(guessed, described, strict=True) if d] == [
        r for r, d in zip(right, described, strict=True) if d]
    briefs = [(parse_answer(g), row) for g, d, row in zip(guessed, described, warmup, strict=True) if not d]
    assert [g for g, d in zip(guessed, described, strict=True) if not d] == [
        brief_answer({row["target_shape"]: n}, colours, row["target_shape"]) for n, row in briefs]
    counts = {int(a) for a in warmup["answer"]}
    assert {n for n, _ in briefs} == counts
    assert sum(n == int(row["answer"]) for n, row in briefs) / len(briefs) < 1.5 / len(counts)
    assert answers("guessed") == guessed and answers("guessed", seed=1) != guessed


def test_guessed_brief_answers_reach_the_guess_max(tiny_dataset):
    """`base.brief_guess_max` above the warm-up's counts puts those numbers in the brief answers (and so in
    the answer slot's support), and leaves the described answers as they were."""
    from vgrpo.config import WARMUP
    from vgrpo.shapes import dataset_colours, load_dataset
    from vgrpo.warm_start import sft_dataset

    warmup, colours = load_dataset(tiny_dataset, splits=(WARMUP,))[WARMUP], dataset_colours(tiny_dataset)
    highest = max(int(a) for a in warmup["answer"])

    def answers(guess_max):
        return [turn[0]["content"] for turn in sft_dataset(warmup, colours, 0.5, 0, "guessed", guess_max)["completion"]]

    within, beyond = answers(None), answers(highest + 3)
    described = [a == reference_answer(row["counts"], colours, row["target_shape"])
                 for a, row in zip(within, warmup, strict=True)]
    assert [b for b, d in zip(beyond, described, strict=True) if d] == [
        w for w, d in zip(within, described, strict=True) if d]
    numbers = {parse_answer(b) for b, d in zip(beyond, described, strict=True) if not d}
    assert max(numbers) > highest and max(parse_answer(w) for w in within) <= highest
