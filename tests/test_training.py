"""The train stage: GRPOConfig from params, LoRA on text and vision, vision learning rate, backends,
outputs, resume, and bad input that fails before any model loads."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from conftest import ROOT, load_params, stage, tiny_params, write_params

from vgrpo import backends, models
from vgrpo.config import ConfigError, config_from_dict


def tiny_config(**train_changes):
    config = config_from_dict(tiny_params())
    return dataclasses.replace(config, train=dataclasses.replace(config.train, **train_changes))


# --- GRPOConfig from params -------------------------------------------------------------------

@pytest.mark.parametrize("profile", ["full", "book", "tiny"])
def test_grpo_config_carries_every_recipe_knob(profile, tmp_path):
    from vgrpo.training import grpo_config

    train = config_from_dict({**load_params(), "profile": profile}).train
    args = grpo_config(train, tmp_path, cuda=False)
    same_name = ["learning_rate", "adam_beta1", "adam_beta2", "weight_decay", "lr_scheduler_type",
                 "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
                 "max_completion_length", "temperature", "top_p", "beta", "loss_type", "importance_sampling_level",
                 "num_train_epochs", "max_steps", "save_steps", "max_grad_norm", "logging_steps", "seed"]
    for name in same_name:
        got = getattr(args, name)
        got = got.value if hasattr(got, "value") else got  # enums (scheduler)
        assert got == getattr(train, name), name
    assert args.optim.value == train.optim if hasattr(args.optim, "value") else args.optim == train.optim
    assert args.warmup_steps == train.warmup_ratio
    # CPU-safe settings: no mixed precision, no gradient checkpointing, the CPU device.
    assert (args.use_cpu, args.bf16, args.fp16, args.gradient_checkpointing) == (True, False, False, False)


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
    book = config_from_dict({**raw, "profile": "book"}).train
    assert (book.learning_rate, book.num_generations, book.temperature, book.max_completion_length, book.beta) == (
        1e-6, 4, 0.8, 128, 0.05)


# --- LoRA on both towers, and the vision learning rate ----------------------------------------

@pytest.fixture(scope="module")
def lora_model(tiny_model_dir):
    config = tiny_config()
    model, _ = models.load_for_training(config.model, config.train, "hf")
    return model


def lora_modules(model) -> set[str]:
    return {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A" in name}


def test_lora_covers_text_and_vision_attention_and_mlp(lora_model):
    names = lora_modules(lora_model)
    for part in ["language_model.layers.0.self_attn.q_proj", "language_model.layers.1.mlp.down_proj",
                 "visual.blocks.0.attn.qkv", "visual.blocks.1.mlp.linear_fc2", "visual.merger.linear_fc1"]:
        assert any(name.endswith(part) for name in names), part
    assert not any("lm_head" in name or "embed_tokens" in name for name in names)
    trainable = models.trainable_summary(lora_model)
    assert trainable["language"] > 0 and trainable["vision"] > 0


@pytest.mark.parametrize("switch, absent", [("finetune_vision_layers", "visual."),
                                            ("finetune_language_layers", "language_model."),
                                            ("finetune_mlp_modules", ".mlp."),
                                            ("finetune_attention_modules", "attn")])
def test_lora_switches(switch, absent, tiny_model_dir):
    config = tiny_config(**{switch: False})
    model, _ = models.load_for_training(config.model, config.train, "hf")
    names = lora_modules(model)
    assert names and not any(absent in name for name in names)


def test_all_switches_off_is_a_config_error():
    train = tiny_config(finetune_vision_layers=False, finetune_language_layers=False).train
    with pytest.raises(ConfigError, match="LoRA has nothing to adapt"):
        models.lora_target_modules(train)


def test_vision_lora_gets_its_own_learning_rate(lora_model, tiny_dataset, tmp_path):
    from vgrpo.rewards import reward_functions
    from vgrpo.shapes import load_dataset
    from vgrpo.training import build_trainer

    config = tiny_config(vision_lr_scale=0.1, learning_rate=1e-4)
    dataset = load_dataset(tiny_dataset)["train"]
    processor = models.load_processor(models.base_model_path(config.model), config.model)
    trainer = build_trainer(config, lora_model, processor, dataset, *reward_functions(config.train.rewards),
                            tmp_path / "ckpt")
    optimizer = trainer.create_optimizer()
    rates = {(group["name"], group["weight_decay"] > 0): group["lr"] for group in optimizer.param_groups}
    assert rates[("language", True)] == pytest.approx(1e-4)
    assert rates[("vision", True)] == pytest.approx(1e-5)
    vision_ids = {id(p) for n, p in lora_model.named_parameters() if p.requires_grad and models.is_vision_parameter(n)}
    for group in optimizer.param_groups:
        assert all((id(p) in vision_ids) == (group["name"] == "vision") for p in group["params"])
    covered = sum(len(group["params"]) for group in optimizer.param_groups)
    assert covered == sum(p.requires_grad for p in lora_model.parameters())


def test_vision_lr_scale_zero_freezes_the_vision_lora(tiny_model_dir):
    config = tiny_config(vision_lr_scale=0.0)
    model, _ = models.load_for_training(config.model, config.train, "hf")
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


def test_unsloth_backend_passes_the_recipe_to_fast_vision_model(monkeypatch, tiny_model_dir):
    """Unsloth needs CUDA, so a fake FastVisionModel records what our code passes (the GPU check runs
    the real one). It hands back the hf backend's LoRA model so the rest of the path is real."""
    calls = {}
    config = tiny_config(gradient_checkpointing=True, load_in_4bit=False, lora_r=8, lora_alpha=16, seed=5)

    class FastVisionModel:
        @staticmethod
        def from_pretrained(path, **kwargs):
            calls["from_pretrained"] = (path, kwargs)
            return models.load_model(path, config.model), models.load_processor(path, config.model)

        @staticmethod
        def get_peft_model(model, **kwargs):
            calls["get_peft_model"] = kwargs
            return models._hf_lora(models.base_model_path(config.model), config.model, config.train)[0]

    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastVisionModel=FastVisionModel))
    model, processor = models.load_for_training(config.model, config.train, "unsloth")
    path, kwargs = calls["from_pretrained"]
    assert path == str(tiny_model_dir)
    assert kwargs["load_in_4bit"] is False and kwargs["use_gradient_checkpointing"] == "unsloth"
    assert calls["get_peft_model"] == {
        "finetune_vision_layers": True, "finetune_language_layers": True, "finetune_attention_modules": True,
        "finetune_mlp_modules": True, "r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none",
        "random_state": 5, "use_gradient_checkpointing": "unsloth"}
    assert processor.tokenizer.padding_side == "left"
    assert models.trainable_summary(model)["vision"] > 0


