"""Proof that GRPO, as the product runs it, moves the warm-started tiny Qwen3-VL: it learns to describe
first (the better of the two answer styles its warm start knows), which lifts its greedy accuracy. It does
not prove that GRPO teaches counting: the counting is the warm start's (docs/cpu-research.md).

Everything is the `cpu` profile's: its data (the generate stage), its warm-started base (the base
stage; cached by recipe, so seconds after the first build, a few minutes before), its rewards
(`correctness_tags` + `format_tags`), its loss (`dr_grpo`, sequence-level importance sampling), its
rollout temperature (0.7) and its rollout sampler on a CPU (inverse CDF), trained with the train
stage's own `build_trainer`, for fewer steps (each training image seen once, as in the cpu run). The
warm start knows two answer styles, and greedy decoding picks the brief one, whose answers are
guesses (`base.brief_answers: guessed`), not the one that states the counts first (README, GRPO on a
CPU). The proof, with the adapter on vs off on the same prompts and random seed: the expected
correctness reward on the training images rises, and on held-out test images greedy accuracy rises
while the reasoning comes to state the asked count. A constant reward gives zero advantages, frozen
weights leave the adapter at zero: either way the model does not change and the checks fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import lora_model, profile_params, stage, tiny_config, write_params

from vgrpo.config import config_from_dict
from vgrpo.evaluation import score
from vgrpo.generation import completion_texts
from vgrpo.rewards import REWARDS, reward_functions
from vgrpo.sampling import inverse_cdf_sampling
from vgrpo.shapes import load_dataset
from vgrpo.training import build_trainer

pytestmark = pytest.mark.slow  # GRPO that learns: the cpu profile's warm start and 20 GRPO steps

STEPS = 20  # 80 training images, each once (the cpu profile runs 135 steps): enough for the described style to win
HELD_OUT = 64  # test images, every one answered greedily by both models
REWARD_EVERY = 2  # the expected reward is measured on every second training image (40)
SAMPLES = 2  # answers per image there: 80 per model, with the same seed for both


def cpu_params() -> dict:
    return profile_params("cpu")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """data/shapes and models/base of the cpu profile, written by the generate and base stages."""
    root = tmp_path_factory.mktemp("cpu")
    params = write_params(root / "params.yaml", cpu_params())
    result = stage("generate", "--params", str(params), "--out", str(root / "shapes"))
    assert result.returncode == 0, result.stderr
    result = stage("base", "--params", str(params), "--data", str(root / "shapes"), "--out", str(root / "base"),
                   "--reports", str(root / "reports"))
    assert result.returncode == 0, result.stderr
    return root


def learning_config(**changes):
    config = config_from_dict(cpu_params())
    # the profile's 135 steps at 1.7e-4, shortened to STEPS at the earlier profile's 5e-4: the same
    # learning, in a fifth of the minutes
    train = dataclasses.replace(config.train, **{"max_steps": STEPS, "learning_rate": 5e-4, "save_steps": 10_000,
                                                 "logging_steps": 1, "eval_steps": 0, **changes})
    return dataclasses.replace(config, train=train)


def train(config, rows, base, output_dir):
    model, processor = lora_model(base, config)
    vision_calls = []
    model.get_base_model().model.visual.register_forward_hook(lambda *args: vision_calls.append(1))
    funcs, weights = reward_functions(config.train.rewards)
    trainer = build_trainer(config, model, processor, rows, funcs, weights, output_dir)
    with inverse_cdf_sampling():  # the rollouts' sampler on a CPU, as in the train stage
        trainer.train()
    history = {name: [e[f"rewards/{name}/mean"] for e in trainer.state.log_history if f"rewards/{name}/mean" in e]
               for name in config.train.rewards}
    return model, processor, history, len(vision_calls)


def expected_rewards(model, processor, rows, samples: int, temperature: float, seed: int = 0) -> dict[str, float]:
    """Each reward's mean over `samples` answers per row, sampled with a fixed seed: the policy's
    expected reward on those prompts, measured with far less noise than one step's."""
    rows = [row for row in rows for _ in range(samples)]
    torch.manual_seed(seed)
    with inverse_cdf_sampling():
        texts = completion_texts(model, processor, rows, 40, do_sample=True, temperature=temperature)
    answers = [row["answer"] for row in rows]
    return {name: sum(REWARDS[name](texts, answer=answers)) / len(texts)
            for name in ("correctness_tags", "format_tags")}


def greedy_answers(model, processor, rows) -> dict[str, float]:
    """Greedy accuracy on `rows`, and how often the reasoning states the asked shape's count."""
    texts = completion_texts(model, processor, rows, 40)
    records = score(rows, texts, processor.tokenizer)
    return {"accuracy": sum(r["correct"] for r in records) / len(records),
            "count_stated": sum(r["reasoning_count"] is not None for r in records) / len(records)}


