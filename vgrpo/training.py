"""GRPO with LoRA on image + question prompts, wired from params into TRL's GRPOTrainer.

`run_training` is the `train` stage, top to bottom: GRPOConfig (first, so that DeepSpeed ZeRO-3
partitions the weights as they load), data, rewards, the base model + LoRA, trainer (vision LoRA
at its own learning rate), DVCLive curves, checkpoints and resume, the adapter (saved through the
trainer, so ZeRO-3's partitioned weights are gathered), and a summary that says whether the
adapter moved at all.
"""

from __future__ import annotations

import csv
import logging
import shutil
import time
from collections import Counter
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import torch
from transformers import LogitsProcessorList, Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint
from trl import GRPOConfig, GRPOTrainer

from vgrpo import base, memory, models
from vgrpo.answer_sampling import answer_processors
from vgrpo.config import Config, ConfigError, TrainParams
from vgrpo.curves import LiveCurves
from vgrpo.devices import trainer_precision
from vgrpo.files import atomic_dir, detach, replace_dir, write_json
from vgrpo.generation import greedy_accuracy, next_token_logits
from vgrpo.prompts import hf_messages
from vgrpo.revisits import UnsolvedPrompts
from vgrpo.rewards import reward_functions
from vgrpo.sampling import inverse_cdf_sampling
from vgrpo.shapes import load_dataset

logger = logging.getLogger(__name__)


# What defines the loss. Unsloth's GRPOConfig rewrites some of these (scale_rewards "group" -> "none"
# under dr_grpo), so they are set again after the config is built: both backends optimise one objective.
OBJECTIVE = ("loss_type", "scale_rewards", "beta", "importance_sampling_level", "top_entropy_quantile",
             "num_generations", "temperature", "top_p", "top_k", "max_completion_length", "max_grad_norm")


def grpo_config(train: TrainParams, output_dir: str | Path, dtype: str, cuda: bool) -> GRPOConfig:
    """Every knob of the recipe, from params. Mixed precision follows the dtype the model is loaded in
    (`dtype`, resolved by vgrpo.devices). On a CPU: no gradient checkpointing, `use_cpu`."""
    args = GRPOConfig(
        output_dir=str(output_dir),
        learning_rate=train.learning_rate,
        adam_beta1=train.adam_beta1,
        adam_beta2=train.adam_beta2,
        weight_decay=train.weight_decay,
        optim=train.optim,
        lr_scheduler_type=train.lr_scheduler_type,
        warmup_steps=train.warmup_ratio,  # a float < 1 is a ratio of the total steps (transformers 5)
        # dynamic sampling: prompt_oversampling times the prompts are sampled, per_device_train_batch_size rows trained
        per_device_train_batch_size=train.per_device_train_batch_size * train.prompt_oversampling,
        gradient_accumulation_steps=train.gradient_accumulation_steps,
        num_generations=train.num_generations,
        max_completion_length=train.max_completion_length,
        temperature=train.temperature,
        top_p=train.top_p,
        top_k=train.top_k,
        beta=train.beta,
        loss_type=train.loss_type,
        scale_rewards=train.scale_rewards,
        importance_sampling_level=train.importance_sampling_level,
        top_entropy_quantile=train.top_entropy_quantile,
        num_train_epochs=train.num_train_epochs,
        max_steps=train.max_steps,
        save_steps=train.save_steps,
        save_strategy="steps",
        save_total_limit=1,  # resume needs the last checkpoint only, and checkpoints/ is a DVC output
        max_grad_norm=train.max_grad_norm,
        logging_steps=train.logging_steps,
        seed=train.seed,
        data_seed=train.seed,
        report_to=list(train.report_to),  # DVCLive is ours (LiveCurves), always on
        log_completions=False,
        **trainer_precision(dtype),
        use_cpu=not cuda,
        gradient_checkpointing=train.gradient_checkpointing and cuda,
        use_vllm=train.use_vllm,
        vllm_mode=train.vllm_mode,
        vllm_gpu_memory_utilization=train.vllm_gpu_memory_utilization,
        vllm_server_base_url=train.vllm_server_base_url,
        vllm_server_timeout=train.vllm_server_timeout,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )
    for name in OBJECTIVE:
        setattr(args, name, getattr(train, name))
    return args


def is_zero3(args: GRPOConfig) -> bool:
    return args.deepspeed_plugin is not None and args.deepspeed_plugin.zero_stage == 3


