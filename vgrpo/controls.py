"""The controls GRPO is measured against, each trained with GRPO's own budget: the same LoRA on the same
warm-started base, its optimizer, learning rate (the vision tower's scaled as in GRPO), optimizer steps
and rows per optimizer step (`train.per_device_train_batch_size` x `train.gradient_accumulation_steps`), on
the prompts GRPO draws (`train.max_steps` x prompts per optimizer step x `train.prompt_oversampling` of the
train split, shuffled by `train.seed`: dynamic sampling draws that many times the groups it trains on).
Only the supervision differs:

- `rft`: rejection-sampling fine-tuning, GRPO's own supervision. The warm start answers each prompt
  `train.num_generations` times at GRPO's sampling settings (as many answers as GRPO draws), the verifier
  keeps the right ones (`correctness_tags`), and supervised steps learn them. What GRPO adds beyond it is
  what its negative samples and advantages add.
- `full_label_sft`: the dataset's labels, every answer described (the three true counts, then the asked
  one), on the same prompts, each as often as GRPO samples it. More supervision than GRPO gets.

Each control's adapter is then scored by the evaluate stage's own code (`evaluate_control`: its prompt,
greedy decoding and scoring), so its records pair image by image with GRPO's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch

from vgrpo import models
from vgrpo.config import Config
from vgrpo.prompts import reference_answer
from vgrpo.rewards import REWARDS

CONTROLS = ("rft", "full_label_sft")


def grpo_prompts(train_split, config: Config):
    """The prompts GRPO draws over its run: max_steps x prompts per optimizer step x prompt_oversampling of
    the train split, in an order shuffled by train.seed (wrapping round when the run is longer than the split)."""
    t = config.train
    rows_drawn = t.max_steps * t.per_device_train_batch_size * t.gradient_accumulation_steps * t.prompt_oversampling
    count = rows_drawn // t.num_generations
    order = np.random.default_rng(t.seed).permutation(len(train_split))
    return train_split.select([int(order[i % len(order)]) for i in range(count)])


def as_examples(rows, answers: list[str]):
    """TRL's prompt-completion vision format: the image, the product's prompt, the answer as the assistant."""
    from datasets import Dataset

    return Dataset.from_dict({"image": [row["image"] for row in rows], "prompt": [row["prompt"] for row in rows],
                              "completion": [[{"role": "assistant", "content": text}] for text in answers]})


def verified_samples(model, processor, prompts, config: Config) -> tuple[list, list[str], dict]:
    """RFT's data: num_generations answers per prompt sampled as GRPO samples (its temperature, answer
    temperature, top_p, top_k; inverse-CDF draws on a CPU), the right ones kept. Returns the kept rows, their
    answers and the counts."""
    from contextlib import nullcontext

    from vgrpo.answer_sampling import answer_processors
    from vgrpo.generation import generate
    from vgrpo.sampling import inverse_cdf_sampling

    t = config.train
    rows = [prompts[i] for i in range(len(prompts)) for _ in range(t.num_generations)]
    processors = answer_processors(processor.tokenizer, t.temperature, t.answer_temperature)
    texts = []
    torch.manual_seed(t.seed)
    with nullcontext() if torch.cuda.is_available() else inverse_cdf_sampling():
        for begin in range(0, len(rows), t.per_device_train_batch_size):
            batch = rows[begin:begin + t.per_device_train_batch_size]
            ids = generate(model, processor, batch, t.max_completion_length, do_sample=True,
                           temperature=t.temperature, top_p=t.top_p, top_k=t.top_k, logits_processors=processors)
            texts += processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    right = REWARDS["correctness_tags"](texts, answer=[row["answer"] for row in rows])
    kept = [(row, text) for row, text, reward in zip(rows, texts, right, strict=True) if reward > 0]
    return [r for r, _ in kept], [text for _, text in kept], {"sampled": len(texts), "kept": len(kept)}


def full_labels(prompts, colours: dict[str, str], config: Config) -> tuple[list, list[str]]:
    """Every prompt as often as GRPO samples it, answered with the dataset's full label."""
    rows = [prompts[i] for i in range(len(prompts)) for _ in range(config.train.num_generations)]
    return rows, [reference_answer(row["counts"], colours, row["target_shape"]) for row in rows]


