"""The train stage: GRPOConfig from params, LoRA on text and vision, vision learning rate, backends,
outputs, resume, and bad input that fails before any model loads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import ROOT, load_params, lora_model, profile_params, stage, tiny_config, tiny_params, write_params

from vgrpo import backends, models
from vgrpo.base import base_model_path
from vgrpo.config import ConfigError, config_from_dict

# --- GRPOConfig from params -------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["full", "book", "tiny", "cpu"])
def test_grpo_config_carries_every_recipe_knob(profile, tmp_path):
    from vgrpo.training import grpo_config

    train = config_from_dict(profile_params(profile)).train
    args = grpo_config(train, tmp_path, "float32", cuda=False)
    same_name = ["learning_rate", "adam_beta1", "adam_beta2", "weight_decay", "lr_scheduler_type",
                 "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                 "max_completion_length", "temperature", "top_p", "top_k", "beta", "loss_type",
                 "importance_sampling_level", "top_entropy_quantile",
                 "scale_rewards", "num_train_epochs", "max_steps", "save_steps", "max_grad_norm", "logging_steps",
                 "seed", "vllm_server_base_url", "vllm_server_timeout"]
    for name in same_name:
        got = getattr(args, name)
        got = got.value if hasattr(got, "value") else got  # enums (scheduler)
        assert got == getattr(train, name), name
    assert args.optim.value == train.optim if hasattr(args.optim, "value") else args.optim == train.optim
    assert args.warmup_steps == train.warmup_ratio
    # CPU-safe settings: no mixed precision, no gradient checkpointing, the CPU device.
    assert (args.use_cpu, args.bf16, args.fp16, args.gradient_checkpointing) == (True, False, False, False)


def test_report_to_reaches_the_trainer_and_nothing_by_default(tmp_path):
    """`train.report_to` is the trainer's own `report_to` (its W&B, Trackio or TensorBoard callback);
    empty, only DVCLive (our LiveCurves) logs, as every profile has it."""
    from vgrpo.training import grpo_config

    assert grpo_config(tiny_config(report_to=["tensorboard"]).train, tmp_path, "float32", cuda=False).report_to == [
        "tensorboard"]
    assert grpo_config(tiny_config().train, tmp_path, "float32", cuda=False).report_to == []
    with pytest.raises(ConfigError, match=r"^params.yaml: train.report_to\[0\]: expected one of wandb, trackio, "
                                          r"tensorboard, got 'mlflow'$"):
        config_from_dict(tiny_params(train={"report_to": ["mlflow"]}))


def test_rollout_top_k_reaches_trl(tmp_path):
    """Every profile keeps TRL's default (0: whole vocabulary), so the test above cannot tell a knob that
    is passed from one that is dropped: set it."""
    from vgrpo.training import grpo_config

    assert grpo_config(tiny_config(top_k=50).train, tmp_path, "float32", cuda=False).top_k == 50


def test_top_entropy_quantile_reaches_trl_at_the_token_level_only(tmp_path):
    """Every profile keeps 1 (every token), so the test above cannot tell a passed knob from a dropped one: set it.
    At the sequence level TRL's entropy mask would only rescale each answer's loss: refused in one line."""
    from vgrpo.training import grpo_config

    train = tiny_config(top_entropy_quantile=0.2, importance_sampling_level="token").train
    assert grpo_config(train, tmp_path, "float32", cuda=False).top_entropy_quantile == 0.2
    with pytest.raises(ConfigError, match=r"^params.yaml: train.top_entropy_quantile: needs "
                                          r"train.importance_sampling_level: token \(at the sequence level"):
        config_from_dict(tiny_params(train={"top_entropy_quantile": 0.2, "importance_sampling_level": "sequence"}))
    with pytest.raises(ConfigError, match=r"^params.yaml: train.top_entropy_quantile: "):
        config_from_dict(tiny_params(train={"top_entropy_quantile": 1.5}))


def test_recipes_from_the_seeds():
    raw = load_params()
    full = config_from_dict(raw).train
    assert (full.learning_rate, full.adam_beta1, full.adam_beta2, full.weight_decay) == (5e-6, 0.9, 0.99, 0.1)
    assert (full.optim, full.lr_scheduler_type, full.warmup_ratio, full.num_generations) == (
        "adamw_8bit", "cosine", 0.1, 2)
    assert (full.max_prompt_length, full.max_completion_length, full.num_train_epochs, full.save_steps) == (
        1024, 1024, 0.5, 60)
    assert (full.max_grad_norm, full.loss_type, full.importance_sampling_level) == (0.1, "dr_grpo", "sequence")
    assert (full.lora_r, full.lora_alpha, full.lora_dropout, full.vision_lr_scale) == (16, 16, 0.0, 0.1)
    book = config_from_dict(profile_params("book")).train
    assert (book.learning_rate, book.num_generations, book.temperature, book.max_completion_length, book.beta) == (
        1e-6, 4, 0.8, 128, 0.05)


def test_book_profile_is_the_books_recipe(tmp_path):
    """The book: +1.0 right last number, +0.5 names the asked shape, +0.2 reasoning phrase (no tag
    penalty), 8 prompts x 4 completions per step, lr 1e-6, temperature 0.8, 128 new tokens, KL 0.05,
    grad clip 1.0, std-normalised group advantages, 3 epochs."""
    from vgrpo.rewards import reward_functions
    from vgrpo.training import grpo_config

    book = config_from_dict(profile_params("book"))
    train = book.train
    assert {name: weight for name, weight in train.rewards.items() if weight} == {  # the tag rewards are off
        "correctness_free": 1.0, "description": 1.0, "reasoning": 1.0}
    answer = {"answer": ["3"], "target_shape": ["circles"], "target_colour": ["blue"]}
    best = "I see blue circles, so the count is 3"
    funcs, weights = reward_functions(train.rewards)  # what GRPO gets: the tag rewards' weight 0 turns them off
    assert [f([best], **answer)[0] * weight for f, weight in zip(funcs, weights, strict=True)] == [1.0, 0.5, 0.2]
    args = grpo_config(train, tmp_path, "bfloat16", cuda=False)
    prompts_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps // args.num_generations
    assert (prompts_per_step, args.num_generations, args.generation_batch_size) == (8, 4, 32)
    assert (args.learning_rate, args.temperature, args.max_completion_length, args.beta) == (1e-6, 0.8, 128, 0.05)
    assert (args.max_grad_norm, args.num_train_epochs, args.scale_rewards, args.loss_type) == (1.0, 3.0, "group",
                                                                                              "grpo")
    assert args.importance_sampling_level == "token" and book.train.vision_lr_scale == 0.1
    assert book.model == config_from_dict(load_params()).model  # the same 8B, same revision


# --- LoRA on both towers, and the vision learning rate ----------------------------------------

@pytest.fixture(scope="module")
def lora(tiny_base):
    return lora_model(tiny_base)[0]


def lora_modules(model) -> set[str]:
    return {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A" in name}


def test_lora_covers_text_and_vision_attention_and_mlp(lora):
    names = lora_modules(lora)
    for part in ["language_model.layers.0.self_attn.q_proj", "language_model.layers.1.mlp.down_proj",
                 "visual.blocks.0.attn.qkv", "visual.blocks.1.mlp.linear_fc2", "visual.merger.linear_fc1"]:
        assert any(name.endswith(part) for name in names), part
    assert not any("lm_head" in name or "embed_tokens" in name for name in names)
    trainable = models.trainable_summary(lora)
    assert trainable["language"] > 0 and trainable["vision"] > 0


@pytest.mark.parametrize("switch, absent", [("finetune_vision_layers", "visual."),
                                            ("finetune_language_layers", "language_model."),
                                            ("finetune_mlp_modules", ".mlp."),
                                            ("finetune_attention_modules", "attn")])
def test_lora_switches(switch, absent, tiny_base):
    model, _ = lora_model(tiny_base, tiny_config(**{switch: False}))
    names = lora_modules(model)
    assert names and not any(absent in name for name in names)


def test_all_switches_off_is_a_config_error():
    train = tiny_config(finetune_vision_layers=False, finetune_language_layers=False).train
    with pytest.raises(ConfigError, match="LoRA has nothing to adapt"):
        models.lora_target_modules(train)


def test_vision_lora_gets_its_own_learning_rate(lora, tiny_base, tiny_dataset, tmp_path):
    from vgrpo.rewards import reward_functions
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    config = tiny_config(vision_lr_scale=0.1, learning_rate=1e-4)
    dataset = load_dataset(tiny_dataset)["train"]
    processor = models.load_processor(base_model_path(tiny_base), config.model)
    trainer = build_trainer(config, lora, processor, dataset, *reward_functions(config.train.rewards),
                            tmp_path / "ckpt")
    optimizer = trainer.create_optimizer()
    rates = {(group["name"], group["weight_decay"] > 0): group["lr"] for group in optimizer.param_groups}
    assert rates[("language", True)] == pytest.approx(1e-4)
    assert rates[("vision", True)] == pytest.approx(1e-5)
    vision_ids = {id(p) for n, p in lora.named_parameters() if p.requires_grad and models.is_vision_parameter(n)}
    for group in optimizer.param_groups:
        assert all((id(p) in vision_ids) == (group["name"] == "vision") for p in group["params"])
    covered = sum(len(group["params"]) for group in optimizer.param_groups)
    assert covered == sum(p.requires_grad for p in lora.parameters())


def test_positive_advantages_are_weighed_and_negative_ones_kept():
    import torch

    from vgrpo.training import weigh_positive_advantages

    advantages = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.5, -1.5])
    assert weigh_positive_advantages(advantages, 0.1).tolist() == pytest.approx(
        [0.15, -0.5, -0.5, -0.5, 0.0, 0.0, 0.05, -1.5])
    assert torch.equal(weigh_positive_advantages(advantages, 1.0), advantages)


def length_reward(completions, **kwargs) -> list[float]:
    """The answer's length: every group has reward spread, so advantages of both signs."""
    return [float(len(str(c))) for c in completions]