def scaled_optimizer(trainer: Trainer, vision_lr_scale: float):
    """The trainer's optimizer (its args' class and settings) over `models.optimizer_groups`: the vision
    tower's LoRA at `vision_lr_scale` times the learning rate."""
    optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    groups = models.optimizer_groups(trainer.model, trainer.args.learning_rate, trainer.args.weight_decay,
                                     vision_lr_scale)
    return optimizer_cls(groups, **optimizer_kwargs)


class VisionScaledGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose optimizer gives the vision tower's LoRA its own learning rate, whose LoRA weights
    stay in float32 on a 4-bit base, which, with `groups_per_step`, trains each step on that many of the
    groups it sampled, those with reward spread first (dynamic sampling), which, with `advantage_baseline`,
    takes each answer's advantage against that fixed reward in place of its group's mean, which weighs
    positive advantages by `positive_advantage_weight`, which samples with `logits_processors` (the
    answer token hotter: vgrpo/answer_sampling.py), and which, with `revisit_unsolved`, draws prompts whose
    answers were all wrong again later (vgrpo/revisits.py)."""

    def __init__(self, *args, vision_lr_scale: float = 1.0, groups_per_step: int | None = None,
                 advantage_baseline: float | None = None, positive_advantage_weight: float = 1.0,
                 logits_processors: list | None = None, revisit_unsolved: int = 0, **kwargs):
        self.vision_lr_scale = vision_lr_scale
        self.groups_per_step = groups_per_step
        self.advantage_baseline = advantage_baseline
        self.positive_advantage_weight = positive_advantage_weight
        self.logits_processors = list(logits_processors or [])
        self.last_rewards = self.last_correct = None
        super().__init__(*args, **kwargs)
        self.unsolved = UnsolvedPrompts(revisit_unsolved, self.num_generations) if revisit_unsolved else None
        if models.is_quantized(self.model):  # undo TRL's bfloat16 cast of the LoRA weights (models.py says why)
            models.keep_trainable_in_float32(self.model)

    def _generate_and_score_completions(self, inputs):
        revisiting = self.unsolved is not None and self.model.training
        if revisiting:
            inputs, revisits = self.unsolved.splice(inputs)
            self.last_correct = None  # this call's, set by _calculate_rewards below
        with generation_with(self.model, self.logits_processors):
            batch = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return batch
        if revisiting:
            if self.last_correct is None:  # a backend whose trainer scores rewards elsewhere (a patched TRL)
                raise RuntimeError("train.revisit_unsolved: this trainer never passed its rewards through "
                                   "_calculate_rewards, so there is no telling which prompts went unsolved")
            self.unsolved.record(inputs, self.last_correct, revisits)
        if self.groups_per_step is not None:
            batch, kept_without_spread = keep_groups_with_spread(batch, self.num_generations, self.groups_per_step)
            self._metrics["train"]["frac_kept_reward_zero_std"].append(kept_without_spread)
        if self.advantage_baseline is not None:
            if self.last_rewards is None:  # a backend whose trainer scores rewards elsewhere (a patched TRL)
                raise RuntimeError("train.advantage_baseline: this trainer never passed its rewards through "
                                   "_calculate_rewards, so there is nothing to take the baseline from")
            rows = batch["advantages"].size(0)
            mine = self.last_rewards[self.accelerator.process_index * rows:][:rows]  # TRL's process slice
            batch["advantages"] = fixed_baseline_advantages(mine, self.advantage_baseline).to(batch["advantages"])
        if self.positive_advantage_weight != 1.0:
            batch["advantages"] = weigh_positive_advantages(batch["advantages"], self.positive_advantage_weight)
        return batch

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # the weighted sum TRL takes next (every process's rows), kept for a fixed baseline
        self.last_rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        # right: any correctness reward above 0 (one process: config refuses revisits with several)
        correctness = [i for i, name in enumerate(self.reward_func_names) if name.startswith("correctness")]
        self.last_correct = (rewards_per_func[:, correctness].nan_to_num(0.0) > 0).any(dim=1).tolist()
        return rewards_per_func

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            self.optimizer = scaled_optimizer(self, self.vision_lr_scale)
        return self.optimizer


@contextmanager
def generation_with(model, logits_processors: list):
    """While active, `model.generate` also runs `logits_processors`. TRL's rollouts call the unwrapped model's
    generate with a GenerationConfig, which has no field for custom processors."""
    if not logits_processors:
        yield
        return
    own = model.__dict__.get("generate")  # a generate a backend set on the instance, kept as it was
    model.generate = partial(model.generate, logits_processor=LogitsProcessorList(logits_processors))
    try:
        yield
    finally:
        if own is None:
            del model.generate
        else:
            model.generate = own


def fixed_baseline_advantages(rewards: torch.Tensor, baseline: float) -> torch.Tensor:
    """REINFORCE's advantages against a fixed baseline: reward minus `baseline`, whatever the group drew. Unlike
    GRPO's group mean, a group whose answers are all wrong still pushes them down (with the cpu profile's rewards,
    a well-formed right answer scores 3 and a well-formed wrong one 1, so a baseline of 2 gives +1 and -1: with
    `positive_advantage_weight: 0.1` that is W-REINFORCE as its paper writes it, arXiv 2506.01347)."""
    return torch.nan_to_num(rewards - baseline, nan=0.0)


def weigh_positive_advantages(advantages: torch.Tensor, weight: float) -> torch.Tensor:
    """W-REINFORCE's weighting (Zhu et al., arXiv 2506.01347), on GRPO's group-relative advantages: an answer
    better than its group's mean is pulled up `weight` times as hard, one worse is pushed down as hard as
    before. The paper finds that pulling right answers up narrows what a model samples and pushing wrong ones
    down keeps pass@k (on the cpu profile at 0.1 it did not: docs/cpu-research.md)."""
    return torch.where(advantages > 0, advantages * weight, advantages)


def keep_groups_with_spread(batch: dict, group_size: int, groups: int) -> tuple[dict, float]:
    """DAPO's dynamic sampling (arXiv 2503.14476), done by over-sampling prompts: of the groups sampled (rows
    in consecutive runs of `group_size`, one prompt each), keep `groups`, those with reward spread first in
    the order sampled, then groups without spread to fill. A group whose rewards are all equal has zero
    advantage and teaches nothing; the loss is then taken over the kept groups only. Returns the kept batch
    and the share of kept groups without spread."""
    from trl.trainer.utils import split_pixel_values_by_grid, unsplit_pixel_values_by_grid

    advantages = batch["advantages"]
    rows = advantages.size(0)
    spread = advantages.reshape(-1, group_size).abs().sum(-1) > 0
    order = torch.cat([spread.nonzero().flatten(), (~spread).nonzero().flatten()])[:groups]
    keep = (order[:, None] * group_size + torch.arange(group_size, device=order.device)).flatten()

    def pick(value):
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.size(0) == rows:
            return value[keep.to(value.device)]
        if isinstance(value, list) and len(value) == rows:
            return [value[i] for i in keep.tolist()]
        return value

    kept = unsplit_pixel_values_by_grid({key: pick(value) for key, value in split_pixel_values_by_grid(batch).items()})
    if "num_items_in_batch" in kept:  # the tokens the loss is normalised by (dapo, cispo), now of the kept rows
        kept["num_items_in_batch"] = kept["completion_mask"].sum()
    return kept, round(float((~spread[order]).float().mean()), 4)


class HeldOutAccuracy(TrainerCallback):
    """Greedy accuracy on held-out (val) images before the first step and every `every` steps, logged
    as the `eval/accuracy` curve beside the rewards: does what GRPO rewards carry over to new images?"""

    def __init__(self, live, processor, rows, every: int, samples: int, max_new_tokens: int):
        self.live, self.processor, self.rows = live, processor, rows
        self.every, self.samples, self.max_new_tokens = every, samples, max_new_tokens
        self.history: list[tuple[int, float]] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.measure(state.global_step, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self.measure(state.global_step, model)

    def measure(self, step: int, model) -> None:
        training = model.training
        model.eval()
        result = greedy_accuracy(model, self.processor, self.rows, self.samples, self.max_new_tokens)
        model.train(training)
        self.history.append((step, result["accuracy"]))
        self.live.step = step
        self.live.log_metric("eval/accuracy", result["accuracy"])
        self.live.log_metric("eval/format_compliance", result["format_compliance"])


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
                  checkpoints_dir: Path | None = None, callbacks=(), args: GRPOConfig | None = None,
                  ) -> VisionScaledGRPOTrainer:
    """The GRPO trainer for `model` (LoRA attached). `args` defaults to the CPU config in float32."""
    args = args or grpo_config(config.train, checkpoints_dir, "float32", cuda=False)
    args.reward_weights = list(reward_weights)
    return VisionScaledGRPOTrainer(
        model=model,
        reward_funcs=list(reward_funcs),
        args=args,
        train_dataset=train_dataset,
        processing_class=processor,
        callbacks=list(callbacks),
        vision_lr_scale=config.train.vision_lr_scale,
        groups_per_step=(config.train.per_device_train_batch_size // config.train.num_generations
                         if config.train.prompt_oversampling > 1 else None),
        advantage_baseline=config.train.advantage_baseline,
        positive_advantage_weight=config.train.positive_advantage_weight,
        logits_processors=answer_processors(processor.tokenizer, config.train.temperature,
                                            config.train.answer_temperature),
        revisit_unsolved=config.train.revisit_unsolved,
    )


def save_adapter(model, processor, adapter_dir: Path) -> None:
    """A PEFT model's `default` adapter (safetensors only) and the processor, written atomically."""
    with atomic_dir(adapter_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, selected_adapters=["default"])
        processor.save_pretrained(tmp)
        keep_only_the_adapter(tmp)