def control_trainer(model, processor, examples, config: Config, output_dir: Path):
    """TRL's SFTTrainer with GRPO's optimizer, learning rate (vision LoRA scaled), steps and batch; loss on
    the answer tokens only."""
    from trl import SFTConfig, SFTTrainer

    from vgrpo.training import scaled_optimizer

    t = config.train
    args = SFTConfig(
        output_dir=str(output_dir), max_steps=t.max_steps, per_device_train_batch_size=t.per_device_train_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        learning_rate=t.learning_rate, lr_scheduler_type=t.lr_scheduler_type, warmup_steps=t.warmup_ratio,
        weight_decay=t.weight_decay, adam_beta1=t.adam_beta1, adam_beta2=t.adam_beta2, optim=t.optim,
        max_grad_norm=t.max_grad_norm, seed=t.seed, data_seed=t.seed, max_length=None, completion_only_loss=True,
        save_strategy="no", report_to=[], logging_steps=t.logging_steps, use_cpu=not torch.cuda.is_available(),
        bf16=False, fp16=False, dataloader_num_workers=0, disable_tqdm=True)

    class ScaledSFTTrainer(SFTTrainer):
        def create_optimizer(self, model=None):
            if self.optimizer is None:
                self.optimizer = scaled_optimizer(self, t.vision_lr_scale)
            return self.optimizer

    return ScaledSFTTrainer(model=model, args=args, train_dataset=examples, processing_class=processor)


def train_control(name: str, config: Config, base_path: str, train_split, colours: dict[str, str],
                  adapter_dir: Path) -> dict:
    """Train control `name` from the base at `base_path` and save its adapter; returns its data's figures."""
    from vgrpo.training import save_adapter

    if name not in CONTROLS:
        raise ValueError(f"unknown control {name!r} (expected one of {', '.join(CONTROLS)})")
    model, processor = models.load_for_training(base_path, config.model, config.train, "hf", "float32")
    prompts = grpo_prompts(train_split, config)
    if name == "rft":
        model.eval()
        with model.disable_adapter():  # the warm start itself (the adapter is still the identity here)
            rows, answers, figures = verified_samples(model, processor, prompts, config)
        model.train()
    else:
        rows, answers = full_labels(prompts, colours, config)
        figures = {"sampled": 0, "kept": len(rows)}
    figures["prompts"] = len(prompts)
    if not rows:  # nothing verified right: no supervision at all, the control is its warm start
        figures["steps"] = 0
    else:
        with tempfile.TemporaryDirectory() as tmp:
            trainer = control_trainer(model, processor, as_examples(rows, answers), config, Path(tmp))
            trainer.train()
            figures["steps"] = trainer.state.global_step
            figures["final_loss"] = next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None)
    save_adapter(model, processor, adapter_dir)
    return figures


def evaluate_control(config: Config, data_dir: Path, base_dir: Path, adapter_dir: Path, out_dir: Path) -> dict:
    """The control's greedy answers on the images evaluate scores, with evaluate's own prompt, decoding and
    scoring (`evaluation.score`), and its pass@k where evaluate samples GRPO's (`evaluate.pass_samples`),
    written as evaluate writes them (the control as model `trained`): out_dir/predictions.jsonl and
    metrics.json. The base is not scored again: GRPO's run has it."""
    from vgrpo.evaluation import load_base_and_adapter, sampled_pass_rates, score, summarize, write_predictions
    from vgrpo.files import write_json
    from vgrpo.generation import generate
    from vgrpo.shapes import load_dataset

    params = config.evaluate
    dataset = load_dataset(data_dir, splits=tuple(params.splits))
    model, processor = load_base_and_adapter(config, base_dir, adapter_dir, "float32")
    records, metrics = {}, {}
    for split in params.splits:
        rows = dataset[split].select(range(min(params.max_samples[split], len(dataset[split]))))
        rows = [rows[i] for i in range(len(rows))]
        ids = []
        for begin in range(0, len(rows), params.batch_size):
            ids += generate(model, processor, rows[begin:begin + params.batch_size], params.max_new_tokens)
        texts = processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
        records[(split, "trained")] = score(rows, texts, processor.tokenizer)
        metrics[split] = {"trained": summarize(records[(split, "trained")], params)}
    # RFT learns from right answers only, GRPO also from wrong ones: does either narrow what it can reach?
    passes = sampled_pass_rates(model, processor, {split: dataset[split] for split in params.splits}, ("trained",),
                                params, config.train, {})
    for (split, _), rates in passes.items():
        metrics[split]["trained"]["pass_at_k"] = rates
    write_predictions(out_dir / "predictions.jsonl", records)
    write_json(out_dir / "metrics.json", metrics)
    return metrics