def trainable_weights(model) -> dict:
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def trainer_and_first_batch(config, tiny_base, tiny_dataset, tmp_path):
    """Our trainer on the tiny base with `length_reward` (every group has reward spread), in train mode, and
    its first batch of prompts."""
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    lora, processor = lora_model(tiny_base, config)  # its own: a trainer with beta > 0 adds a `ref` adapter
    trainer = build_trainer(config, lora, processor, load_dataset(tiny_dataset, ("train",))["train"],
                            [length_reward], [1.0], tmp_path / "ckpt")
    inputs = next(iter(trainer.get_train_dataloader()))
    lora.train()
    return trainer, inputs


def test_the_trainer_weighs_its_own_rollouts_advantages(tiny_base, tiny_dataset, tmp_path):
    """`train.positive_advantage_weight` reaches the loss: the same rollouts (same seed), scored by TRL's
    GRPOTrainer and by ours, differ only where an answer beat its group's mean (`length_reward` gives both
    signs to tell apart)."""
    import torch
    from trl import GRPOTrainer

    trainer, inputs = trainer_and_first_batch(tiny_config(positive_advantage_weight=0.25), tiny_base, tiny_dataset,
                                              tmp_path)
    torch.manual_seed(0)
    plain = GRPOTrainer._generate_and_score_completions(trainer, inputs)["advantages"]
    torch.manual_seed(0)
    weighed = trainer._generate_and_score_completions(inputs)["advantages"]
    assert (plain > 0).any() and (plain < 0).any()
    assert torch.allclose(weighed, torch.where(plain > 0, plain * 0.25, plain))