def save_trained_adapter(trainer: GRPOTrainer, adapter_dir: Path, main_process: bool) -> None:
    """The trained adapter through `trainer.save_model`, on every rank: under ZeRO-3 that gathers the
    partitioned weights (a plain save on rank 0 writes empty tensors). Rank 0 then keeps only the
    adapter and swaps it in."""
    staging = adapter_dir.with_name(f".{adapter_dir.name}.saving")  # the same path on every rank
    if main_process:
        shutil.rmtree(staging, ignore_errors=True)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if main_process:
        keep_only_the_adapter(staging)
        replace_dir(staging, adapter_dir)


def keep_only_the_adapter(directory: Path) -> None:
    """Drop what is not the `default` adapter or the processor: TRL's frozen `ref` adapter (a subfolder,
    written when beta > 0), the Trainer's pickled training_args.bin. Then refuse any pickle left."""
    for path in directory.iterdir():
        if path.is_dir():
            shutil.rmtree(path)
        elif path.name == "training_args.bin":
            path.unlink()
    leftovers = [p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl")]
    if leftovers:
        raise RuntimeError(f"adapter has non-safetensors files: {leftovers}")


def adapter_change(adapter_dir: Path) -> dict[str, float]:
    """Largest |lora_B| in the saved adapter, per tower (vision, language). LoRA starts with B = 0, so 0.0
    means training never moved that tower's adapter."""
    from safetensors import safe_open

    largest = {"language": 0.0, "vision": 0.0}
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), "pt") as f:
        for key in f.keys():
            if "lora_B" in key:
                tower = "vision" if models.is_vision_parameter(key) else "language"
                largest[tower] = max(largest[tower], f.get_tensor(key).abs().max().item())
    return largest


