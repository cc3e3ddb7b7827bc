"""GRPO with LoRA on image + question prompts, wired from params into TRL's GRPOTrainer.

`run_training` is the `train` stage, top to bottom: data, model + LoRA, rewards, GRPOConfig,
trainer (vision LoRA at its own learning rate), DVCLive curves, checkpoints and resume, adapter.
"""

from __future__ import annotations

import csv
import logging
import shutil
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from vgrpo import models
from vgrpo.config import Config, ConfigError, TrainParams
from vgrpo.files import atomic_dir, detach
from vgrpo.prompts import hf_messages
from vgrpo.rewards import reward_functions
from vgrpo.shapes import load_dataset

log = logging.getLogger(__name__)


def grpo_config(train: TrainParams, output_dir: str | Path, cuda: bool) -> GRPOConfig:
    """Every knob of the 8B recipe and the book variant, from params. On a CPU: no mixed precision,
    no gradient checkpointing, `use_cpu`."""
    return GRPOConfig(
        output_dir=str(output_dir),
        learning_rate=train.learning_rate,
        adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2,
        weight_decay=train.weight_decay,
        optim=train.optim,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_ratio,  # a float < 1 is a ratio of the total steps (transformers 5)
        per_device_train_batch_size=train.per_device_train_batch_size,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        num_generations=train.num_generations,
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
        top_p=train.top_p,
        beta=train.beta,
        loss_type=train.loss_type,
        importance_sampling_level=train.importance_sampling_level,
        num_train_epochs=train.num_train_epochs,
        max_steps=train.max_steps,
        save_steps=train.save_steps,
        save_strategy="steps",
        max_grad_norm=train.max_grad_norm,
        logging_steps=train.logging_steps,
        seed=train.seed,
        data_seed=train.seed,
        report_to=[],
        log_completions=False,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        fp16=False,
        use_cpu=not cuda,
        gradient_checkpointing=train.gradient_checkpointing and cuda,
        use_vllm=train.use_vllm,
        vllm_mode=train.vllm_mode,
        vllm_gpu_memory_utilization=train.vllm_gpu_memory_utilization,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


class VisionScaledGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose optimizer gives the vision tower's LoRA its own learning rate."""

    def __init__(self, *args, vision_lr_scale: float = 1.0, **kwargs):
        self.vision_lr_scale = vision_lr_scale
        super().__init__(*args, **kwargs)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, self.model)
            groups = models.optimizer_groups(self.model, self.args.learning_rate, self.args.weight_decay,
                                             self.vision_lr_scale)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
        return self.optimizer


class LiveCurves(TrainerCallback):
    """Per-step curves and a summary with DVCLive, keyed by the trainer's global step (so a resumed
    run continues the same curves)."""

    def __init__(self, live):
        self.live = live

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.live.step = state.global_step
        for key, value in logs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.live.log_metric(f"train/{key}", value)
        self.live.make_summary()


def trim_curves(reports_dir: Path, last_step: int) -> None:
    """Before a resumed run appends to the curves: unlink them from DVC's cache, and drop the rows
    logged after the checkpoint it resumes from (those steps are trained again)."""
    detach(reports_dir)
    for tsv in (reports_dir / "plots" / "metrics").rglob("*.tsv"):
        with tsv.open() as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if not rows:
            continue
        with tsv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
            writer.writeheader()
            writer.writerows(row for row in rows if int(row["step"]) <= last_step)


def check_prompt_length(dataset, processor, max_prompt_length: int) -> int:
    """TRL 1.x no longer truncates multimodal prompts, so enforce `max_prompt_length` here: the
    longest question with its image, in tokens. Images all have the same size, so one per question
    is enough."""
    longest = 0
    for question in sorted(set(dataset["question"])):
        row = dataset[dataset["question"].index(question)]
        ids = processor.apply_chat_template(hf_messages(question, row["image"]), add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]
        longest = max(longest, len(ids[0]) if isinstance(ids[0], list) else len(ids))
    if longest > max_prompt_length:
        raise ConfigError(f"params.yaml: train.max_prompt_length: {max_prompt_length} is shorter than the longest "
                          f"prompt ({longest} tokens with its image)")
    return longest


def build_trainer(config: Config, model, processor, train_dataset, reward_funcs, reward_weights,
                  checkpoints_dir: Path, callbacks=(), cuda: bool = False) -> VisionScaledGRPOTrainer:
    args = grpo_config(config.train, checkpoints_dir, cuda)
    args.reward_weights = list(reward_weights)
    return VisionScaledGRPOTrainer(
        model=model,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_dataset,
        processing_class=processor,
        callbacks=list(callbacks),
        vision_lr_scale=config.train.vision_lr_scale,
    )


def save_adapter(model, processor, adapter_dir: Path) -> None:
    """The LoRA adapter (safetensors only) and the processor, written atomically."""
    with atomic_dir(adapter_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)
        leftovers = [p.name for p in tmp.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl")]
        if leftovers:
            raise RuntimeError(f"adapter has non-safetensors files: {leftovers}")


def run_training(config: Config, backend: str, data_dir: Path, adapter_dir: Path, checkpoints_dir: Path,
                 reports_dir: Path) -> dict | None:
    """The `train` stage. Under `accelerate launch` every rank trains; only rank 0 writes the adapter,
    the checkpoints and the DVCLive output, and returns the summary (other ranks return None)."""
    from accelerate import PartialState
    from dvclive import Live

    train = config.train
    cuda = torch.cuda.is_available()
    main_process = PartialState(cpu=not cuda).is_main_process  # also sets up the process group when launched
    dataset = load_dataset(data_dir, splits=("train",))["train"]
    reward_funcs, reward_weights = reward_functions(train.rewards)

    resume_from = get_last_checkpoint(str(checkpoints_dir)) if train.resume and checkpoints_dir.is_dir() else None
    if not resume_from and main_process:
        shutil.rmtree(checkpoints_dir, ignore_errors=True)  # a fresh run: old checkpoints would mix in

    model, processor = models.load_for_training(config.model, train, backend)
    prompt_tokens = check_prompt_length(dataset, processor, train.max_prompt_length)
    trainable = models.trainable_summary(model)
    log.info("backend=%s trainable LoRA parameters: %s; prompt tokens <= %d", backend, trainable, prompt_tokens)

    callbacks = []
    if main_process:
        if resume_from and reports_dir.is_dir():
            trim_curves(reports_dir, int(Path(resume_from).name.split("-")[-1]))
        live = Live(str(reports_dir), resume=bool(resume_from), dvcyaml=None, save_dvc_exp=False, report=None)
        callbacks.append(LiveCurves(live))
    trainer = build_trainer(config, model, processor, dataset, reward_funcs, reward_weights, checkpoints_dir,
                            callbacks=callbacks, cuda=cuda)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - start
    trainer.accelerator.wait_for_everyone()
    if not main_process:
        return None

    save_adapter(trainer.accelerator.unwrap_model(trainer.model), processor, adapter_dir)
    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    summary = {
        "backend": backend,
        "world_size": trainer.accelerator.num_processes,
        "distributed": "deepspeed" if trainer.is_deepspeed_enabled else str(trainer.accelerator.distributed_type.value),
        "steps": trainer.state.global_step,
        "resumed_from": Path(resume_from).name if resume_from else None,
        "seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(1, trainer.state.global_step), 2),
        "trainable_parameters": trainable,
        "prompt_tokens": prompt_tokens,
        "final_reward": history[-1]["reward"] if history else None,
        "peak_vram_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    for key, value in summary.items():
        live.summary[key] = value
    live.make_summary()
    live.end()
    return summary