def test_a_fixed_baseline_gives_groups_without_spread_an_advantage():
    import torch

    from vgrpo.training import fixed_baseline_advantages

    # two groups of four at the cpu profile's rewards: one all wrong (no spread), one mixed
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 3.0, 1.0, -1.0, float("nan")])
    assert fixed_baseline_advantages(rewards, 2.0).tolist() == [-1.0, -1.0, -1.0, -1.0, 1.0, -1.0, -3.0, 0.0]


def test_the_trainer_takes_advantages_against_a_fixed_baseline(tiny_base, tiny_dataset, tmp_path):
    """`train.advantage_baseline` reaches the advantages the loss takes: the same rollouts (same seed) scored by
    TRL's GRPOTrainer (reward minus the group's mean) and by ours (reward minus the baseline) differ by each group's
    mean less the baseline, so within a group the two advantages differ by one constant; the W-REINFORCE weight
    applies on top."""
    import torch
    from trl import GRPOTrainer

    config = tiny_config(advantage_baseline=30.0, positive_advantage_weight=0.5)
    trainer, inputs = trainer_and_first_batch(config, tiny_base, tiny_dataset, tmp_path)
    torch.manual_seed(0)
    plain = GRPOTrainer._generate_and_score_completions(trainer, inputs)["advantages"]
    rewards = trainer.last_rewards.clone()
    assert trainer.advantage_baseline == 30.0  # the knob reached the trainer; a baseline inside the lengths drawn:
    trainer.advantage_baseline = baseline = float(rewards.median())
    torch.manual_seed(0)
    fixed = trainer._generate_and_score_completions(inputs)["advantages"]
    assert torch.equal(trainer.last_rewards, rewards)  # the same rollouts
    expected = rewards - baseline
    assert (expected > 0).any() and (expected < 0).any()
    assert torch.allclose(fixed, torch.where(expected > 0, expected * 0.5, expected))
    group_means = rewards.view(-1, config.train.num_generations).mean(-1, keepdim=True)
    assert torch.allclose(plain.view(-1, config.train.num_generations), rewards.view(-1, config.train.num_generations)
                          - group_means)


def test_the_advantage_knobs_change_what_one_step_learns(tiny_base, tiny_dataset, tmp_path):
    """The knobs' effect, not only their tensors: one real step from the same start and seed leaves the same
    adapters twice at weight 1 (so a difference is a knob's, not noise), other adapters at 0.25, and others
    again against a fixed baseline of 0 (every length pulled up, none pushed down)."""
    import torch

    from vgrpo.sampling import inverse_cdf_sampling
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    rows = load_dataset(tiny_dataset, ("train",))["train"]

    def adapters_after_one_step(weight: float, run: str, baseline: float | None = None) -> dict:
        config = tiny_config(positive_advantage_weight=weight, advantage_baseline=baseline, max_steps=1,
                             save_steps=10, eval_steps=0)
        model, processor = lora_model(tiny_base, config)
        start = trainable_weights(model)
        trainer = build_trainer(config, model, processor, rows, [length_reward], [1.0], tmp_path / run)
        with inverse_cdf_sampling():
            trainer.train()
        after = trainable_weights(model)
        assert any(not torch.equal(start[n], after[n]) for n in start), f"weight {weight}: the step moved nothing"
        return after

    full, full_again, weighed = (adapters_after_one_step(1.0, "a"), adapters_after_one_step(1.0, "b"),
                                 adapters_after_one_step(0.25, "c"))
    against_zero = adapters_after_one_step(1.0, "d", baseline=0.0)
    assert all(torch.equal(full[n], full_again[n]) for n in full)
    assert any(not torch.equal(full[n], weighed[n]) for n in full)
    assert any(not torch.equal(full[n], against_zero[n]) for n in full)