# --- Bad input: one line, exit 2, before any model loads ---------------------------------------

BAD_TRAIN = [
    ("unsloth on a CPU", {"backend": "unsloth"}, "error: params.yaml: train.backend: unsloth needs a CUDA GPU"),
    ("8-bit Adam on a CPU", {"optim": "adamw_8bit"}, "error: params.yaml: train.optim: adamw_8bit (bitsandbytes)"),
    ("4-bit on a CPU", {"load_in_4bit": True}, "error: params.yaml: train.load_in_4bit: 4-bit loading needs"),
    ("vLLM on a CPU", {"use_vllm": True, "finetune_vision_layers": False},
     "error: params.yaml: train.use_vllm: vLLM needs a CUDA GPU"),
    ("unknown reward", {"rewards": {"vibes": 1.0}},
     "error: params.yaml: train.rewards.vibes: unknown reward (expected one of correctness_tags, format_tags, "
     "correctness_free, description, reasoning)"),
    ("group size", {"num_generations": 3},
     "error: params.yaml: train.num_generations: 3 does not divide the generation batch 4"),
]


@pytest.mark.parametrize("what, changes, message", BAD_TRAIN, ids=[b[0] for b in BAD_TRAIN])
def test_bad_train_params_fail_before_loading_a_model(what, changes, message, tiny_dataset, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train=changes))
    cache = tmp_path / "cache"  # an empty model cache: loading the tiny model would fill it
    result = stage("train", "--params", str(params), "--data", str(tiny_dataset), "--adapter",
                   str(tmp_path / "adapter"), "--checkpoints", str(tmp_path / "ckpt"), "--reports",
                   str(tmp_path / "reports"), env={"VGRPO_CACHE": str(cache)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(message)
    assert not cache.exists() or not any(cache.iterdir())
    assert not (tmp_path / "adapter").exists()


@pytest.mark.parametrize("damage", ["missing", "malformed"])
def test_missing_or_malformed_dataset(damage, tiny_dataset, tmp_path):
    import shutil

    data = tmp_path / "shapes"
    if damage == "malformed":
        shutil.copytree(tiny_dataset, data)
        for arrow in data.glob("train/*.arrow"):
            arrow.write_bytes(b"not arrow")
    params = write_params(tmp_path / "params.yaml", tiny_params())
    result = stage("train", "--params", str(params), "--data", str(data), "--adapter", str(tmp_path / "a"),
                   env={"VGRPO_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    expected = "no dataset here (run the generate stage" if damage == "missing" else "cannot read the dataset"
    assert last.startswith(f"error: {data}: ") and expected in last, last
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_prompt_longer_than_max_prompt_length(tiny_dataset, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"max_prompt_length": 40}))
    result = stage("train", "--params", str(params), "--data", str(tiny_dataset), "--adapter", str(tmp_path / "a"),
                   "--checkpoints", str(tmp_path / "c"), "--reports", str(tmp_path / "r"))
    assert result.returncode == 2
    assert "train.max_prompt_length: 40 is shorter than the longest prompt" in result.stderr


# --- A real run: outputs, curves, resume ------------------------------------------------------

def train_args(tmp_path: Path, data: Path) -> list[str]:
    return ["--data", str(data), "--adapter", str(tmp_path / "adapter"), "--checkpoints", str(tmp_path / "ckpt"),
            "--reports", str(tmp_path / "reports")]


def test_train_stage_writes_adapter_curves_and_metrics(tiny_dataset, tmp_path):
    params = write_params(tmp_path / "params.yaml", tiny_params(train={"max_steps": 4, "save_steps": 2}))
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train: backend hf (asked: hf, CUDA: False)" in result.stdout

    adapter = tmp_path / "adapter"
    files = {p.name for p in adapter.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "processor_config.json", "tokenizer.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2", "checkpoint-4"]

    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["backend"] == "hf" and metrics["steps"] == 4
    curves = tmp_path / "reports" / "plots" / "metrics" / "train"
    for curve in ["reward.tsv", "rewards/correctness_tags/mean.tsv", "rewards/format_tags/mean.tsv", "kl.tsv",
                  "completions/mean_length.tsv", "loss.tsv", "learning_rate.tsv"]:
        rows = (curves / curve).read_text().splitlines()
        assert rows[0].startswith("step\t") and [r.split("\t")[0] for r in rows[1:]] == ["1", "2", "3", "4"], curve


def test_killed_run_resumes_from_its_last_checkpoint(tiny_dataset, tmp_path):
    raw = tiny_params(train={"max_steps": 6, "save_steps": 2})
    params = write_params(tmp_path / "params.yaml", raw)
    command = [sys.executable, str(ROOT / "stages" / "train.py"), "--params", str(params),
               *train_args(tmp_path, tiny_dataset)]
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

    raw["profiles"]["tiny"]["train"]["resume"] = True
    write_params(params, raw)
    result = stage("train", "--params", str(params), *train_args(tmp_path, tiny_dataset))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())
    assert metrics["steps"] == 6
    assert metrics["resumed_from"] == f"checkpoint-{max(done)}"
    steps = [row.split("\t")[0] for row in
             (tmp_path / "reports/plots/metrics/train/reward.tsv").read_text().splitlines()[1:]]
    assert steps == [str(i) for i in range(1, 7)]  # one row per step: no gap, no repeat
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
