"""Proof that GRPO, as the product runs it, optimises the warm-started tiny Qwen3-VL's policy.

Everything is the `cpu` profile's: its data (the generate stage), its warm-started base (the base
stage; cached by recipe, so seconds after the first build, about a minute before), its rewards
(`correctness_tags` + `format_tags`) and its loss (`dr_grpo`, sequence-level importance sampling),
trained with the train stage's own `build_trainer`, for fewer steps. One knob differs: rollouts at
temperature 1.0 instead of 0.7. At 1.0 the warm start's sampled answers often break the format (a
token from the 150k-token tail it never learned to push down), so both rewards have room to rise
within 45 steps; at 0.7 they are near their ceiling and greedy accuracy did not rise in any try (see
the README's CPU section). The proof: the format and correctness rewards rise along training, and on
held-out test images the sampled answers keep the format far more often than the same model's with
the adapter switched off (same images, same random seed). A constant reward gives zero advantages,
frozen weights leave the adapter at zero: either way the checks fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import load_params, lora_model, stage, tiny_config, write_params

from vgrpo.config import config_from_dict
from vgrpo.evaluation import generate, greedy_accuracy
from vgrpo.rewards import REWARDS, reward_functions
from vgrpo.shapes import load_dataset
from vgrpo.training import build_trainer

STEPS = 30
PROMPTS = 8  # the same 8 training images all along: 15 passes
HELD_OUT = 64  # test images, every one answered by both models


def cpu_params() -> dict:
    raw = load_params()
    raw["profile"] = "cpu"
    return raw


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
    train = dataclasses.replace(config.train, **{"max_steps": STEPS, "save_steps": 10_000, "logging_steps": 1,
                                                 "eval_steps": 0, **changes})
    return dataclasses.replace(config, train=train)


def train(config, rows, base, output_dir):
    model, processor = lora_model(base, config)
    vision_calls = []
    model.get_base_model().model.visual.register_forward_hook(lambda *args: vision_calls.append(1))
    funcs, weights = reward_functions(config.train.rewards)
    trainer = build_trainer(config, model, processor, rows, funcs, weights, output_dir)
    trainer.train()
    history = {name: [e[f"rewards/{name}/mean"] for e in trainer.state.log_history if f"rewards/{name}/mean" in e]
               for name in config.train.rewards}
    return model, processor, history, len(vision_calls)


def sampled_rewards(model, processor, rows, samples: int, seed: int = 0) -> dict[str, float]:
    """Each reward's mean over `samples` answers per row, sampled at temperature 1.0 with a fixed seed:
    the policy's expected reward on those prompts, measured with far less noise than one step's."""
    rows = [row for row in rows for _ in range(samples)]
    texts = []
    torch.manual_seed(seed)
    for begin in range(0, len(rows), 16):
        ids = generate(model, processor, rows[begin:begin + 16], 40, do_sample=True, temperature=1.0)
        texts += processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    answers = [row["answer"] for row in rows]
    return {name: sum(REWARDS[name](texts, answer=answers)) / len(texts)
            for name in ("correctness_tags", "format_tags")}


def test_grpo_with_the_product_rewards_raises_them(cpu_run, tmp_path):
    config = learning_config(temperature=1.0)
    assert config.train.loss_type == "dr_grpo" and config.train.importance_sampling_level == "sequence"
    assert set(config.train.rewards) == {"correctness_tags", "format_tags"}
    data = load_dataset(cpu_run / "shapes")
    prompts = data["train"].select(range(PROMPTS))
    model, processor, history, vision_calls = train(config, prompts, cpu_run / "base", tmp_path / "ckpt")
    assert len(history["format_tags"]) == STEPS
    assert vision_calls >= STEPS  # every step's rollouts and log-probs went through the vision tower

    model.eval()
    held_out = [data["test"][i] for i in range(HELD_OUT)]
    trained = sampled_rewards(model, processor, list(prompts), samples=16)
    trained_held_out = sampled_rewards(model, processor, held_out, samples=2)
    trained_greedy = greedy_accuracy(model, processor, held_out, HELD_OUT, max_new_tokens=40)
    with model.disable_adapter():
        untrained = sampled_rewards(model, processor, list(prompts), samples=16)
        untrained_held_out = sampled_rewards(model, processor, held_out, samples=2)
        untrained_greedy = greedy_accuracy(model, processor, held_out, HELD_OUT, max_new_tokens=40)
    for name in untrained:
        print(f"{name}: training prompts {untrained[name]:.3f} -> {trained[name]:.3f}; held-out "
              f"{untrained_held_out[name]:.3f} -> {trained_held_out[name]:.3f}")
    print(f"held-out greedy accuracy {untrained_greedy['accuracy']:.3f} -> {trained_greedy['accuracy']:.3f}")
    print("reward per step: " + "; ".join(f"{name} " + " ".join(f"{v:.2f}" for v in values)
                                         for name, values in history.items()))
    total = {name: sum(values.values()) for name, values in (("trained", trained), ("untrained", untrained))}
    assert total["trained"] >= total["untrained"] + 0.1  # measured +0.24 (1 thread); frozen weights give 0 exactly
    assert trained["correctness_tags"] > untrained["correctness_tags"]


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