@pytest.mark.slow  # four real GRPO steps (about half a minute): the suite runs it, the fast tier leaves it out
def test_the_entropy_mask_changes_what_one_step_learns(tiny_base, tiny_dataset, tmp_path):
    """`train.top_entropy_quantile` reaches TRL's loss: one real step at the token level from the same start and
    seed leaves the same adapters twice with every token kept and other adapters with the top fifth by entropy.
    With every token kept the token level is the sequence level on-policy (the ratio is 1, so each token's
    gradient is the same): the cpu screen at the token level changes the mask only."""
    import torch

    from vgrpo.sampling import inverse_cdf_sampling
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    rows = load_dataset(tiny_dataset, ("train",))["train"]

    def adapters_after_one_step(quantile: float, level: str, run: str) -> dict:
        config = tiny_config(top_entropy_quantile=quantile, importance_sampling_level=level, max_steps=1,
                             save_steps=10, eval_steps=0, max_grad_norm=1e9)  # no clipping: compare gradients
        model, processor = lora_model(tiny_base, config)
        trainer = build_trainer(config, model, processor, rows, [length_reward], [1.0], tmp_path / run)
        trainer.optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the gradient itself, not Adam's sign
        start = trainable_weights(model)
        with inverse_cdf_sampling():
            trainer.train()
        after = trainable_weights(model)
        assert any(not torch.equal(start[n], after[n]) for n in start), f"{quantile}, {level}: nothing moved"
        return {n: after[n] - start[n] for n in start}

    every, every_again = adapters_after_one_step(1.0, "token", "a"), adapters_after_one_step(1.0, "token", "b")
    sequence, masked = adapters_after_one_step(1.0, "sequence", "c"), adapters_after_one_step(0.2, "token", "d")
    assert all(torch.equal(every[n], every_again[n]) for n in every)
    assert all(torch.allclose(every[n], sequence[n], rtol=1e-4, atol=1e-7) for n in every)
    assert any(not torch.allclose(every[n], masked[n], rtol=1e-2, atol=1e-6) for n in every)


def test_vision_lr_scale_zero_freezes_the_vision_lora(tiny_base):
    model, _ = lora_model(tiny_base, tiny_config(vision_lr_scale=0.0))
    assert models.trainable_summary(model)["vision"] == 0
    groups = models.optimizer_groups(model, 1e-4, 0.1, 0.0)
    assert {group["name"] for group in groups} == {"language"}


# --- Backends ---------------------------------------------------------------------------------

def test_auto_backend_is_hf_without_cuda_and_never_imports_unsloth():
    code = ("import sys; from vgrpo.backends import resolve_backend; "
            "print(resolve_backend('auto'), 'unsloth' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["hf", "False"]


def test_auto_backend_with_cuda_picks_unsloth_only_when_it_imports(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    assert backends.resolve_backend("auto", cuda=True) == "unsloth"
    monkeypatch.setitem(sys.modules, "unsloth", None)  # `import unsloth` now raises ImportError
    assert backends.resolve_backend("auto", cuda=True) == "hf"
    assert backends.resolve_backend("hf", cuda=True) == "hf"


def test_unsloths_compiled_cache_goes_beside_the_local_builds_not_into_the_clone(monkeypatch, tmp_path):
    """Unsloth reads UNSLOTH_COMPILE_LOCATION when imported (default ./unsloth_compiled_cache, the clone);
    a user's own choice wins."""
    from vgrpo.vendor import cache_dir

    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    monkeypatch.delenv("UNSLOTH_COMPILE_LOCATION", raising=False)
    backends.resolve_backend("auto", cuda=True)
    assert os.environ["UNSLOTH_COMPILE_LOCATION"] == str(cache_dir() / "unsloth_compiled_cache")
    monkeypatch.setenv("UNSLOTH_COMPILE_LOCATION", str(tmp_path))
    backends.import_unsloth()
    assert os.environ["UNSLOTH_COMPILE_LOCATION"] == str(tmp_path)


class FakeFastVisionModel:
    """Unsloth needs CUDA, so this stands in for `unsloth.FastVisionModel` and records what our code
    passes. It does what the real one does with those arguments, with plain transformers + PEFT: a
    string `target_modules` is used as given (unsloth 2026.10.9, vision.py), so the LoRA it builds is
    the one Unsloth would build from our list. The GPU check runs the real one."""

    calls: dict = {}

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        cls.calls["from_pretrained"] = (path, kwargs)
        config = tiny_config()
        return models.load_model(path, "float32"), models.load_processor(path, config.model)

    @classmethod
    def get_peft_model(cls, model, target_modules, r, lora_alpha, lora_dropout, bias, random_state, **kwargs):
        import torch
        from peft import LoraConfig, get_peft_model

        cls.calls["get_peft_model"] = dict(target_modules=target_modules, r=r, lora_alpha=lora_alpha,
                                           lora_dropout=lora_dropout, bias=bias, random_state=random_state, **kwargs)
        torch.manual_seed(random_state)
        return get_peft_model(model, LoraConfig(r=r, lora_alpha=lora_alpha, lora_dropout=lora_dropout, bias=bias,
                                                target_modules=target_modules))


def test_unsloth_backend_gets_the_recipe_and_the_same_lora_modules(monkeypatch, tiny_base):
    FakeFastVisionModel.calls = {}
    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastVisionModel=FakeFastVisionModel))
    config = tiny_config(gradient_checkpointing=True, load_in_4bit=False, lora_r=8, lora_alpha=16, seed=5)
    path = base_model_path(tiny_base)
    unsloth_model, processor = models.load_for_training(path, config.model, config.train, "unsloth", "float16")
    hf_model, _ = models.load_for_training(path, config.model, config.train, "hf", "float32")

    path_given, kwargs = FakeFastVisionModel.calls["from_pretrained"]
    assert path_given == path
    assert kwargs == {"load_in_4bit": False, "use_gradient_checkpointing": "unsloth", "dtype": models.DTYPES["float16"]}
    assert FakeFastVisionModel.calls["get_peft_model"] == {
        "target_modules": models.lora_target_modules(config.train), "r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
        "bias": "none", "random_state": 5, "use_gradient_checkpointing": "unsloth"}
    # One list of adapted modules for both backends, the vision merger and deepstack mergers included
    # (Unsloth's own target builder leaves those out).
    assert lora_modules(unsloth_model) == lora_modules(hf_model)
    assert any(".visual.merger." in name for name in lora_modules(hf_model))
    assert any(".visual.deepstack_merger_list." in name for name in lora_modules(hf_model))
    assert processor.tokenizer.padding_side == "left"


