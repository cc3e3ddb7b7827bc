"""Proof that the GRPO loop really optimises the policy.

A random tiny model scores 0 on the task rewards everywhere, so GRPO has no signal there. Here the
reward is simple and learnable instead: the share of completion tokens with an id below 20,000
(about 13% of the vocabulary). Prompts carry real images through the vision tower; sampling is at
low temperature so the random model's near-flat logits become a real choice (DESIGN facts). The same
wiring as the train stage (`build_trainer`) is used, only the reward differs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import lora_model, tiny_params

from vgrpo.config import config_from_dict
from vgrpo.prompts import hf_messages
from vgrpo.shapes import load_dataset
from vgrpo.training import build_trainer

LOW_ID_LIMIT = 20_000


def low_token_ids(completions, completion_ids, **kwargs) -> list[float]:
    """Share of completion tokens whose id is below LOW_ID_LIMIT."""
    return [sum(i < LOW_ID_LIMIT for i in ids) / max(1, len(ids)) for ids in completion_ids]


def learning_config(**changes):
    config = config_from_dict(tiny_params())
    knobs = dict(temperature=0.1, max_completion_length=8, num_generations=4, per_device_train_batch_size=8,
                 max_steps=40, save_steps=1000, learning_rate=2.5e-4, beta=0.0, warmup_ratio=0.0,
                 lr_scheduler_type="constant", loss_type="grpo", importance_sampling_level="token")
    train = dataclasses.replace(config.train, **{**knobs, **changes})
    return dataclasses.replace(config, train=train)


@pytest.fixture(scope="module")
def dataset(tiny_dataset):
    return load_dataset(tiny_dataset)


@pytest.fixture(scope="module")
def base(tiny_base):
    return tiny_base


def train(config, dataset, output_dir, base_dir):
    model, processor = lora_model(base_dir, config)
    vision_calls = []
    model.get_base_model().model.visual.register_forward_hook(lambda *args: vision_calls.append(1))
    trainer = build_trainer(config, model, processor, dataset["train"], [low_token_ids], [1.0], output_dir)
    trainer.train()
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return model, processor, rewards, len(vision_calls)


@torch.no_grad()
def held_out_reward(model, processor, rows, max_new_tokens=8) -> float:
    scores = []
    for row in rows:
        inputs = processor.apply_chat_template(hf_messages(row["question"], row["image"]), add_generation_prompt=True,
                                               tokenize=True, return_dict=True, return_tensors="pt")
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        scores += low_token_ids(None, [output[0, inputs["input_ids"].shape[1]:].tolist()])
    return sum(scores) / len(scores)


def test_grpo_learns_a_learnable_reward(dataset, base, tmp_path):
    config = learning_config()
    model, processor, rewards, vision_calls = train(config, dataset, tmp_path / "ckpt", base)
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    print(f"mean reward: first 10 steps {first:.3f}, last 10 steps {last:.3f}")
    assert len(rewards) == 40
    assert vision_calls >= 40  # every step's rollouts and log-probs went through the vision tower
    assert last >= 3 * first and last >= 0.3

    held_out = dataset["val"].select(range(8))
    trained = held_out_reward(model, processor, held_out)
    with model.disable_adapter():
        untrained = held_out_reward(model, processor, held_out)
    print(f"held-out greedy reward: untrained {untrained:.3f}, trained {trained:.3f}")
    assert trained > untrained


def test_same_seed_same_trained_weights(dataset, base, tmp_path):
    """Training is deterministic: same params and seed, same LoRA weights (and they did move)."""
    config = learning_config(max_steps=3)
    runs = []
    for name in ("a", "b"):
        model, _, _, _ = train(config, dataset, tmp_path / name, base)
        runs.append({n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n})
    assert runs[0].keys() == runs[1].keys()
    assert all(torch.equal(runs[0][n], runs[1][n]) for n in runs[0])
    assert any(p.abs().sum() > 0 for p in runs[0].values())  # lora_B starts at zero: it was trained