def test_grpo_with_the_product_rewards_raises_held_out_accuracy(cpu_run, tmp_path):
    config = learning_config()
    assert config.train.loss_type == "dr_grpo" and config.train.importance_sampling_level == "sequence"
    assert set(config.train.rewards) == {"correctness_tags", "format_tags"}
    prompts_per_step = config.train.per_device_train_batch_size // config.train.num_generations
    data = load_dataset(cpu_run / "shapes")
    prompts = data["train"].select(range(STEPS * prompts_per_step))
    model, processor, history, vision_calls = train(config, prompts, cpu_run / "base", tmp_path / "ckpt")
    assert len(history["correctness_tags"]) == STEPS
    assert vision_calls >= STEPS  # every step's rollouts and log-probs went through the vision tower

    model.eval()
    held_out = [data["test"][i] for i in range(HELD_OUT)]
    temperature = config.train.temperature
    reward_prompts = [prompts[i] for i in range(0, len(prompts), REWARD_EVERY)]
    trained = expected_rewards(model, processor, reward_prompts, SAMPLES, temperature)
    trained_greedy = greedy_answers(model, processor, held_out)
    with model.disable_adapter():
        untrained = expected_rewards(model, processor, reward_prompts, SAMPLES, temperature)
        untrained_greedy = greedy_answers(model, processor, held_out)
    for name in untrained:
        print(f"{name} on training prompts (T {temperature}): {untrained[name]:.3f} -> {trained[name]:.3f}")
    for name in untrained_greedy:
        print(f"held-out greedy {name}: {untrained_greedy[name]:.3f} -> {trained_greedy[name]:.3f}")
    print("reward per step: " + "; ".join(f"{name} " + " ".join(f"{v:.2f}" for v in values)
                                         for name, values in history.items()))
    # measured (Intel Xeon with AMX, 2 threads, the warm-up counts 1-8): correctness 0.475 -> 1.175 over 80 answers;
    # greedy accuracy 0.188 -> 0.656 on 64 images; count stated 0 -> 1.0. A constant reward or frozen weights leave
    # all three unchanged.
    assert trained["correctness_tags"] >= untrained["correctness_tags"] + 0.05
    assert trained_greedy["accuracy"] >= untrained_greedy["accuracy"] + 5 / HELD_OUT
    assert trained_greedy["count_stated"] >= untrained_greedy["count_stated"] + 0.5  # it learned to describe first


def test_the_warm_start_answers_brief_and_describes_with_its_brief_opening_forbidden(cpu_run):
    """evaluate's `base_described` baseline, on the warm start it is for (the cpu profile's, with a brief style):
    greedy decoding answers brief, and with every spelling of the brief opening forbidden (`>I`, and `>` then
    `I`, which a path could take instead) the reasoning states the asked shape's count on every image."""
    from vgrpo.models import load_model, load_processor
    from vgrpo.prompts import brief_style_openings, reasoning_text
    from vgrpo.rewards import stated_count

    config = config_from_dict(cpu_params())
    model = load_model(str(cpu_run / "base"), "float32").eval()
    processor = load_processor(str(cpu_run / "base"), config.model)
    rows = [load_dataset(cpu_run / "shapes")["test"][i] for i in range(HELD_OUT)]
    greedy = completion_texts(model, processor, rows, 40)
    openings = brief_style_openings(processor.tokenizer)
    assert [processor.tokenizer.convert_ids_to_tokens(o) for o in openings] == [[">I"], [">", "I"]]
    described = completion_texts(model, processor, rows, 40, bad_words_ids=openings)
    brief = sum("I count the" in text for text in greedy) / len(rows)
    stated = sum(stated_count(reasoning_text(t), r["target_shape"]) is not None for t, r in zip(described, rows,
                                                                                                 strict=True))
    print(f"greedy answers brief on {brief:.0%} of {len(rows)} test images; made to describe, the count is stated "
          f"on {stated} of them")
    # measured (Intel Xeon with AMX, the warm-up counts 1-8, base.seed 0): brief on 100%, count stated on 64 of 64
    assert brief >= 0.9 and stated == len(rows)


def test_same_seed_same_trained_weights(tiny_dataset, tiny_base, tmp_path):
    """Training is deterministic: same params and seed, same LoRA weights (and they did move). The tiny
    profile as it is: its warm-started base, its rewards."""
    config = tiny_config(max_steps=3, save_steps=10_000, eval_steps=0)
    data = load_dataset(tiny_dataset)
    runs = []
    for name in ("a", "b"):
        model, _, _, _ = train(config, data["train"], tiny_base, tmp_path / name)
        runs.append({n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n})
    assert runs[0].keys() == runs[1].keys()
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])
    assert any(p.abs().sum() > 0 for p in runs[0].values())  # lora_B starts at zero: it was trained