def test_both_backends_get_one_grpo_objective(monkeypatch, tmp_path):
    """Unsloth's GRPOConfig rewrites scale_rewards "group" to "none" under dr_grpo; the config our code
    hands to the trainer keeps what params say, so both backends optimise the same loss."""
    import trl

    from vgrpo.training import OBJECTIVE, grpo_config

    class UnslothLikeGRPOConfig(trl.GRPOConfig):  # what unsloth's patched config does in __init__
        def __init__(self, *args, **kwargs):
            if kwargs.get("loss_type") == "dr_grpo" and kwargs.get("scale_rewards") == "group":
                kwargs["scale_rewards"] = "none"
            super().__init__(*args, **kwargs)

    train = tiny_config(loss_type="dr_grpo", scale_rewards="group").train
    plain = grpo_config(train, tmp_path / "a", "float32", cuda=False)
    monkeypatch.setattr("vgrpo.training.GRPOConfig", UnslothLikeGRPOConfig)
    patched = grpo_config(train, tmp_path / "b", "float32", cuda=False)
    assert UnslothLikeGRPOConfig(output_dir=str(tmp_path / "c"), loss_type="dr_grpo", scale_rewards="group",
                                 use_cpu=True).scale_rewards == "none"  # the rewrite is real in the stand-in
    for name in OBJECTIVE:
        assert getattr(plain, name) == getattr(patched, name) == getattr(train, name), name
    ignore = {"output_dir", "logging_dir"}
    assert {k: v for k, v in plain.to_dict().items() if k not in ignore} == {
        k: v for k, v in patched.to_dict().items() if k not in ignore}


def test_full_profile_follows_what_the_seed_article_ran_under_unsloth():
    full = config_from_dict(load_params()).train
    assert (full.loss_type, full.scale_rewards, full.importance_sampling_level) == ("dr_grpo", "none", "sequence")


# --- Precision from the hardware ----------------------------------------------------------------

T4 = ("Tesla T4", (7, 5), False)
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0), True)


@pytest.mark.parametrize("device, requested, expected", [
    ("cpu", "auto", "float32"), ("cpu", "bfloat16", "bfloat16"), ("cpu", "float16", "error"),
    ("sm75", "auto", "float16"), ("sm75", "bfloat16", "error"), ("sm75", "float16", "float16"),
    ("sm80", "auto", "bfloat16"), ("sm80", "bfloat16", "bfloat16"), ("sm80", "float16", "float16"),
])
def test_precision_decision_table(device, requested, expected, tmp_path):
    from vgrpo.devices import CPU, Device, resolve_dtype
    from vgrpo.training import grpo_config

    hardware = {"cpu": CPU, "sm75": Device("cuda", *T4), "sm80": Device("cuda", *A100)}[device]
    if expected == "error":
        with pytest.raises(ConfigError) as err:
            resolve_dtype(requested, hardware)
        assert str(err.value).startswith(f"params.yaml: model.dtype: {requested} ")
        assert "\n" not in str(err.value)
        return
    dtype = resolve_dtype(requested, hardware)
    assert dtype == expected
    # The trainer's mixed precision always agrees with the dtype the model was loaded in.
    args = grpo_config(tiny_config().train, tmp_path, dtype, cuda=False)
    assert (args.bf16, args.fp16) == (dtype == "bfloat16", dtype == "float16")