def run_training(config: Config, backend: str, dtype: str, data_dir: Path, base_dir: Path, adapter_dir: Path,
                 checkpoints_dir: Path, reports_dir: Path, log=print) -> dict | None:
    """The `train` stage. Under `accelerate launch` every rank trains; only rank 0 writes the adapter,
    the checkpoints and the DVCLive output, and returns the summary (other ranks return None)."""
    from dvclive import Live

    train = config.train
    cuda = torch.cuda.is_available()
    # First: building the config sets up the process group and, under ZeRO-3, makes from_pretrained
    # partition the weights while they load.
    args = grpo_config(train, checkpoints_dir, dtype, cuda)
    if cuda:  # before the weights load: a run that cannot fit stops in one line that names the profile to use
        shape = memory.base_shape(base.base_model_path(base_dir), config)
        memory.check_fits(memory.train_plan(config, shape, dtype), "training", config, *memory.gpu_free_and_name(),
                          stored_bytes=memory.stored_weights_bytes(base.read_source(base_dir)))
    main_process = args.process_index == 0
    source = base.read_source(base_dir)
    splits = load_dataset(data_dir, splits=("train", "val"))
    dataset = splits["train"]
    reward_funcs, reward_weights = reward_functions(train.rewards)

    resume_from = get_last_checkpoint(str(checkpoints_dir)) if train.resume and checkpoints_dir.is_dir() else None
    if train.resume and not resume_from and main_process:
        log(f"train: train.resume is true but {checkpoints_dir} holds no checkpoint: training from scratch")
    if not resume_from and main_process:
        shutil.rmtree(checkpoints_dir, ignore_errors=True)  # a fresh run: old checkpoints would mix in
    if resume_from and main_process:
        detach(checkpoints_dir)  # checked out by DVC as links into its cache: the trainer must not write through

    from transformers.integrations import is_deepspeed_zero3_enabled

    zero3_init = is_deepspeed_zero3_enabled()  # True here under ZeRO-3: the weights are partitioned as they load
    model, processor = models.load_for_training(base.base_model_path(base_dir), config.model, train, backend, dtype,
                                                zero3=is_zero3(args))
    prompt_tokens = check_prompt_length(dataset, processor, train.max_prompt_length)
    if not is_zero3(args):  # ZeRO-3's partitioned weights run only inside its engine
        models.check_finite(next_token_logits(model, processor, dataset[0]), dtype, "train: the base model")
    trainable = models.trainable_summary(model)
    logger.info("backend=%s trainable LoRA parameters: %s; prompt tokens <= %d", backend, trainable, prompt_tokens)

    callbacks, held_out = [], None
    if main_process:
        if resume_from and reports_dir.is_dir():
            trim_curves(reports_dir, int(Path(resume_from).name.split("-")[-1]))
        live = Live(str(reports_dir), resume=bool(resume_from), dvcyaml=None, save_dvc_exp=False, report=None)
        callbacks.append(LiveCurves(live))
        if train.eval_steps and args.world_size == 1:  # several ranks would have to generate in step
            held_out = HeldOutAccuracy(live, processor, splits["val"], train.eval_steps, train.eval_samples,
                                       train.max_completion_length)
            callbacks.append(held_out)
    trainer = build_trainer(config, model, processor, dataset, reward_funcs, reward_weights, callbacks=callbacks,
                            args=args)
    start = time.perf_counter()
    # On a CPU, torch's multinomial is slow over a 151,936-token vocabulary (vgrpo/sampling.py); a GPU's is fast.
    with (nullcontext(Counter()) if cuda else inverse_cdf_sampling()) as sampling_calls:
        trainer.train(resume_from_checkpoint=resume_from)
    seconds = time.perf_counter() - start
    save_trained_adapter(trainer, adapter_dir, main_process)
    if not main_process:
        return None
    checkpoints_dir.mkdir(parents=True, exist_ok=True)  # a DVC output, even when no step reached train.save_steps

    history = [entry for entry in trainer.state.log_history if "reward" in entry]
    zero_spread = [entry.get("frac_reward_zero_std") for entry in history if "frac_reward_zero_std" in entry]
    towers = adapter_change(adapter_dir)
    change = max(towers.values())
    summary = {
        "backend": backend,
        "base_model": base.describe(source),
        "base_revision": source.get("sha"),
        "dtype": dtype,
        "load_in_4bit": train.load_in_4bit,
        "world_size": trainer.accelerator.num_processes,
        "distributed": "deepspeed" if trainer.is_deepspeed_enabled else str(trainer.accelerator.distributed_type.value),
        "zero3_init": zero3_init,
        "steps": trainer.state.global_step,
        "resumed_from": Path(resume_from).name if resume_from else None,
        "seconds": round(seconds, 1),
        "seconds_per_step": round(seconds / max(1, trainer.state.global_step), 2),
        "rollout_sampler": "torch" if cuda else "inverse_cdf",  # vgrpo/sampling.py
        "rollout_sampling_calls": dict(sampling_calls),  # counted on a CPU only: {} on CUDA
        "trainable_parameters": trainable,
        "prompt_tokens": prompt_tokens,
        "final_reward": history[-1]["reward"] if history else None,
        "val_accuracy": {f"step_{step}": accuracy for step, accuracy in held_out.history} if held_out else None,
        "adapter_changed": change > 0,
        "adapter_max_lora_b": change,
        "adapter_max_lora_b_by_tower": towers,
        # TRL logs each logging step's share of groups whose rewards are all equal (zero advantage, no signal)
        "zero_spread_groups": round(sum(zero_spread) / len(zero_spread), 4) if zero_spread else None,
        # train.answer_temperature: how many rollout answers took the hotter digit (null: the knob is off)
        "answers_sampled_hotter": sum(p.answers for p in trainer.logits_processors) if trainer.logits_processors
        else None,
        # train.revisit_unsolved: groups found with no right answer, and groups drawn again (null: the knob is off)
        "unsolved_groups_queued": trainer.unsolved.queued if trainer.unsolved else None,
        "unsolved_groups_revisited": trainer.unsolved.revisited if trainer.unsolved else None,
        "zero_spread_steps": round(sum(f == 1.0 for f in zero_spread) / len(zero_spread), 4) if zero_spread else None,
        "peak_vram_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
    }
    if not summary["adapter_changed"]:
        log(f"train: the adapter did not change: every lora_B is still 0 after {summary['steps']} steps "
            f"(steps whose groups all had zero reward spread: {summary['zero_spread_steps']}); the trained model is "
            "the base model")
    elif summary["zero_spread_steps"] == 1.0:
        log("train: every step's groups had zero reward spread: no advantage, so no learning signal")
    for key, value in summary.items():
        live.summary[key] = value
    live.make_summary()
    live.end()
    write_json(reports_dir / "headline.json", {key: summary[key] for key in ("steps", "seconds_per_step",
                                                                             "zero_spread_groups")})
    return summary