def test_t4_is_told_why_bf16_is_refused():
    from vgrpo.devices import Device, resolve_dtype

    with pytest.raises(ConfigError, match=r"bfloat16 is not native on Tesla T4 \(compute capability 7.5; bf16 needs "
                                          r"8.0 or newer\) \(use auto or float16\)"):
        resolve_dtype("bfloat16", Device("cuda", *T4))


def test_the_full_profile_picks_its_dtype_from_the_hardware():
    assert config_from_dict(load_params()).model.dtype == "auto"


# --- 4-bit ---------------------------------------------------------------------------------------

def test_4bit_loads_quantize_the_decoder_and_leave_the_vision_tower_and_output_layer_alone(tiny_base):
    """A real NF4 load (bitsandbytes' CPU backend), as train, evaluate and smoke load: every decoder linear
    layer is 4-bit, none under the vision tower (transformers 5 matches skip patterns as prefixes, so
    "visual" alone quantized 12 of the tiny model's 26 layers there), lm_head neither; the forward is finite."""
    import torch

    quantized = models.load_model(base_model_path(tiny_base), "float32", load_in_4bit=True)
    names = models.quantized_modules(quantized)
    decoder = [n for n, m in models.load_model(base_model_path(tiny_base), "float32").named_modules()
               if isinstance(m, torch.nn.Linear) and ".language_model." in n]
    assert sorted(names) == sorted(decoder) and len(names) == 14  # 2 layers x (4 attention + 3 MLP)
    assert not [n for n in names if ".visual." in n or n == "lm_head"]
    assert models.is_quantized(quantized)
    quantization = quantized.config.quantization_config
    assert quantization.bnb_4bit_quant_type == "nf4" and quantization.bnb_4bit_use_double_quant
    assert quantized.model.visual.blocks[0].attn.qkv.weight.dtype == torch.float32
    inputs = torch.tensor([[1, 2, 3]])
    assert torch.isfinite(quantized(input_ids=inputs).logits).all()


def test_4bit_layers_still_pass_gradients_after_an_inference_forward(tiny_base, tiny_dataset):
    """bitsandbytes' CPU backend repacks 4-bit weights for an inference kernel without a backward at the
    first eval-mode forward without gradients (on CPUs with AVX512-BF16, as this project's); the train stage
    runs one (its finiteness check), and GRPO's held-out evaluations run more. After it, the vision tower's
    LoRA must still get a gradient through the 4-bit decoder."""
    import torch

    from vgrpo.generation import batch_inputs, next_token_logits
    from vgrpo.shapes import load_dataset

    rows = load_dataset(tiny_dataset, ("train",))["train"]
    config = tiny_config(load_in_4bit=True)
    model, processor = models.load_for_training(base_model_path(tiny_base), config.model, config.train, "hf",
                                                "float32")
    with torch.no_grad():  # LoRA B starts at 0, so A's gradient would be 0 anyway: give B a value
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)
    vision_a = [p for n, p in model.named_parameters() if models.is_vision_parameter(n) and "lora_A" in n]

    def vision_gradient() -> float:
        model.zero_grad()
        model(**batch_inputs(processor, [rows[1]], "cpu")).logits[0, -1].logsumexp(-1).backward()
        return max(p.grad.abs().max().item() for p in vision_a)

    before = vision_gradient()
    next_token_logits(model.eval(), processor, rows[0])  # the inference forward that repacked the weights
    model.train()
    assert before > 0 and vision_gradient() == pytest.approx(before, rel=1e-4)


def test_4bit_trainer_keeps_lora_weights_in_float32_under_fp16(tiny_base, tiny_dataset, tmp_path):
    """TRL 1.14 casts a quantized model's trainable parameters to bfloat16; with fp16=True a GPU's GradScaler
    cannot unscale bfloat16 gradients, and the first step stops. The trainer must end up holding float32
    LoRA weights, in the model and in its optimizer. (A CPU has no GradScaler to fail: the dtypes are the test.)"""
    import torch

    from vgrpo.rewards import reward_functions
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer, grpo_config

    config = tiny_config(load_in_4bit=True)
    model, processor = models.load_for_training(base_model_path(tiny_base), config.model, config.train, "hf",
                                                "float32")
    args = grpo_config(config.train, tmp_path / "checkpoints", "float32", cuda=False)
    args.fp16 = True  # what a T4 runs (grpo_config sets it from the dtype; a CPU cannot load float16)
    reward_funcs, weights = reward_functions(config.train.rewards)
    trainer = build_trainer(config, model, processor, load_dataset(tiny_dataset, ("train",))["train"], reward_funcs,
                            weights, args=args)
    trainable = [p for p in trainer.model.parameters() if p.requires_grad]
    assert trainable and {p.dtype for p in trainable} == {torch.float32}
    optimizer = trainer.create_optimizer()
    assert {p.dtype for group in optimizer.param_groups for p in group["params"]} == {torch.float32}
    # Without the fix TRL's cast stands: prove the test can see it
    for parameter in trainable:
        parameter.data = parameter.data.to(torch.bfloat16)
    assert models.keep_trainable_in_float32(trainer.model) == len(trainable)


def test_8bit_adam_and_4bit_train_on_a_cpu(tiny_dataset, tiny_base, tmp_path):
    """bitsandbytes' CPU backend: the train stage runs the 8B recipe's optimizer on 4-bit weights, and the
    adapter (float32) moves in both towers."""
    raw = tiny_params(train={"load_in_4bit": True, "optim": "adamw_8bit", "max_steps": 2})
    params = write_params(tmp_path / "params.yaml", raw)
    result = stage("train", "--params", str(params), "--data", str(tiny_dataset), "--base", str(tiny_base),
                   "--adapter", str(tmp_path / "adapter"), "--checkpoints", str(tmp_path / "checkpoints"),
                   "--reports", str(tmp_path / "reports"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "float32 4-bit" in result.stdout
    summary = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert summary["load_in_4bit"] is True and summary["steps"] == 2
    towers = summary["adapter_max_lora_b_by_tower"]
    assert towers["language"] > 0 and towers["vision"] > 0 and summary["adapter_max_lora_b"] == max(towers.values())
    assert 0 <= summary["zero_spread_groups"] <= 1


# --- Bad input: one line, exit 2, before any model loads ---------------------------------------

BAD_TRAIN = [
    ("unsloth on a CPU", {"backend": "unsloth"}, "error: params.yaml: train.backend: unsloth needs a CUDA GPU"),
    ("vLLM on a CPU", {"use_vllm": True, "finetune_vision_layers": False},
     "error: params.yaml: train.use_vllm: vLLM needs a CUDA GPU"),
    ("unknown reward", {"rewards": {"vibes": 1.0}},
     "error: params.yaml: train.rewards.vibes: unknown reward (expected one of correctness_tags, correctness_partial, "
     "format_tags, correctness_free, description, reasoning, counts_described, answer_follows_reasoning)"),
    ("group size", {"num_generations": 3},
     "error: params.yaml: train.num_generations: 3 does not divide the generation batch 4"),
    ("a logger that is not installed", {"report_to": ["wandb"]},
     "error: params.yaml: train.report_to: wandb is not installed (pip install wandb in the venv), or remove it from "
     "train.report_to"),
]


@pytest.mark.parametrize("what, changes, message", BAD_TRAIN, ids=[b[0] for b in BAD_TRAIN])
def test_bad_train_params_fail_before_loading_a_model(what, changes, message, tiny_dataset, tiny_base, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train=changes))
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset, tiny_base))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(message)
    assert "Loading weights" not in result.stderr
    assert not (tmp_path / "adapter").exists()


def test_missing_base_says_which_stage_makes_it(tiny_dataset, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params())
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset, tmp_path / "nobase"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'nobase' / 'source.json'}: no base model recorded here (run the base stage: "
        "dvc repro base)")


def test_warmup_ratio_must_be_a_ratio():
    with pytest.raises(ConfigError, match=r"^params.yaml: train.warmup_ratio: expected a number >= 0 and "
                                          r"< 1, got 1.0$"):
        config_from_dict(tiny_params(train={"warmup_ratio": 1.0}))


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_missing_or_malformed_dataset(damage, tiny_dataset, tiny_base, tmp_path):
    import shutil

    data = tmp_path / "shapes"
    if damage == "malformed":
        shutil.copytree(tiny_dataset, data)
        for arrow in data.glob("train/*.arrow"):
            arrow.write_bytes(b"not arrow")
    params = write_params(tmp_path / "params.yaml", tiny_params())
    result = stage("train", "--params", str(params), "--data", str(data), "--base", str(tiny_base), "--adapter",
                   str(tmp_path / "a"))
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    expected = "no dataset here (run the generate stage" if damage == "missing" else "cannot read the dataset"
    assert last.startswith(f"error: {data}: ") and expected in last, last
    assert "Loading weights" not in result.stderr


def test_prompt_longer_than_max_prompt_length(tiny_dataset, tiny_base, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"max_prompt_length": 40}))
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset, tiny_base))
    assert result.returncode == 2
    assert "train.max_prompt_length: 40 is shorter than the longest prompt" in result.stderr


# --- A real run: outputs, curves, resume ------------------------------------------------------

def train_args(tmp_path: Path, data: Path, base: Path) -> list[str]:
    return ["--data", str(data), "--base", str(base), "--adapter", str(tmp_path / "adapter"), "--checkpoints",
            str(tmp_path / "ckpt"), "--reports", str(tmp_path / "reports")]


@pytest.mark.slow
def test_train_stage_writes_adapter_curves_and_metrics(tiny_dataset, tiny_base, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"max_steps": 4, "save_steps": 2}))
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset, tiny_base))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: backend hf (asked: hf, CUDA: False)" in result.stdout

    adapter = tmp_path / "adapter"
    files = {p.name for p in adapter.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "processor_config.json", "tokenizer.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)
    # beta > 0 on the hf backend makes TRL add a frozen "ref" adapter; only the trained one is written.
    assert tiny_config().train.beta > 0 and not any(p.is_dir() for p in adapter.iterdir())
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        assert not any(".ref." in key for key in f.keys())
    # save_total_limit 1: only the last checkpoint is kept, enough to resume from
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-4"]

    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["backend"] == "hf" and metrics["steps"] == 4
    assert metrics["answers_sampled_hotter"] is None  # train.answer_temperature is off
    assert metrics["unsolved_groups_revisited"] is None  # train.revisit_unsolved is off
    # every rollout token was drawn by the inverse-CDF sampler (vgrpo/sampling.py): one call per new token
    # of each step's generate (one call per step here), none by torch's multinomial
    max_new_tokens = tiny_config().train.max_completion_length
    assert 4 <= metrics["rollout_sampling_calls"]["inverse_cdf"] <= 4 * max_new_tokens
    assert metrics["rollout_sampling_calls"]["torch"] == 0
    assert metrics["rollout_sampler"] == "inverse_cdf"
    curves = tmp_path / "reports" / "plots" / "metrics" / "train"
    for curve in ["reward.tsv", "rewards/correctness_tags/mean.tsv", "rewards/format_tags/mean.tsv", "kl.tsv",
                  "completions/mean_length.tsv", "loss.tsv", "learning_rate.tsv"]:
        rows = (curves / curve).read_text().splitlines()
        assert rows[0].startswith("step\t") and [r.split("\t")[0] for r in rows[1:]] == ["1", "2", "3", "4"], curve


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(tiny_dataset, tiny_base, tmp_path):
    raw = tiny_params(train={"max_steps": 6, "save_steps": 2})
    params = write_params(tmp_path / "params.yaml", raw)
    command = [sys.executable, str(ROOT / "stages" / "train.py"), "--params", str(params),
               *train_args(tmp_path, tiny_dataset, tiny_base)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first_checkpoint = tmp_path / "ckpt" / "checkpoint-2" / "trainer_state.json"
    deadline = time.time() + 300
    while not first_checkpoint.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert first_checkpoint.exists()
    assert not (tmp_path / "adapter").exists()  # killed before the end: no adapter
    done = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "ckpt").glob("checkpoint-*"))
    assert done and max(done) < 6

    raw["train"]["resume"] = True
    write_params(params, raw)
    nothing = stage("train", "--params", str(params), *train_args(tmp_path / "elsewhere", tiny_dataset, tiny_base))
    assert nothing.returncode == 0, nothing.stderr[-3000:]
    assert (f"train: train.resume is true but {tmp_path / 'elsewhere' / 'ckpt'} holds no checkpoint: training from "
            "scratch") in nothing.stdout
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset, tiny_base))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["steps"] == 6
    assert metrics["resumed_from"] == f"checkpoint-{max(done)}"
    steps = [row.split("\t")[0] for row in
             (tmp_path / "reports/plots/metrics/train/reward.tsv").read_text().splitlines()[1:]]
    assert steps == [str(i) for i in range(1, 7)]  # one row per step: no gap, no repeat
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()


class CountingProcessor:
    """A logits processor that leaves the scores as they are and counts the generation steps it saw."""

    def __init__(self):
        self.steps = 0

    def __call__(self, input_ids, scores):
        self.steps += 1
        return scores


def test_the_trainers_rollouts_run_its_logits_processors_and_generate_is_restored(tiny_base, tiny_dataset, tmp_path):
    """`train.answer_temperature` gives the trainer its processor, and TRL's rollouts run what it holds."""
    from vgrpo.answer_sampling import AnswerTemperature

    trainer, inputs = trainer_and_first_batch(tiny_config(answer_temperature=1.4), tiny_base, tiny_dataset, tmp_path)
    assert [type(p) for p in trainer.logits_processors] == [AnswerTemperature]  # build_trainer reads the knob
    (hotter,) = trainer.logits_processors
    batch = trainer._generate_and_score_completions(inputs)
    opening = hotter.opening.tolist()
    reached = sum(ids[i:i + len(opening)].tolist() == opening for ids, mask in
                  zip(batch["completion_ids"], batch["completion_mask"], strict=True)
                  for i in range(int(mask.sum()) - len(opening)))  # an opening with a token after it, unpadded
    assert hotter.answers == reached  # one hotter draw per answer that reached `><SOLUTION>`, on any CPU
    counting = CountingProcessor()
    trainer.logits_processors = [counting]
    trainer._generate_and_score_completions(inputs)
    assert counting.steps > 0  # TRL's generate ran it at every generated token
    assert "generate" not in trainer.model.__dict__  # the model's own generate again
    steps = counting.steps
    trainer.logits_processors = []
    trainer._generate_and_score_completions(inputs)
    assert counting.steps == steps
