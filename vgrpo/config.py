"""Typed, validated params: `params.yaml` -> `Config`, checked once, before any heavy import.

`params.yaml` has one group per stage plus `model` and `profile`: the values the stages use, which is
what DVC tracks. `dvc exp run` writes it by Hydra composition of `conf/config.yaml` and the profile
chosen (`conf/profile/<name>.yaml`, `-S profile=tiny`); `compose` does the same for tests, benchmarks
and scripts/gpu_check.py. Every knob must be present: conf/ is the only place knobs live.

Any problem raises `ConfigError` with one line that names the key, e.g.
`params.yaml: generate.val_size: expected an integer >= 1, got -3`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class VgrpoError(Exception):
    """A user-facing problem: stages print its one-line message and exit with code 2."""


class ConfigError(VgrpoError):
    """A problem with params.yaml."""


def knob(*, ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None):
    """A required params field with optional numeric bounds."""
    return field(metadata={"ge": ge, "gt": gt, "le": le, "lt": lt})


SHAPES = ("triangles", "circles", "squares")
SPLITS = ("train", "val", "test", "ood")
GRID_CELL = 32  # px: Qwen3-VL's patch 16 x spatial merge 2, the image area of one merged image token
WARMUP = "warmup"  # the tiny model's supervised warm start (base stage); disjoint from SPLITS
COLOURS = {
    "red": (220, 30, 30),
    "blue": (30, 60, 220),
    "green": (20, 160, 60),
    "orange": (240, 140, 0),
    "purple": (140, 40, 180),
    "black": (0, 0, 0),
}
# llama.cpp quantization names (lower case) -> llama_ftype. tests/test_config.py checks these
# against the installed llama_cpp constants.
QUANTIZATIONS = {
    "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_s": 11, "q3_k_m": 12,
    "q3_k_l": 13, "q4_k_s": 14, "q4_k_m": 15, "q5_k_s": 16, "q5_k_m": 17, "q6_k": 18,
}  # fmt: skip
# Reward names known to vgrpo.rewards.REWARDS (kept here so validating params imports nothing heavy;
# tests/test_rewards.py checks the two lists agree).
REWARD_NAMES = ("correctness_tags", "correctness_partial", "format_tags", "correctness_free", "description",
                "reasoning", "counts_described", "answer_follows_reasoning")

Colour = Literal["red", "blue", "green", "orange", "purple", "black"]
Split = Literal["train", "val", "test", "ood"]
BriefAnswers = Literal["right", "guessed"]  # guessed: a brief warm-up answer's number is a random count


@dataclass(frozen=True)
class ModelParams:
    name: str  # a hub id, a local directory, or "tiny" (random Qwen3-VL built locally)
    revision: str  # hub id only: a commit sha, a tag or a branch; the base stage records the commit it resolves to
    dtype: Literal["auto", "float32", "bfloat16", "float16"]  # auto: bf16 where the GPU runs it natively, else fp16
    min_pixels: int = knob(ge=1024)  # image-token budget: pixels per image after resizing
    max_pixels: int = knob(ge=1024)
    tiny_seed: int = knob(ge=0)  # weights of the tiny model (ignored for real checkpoints)


@dataclass(frozen=True)
class ShapeColours:
    triangles: Colour
    circles: Colour
    squares: Colour


@dataclass(frozen=True)
class GenerateParams:
    seed: int = knob(ge=0)
    image_size: int = knob(ge=64, le=2048)
    train_size: int = knob(ge=1)
    val_size: int = knob(ge=1)
    test_size: int = knob(ge=1)
    ood_size: int = knob(ge=1)
    warmup_size: int = knob(ge=0)  # the `warmup` split for the tiny model's warm start (0: none)
    layout: Literal["scatter", "grid"]  # grid: each shape centred in its own 32 px cell (one merged image token)
    min_count: int = knob(ge=1)  # the asked shape, in-distribution splits
    max_count: int = knob(ge=1)
    other_min_count: int = knob(ge=0)  # the two shapes not asked about, every split
    other_max_count: int = knob(ge=0)
    # the other shapes in the `warmup` split: up to this many (null: other_max_count), so that the warm start
    # describes counts above the asked range (6-8) that its answers never give
    warmup_other_max_count: int | None = knob(ge=0)
    # the asked shape in the `warmup` split: up to this many (null: max_count), so that the warm start has seen
    # counts above GRPO's training range (6-8), as a pretrained model has, and OOD asks whether post-training
    # on 1-5 keeps them
    warmup_max_count: int | None = knob(ge=1)
    ood_min_count: int = knob(ge=1)  # the asked shape in `ood`
    ood_max_count: int = knob(ge=1)
    min_shape_size: int = knob(ge=6)  # bounding-box side in pixels
    max_shape_size: int = knob(ge=6)
    min_gap: int = knob(ge=1)  # pixels between shapes, so they never touch
    colours: ShapeColours


@dataclass(frozen=True)
class BaseParams:
    """The tiny model's supervised warm start (TRL SFTTrainer, full fine-tuning) on the `warmup` split."""
    sft_steps: int = knob(ge=0)  # 0: the tiny model as built, random
    batch_size: int = knob(ge=1)
    learning_rate: float = knob(gt=0)
    lr_scheduler_type: Literal["cosine", "linear", "constant", "constant_with_warmup"]
    warmup_ratio: float = knob(ge=0, lt=1)
    weight_decay: float = knob(ge=0)
    max_grad_norm: float = knob(gt=0)
    logging_steps: int = knob(ge=1)
    seed: int = knob(ge=0)
    eval_samples: int = knob(ge=0)  # val images answered greedily after the warm start (reports/base)
    sampled_negatives: int = knob(ge=0)  # 0: softmax over the whole vocabulary; k: over the answers' tokens + k sampled
    freeze_embeddings: bool  # keep the (tied) token embeddings, and so the output layer, as built
    output_norm_init: float = knob(ge=0)  # the decoder's final RMSNorm weight before the warm start; 0: as built
    answer_smoothing: float = knob(ge=0, le=1)  # share of the answer number's target spread over every answer number
    described_share: float = knob(gt=0, le=1)  # warm-up answers that state the three counts; the rest are brief
    brief_answers: BriefAnswers  # guessed: a brief answer's number is a random count, not the right one
    # a guessed brief answer's largest number (null: the warm-up split's largest count); above it, the answer
    # slot has out-of-range numbers in its support
    brief_guess_max: int | None = knob(ge=1)


@dataclass(frozen=True)
class TrainParams:
    backend: Literal["auto", "unsloth", "hf"]
    rewards: dict[str, float]  # reward name -> weight
    lora_r: int = knob(ge=1)
    lora_alpha: int = knob(ge=1)
    lora_dropout: float = knob(ge=0, le=1)
    lora_bias: Literal["none", "all", "lora_only"]
    finetune_vision_layers: bool
    finetune_language_layers: bool
    finetune_attention_modules: bool
    finetune_mlp_modules: bool
    load_in_4bit: bool
    gradient_checkpointing: bool
    vision_lr_scale: float = knob(ge=0)  # vision LoRA lr = learning_rate * this; 0 freezes it
    learning_rate: float = knob(gt=0)
    adam_beta1: float = knob(ge=0, le=1)
    adam_beta2: float = knob(ge=0, le=1)
    weight_decay: float = knob(ge=0)
    optim: Literal["adamw_torch", "adamw_8bit", "paged_adamw_8bit", "sgd"]
    lr_scheduler_type: Literal["cosine", "linear", "constant", "constant_with_warmup"]
    warmup_ratio: float = knob(ge=0, lt=1)  # transformers reads a value >= 1 as a number of steps
    per_device_train_batch_size: int = knob(ge=1)  # completions (not prompts) per device and step
    prompt_oversampling: int = knob(ge=1)  # > 1: sample this many times the step's prompts, train on the groups
                                           # with reward spread first (DAPO's dynamic sampling); 1: off
    revisit_unsolved: int = knob(ge=0)  # > 0: up to this many groups a step are prompts drawn earlier whose answers
                                        # were all wrong, drawn once more (vgrpo/revisits.py); 0: off
    gradient_accumulation_steps: int = knob(ge=1)
    num_generations: int = knob(ge=2)  # GRPO group size
    max_prompt_length: int = knob(ge=16)
    max_completion_length: int = knob(ge=1)
    temperature: float = knob(gt=0)
    answer_temperature: float | None = knob(gt=0)  # the answer's number sampled at this (reasoning at temperature);
                                                   # null: at temperature (vgrpo/answer_sampling.py says why)
    top_p: float = knob(gt=0, le=1)
    top_k: int = knob(ge=0)  # rollouts sample from the k likeliest tokens; 0: all of them (TRL's default)
    beta: float = knob(ge=0)  # KL coefficient
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo"]
    scale_rewards: Literal["group", "batch", "none"]  # divide advantages by the reward std of the group/batch, or not
    advantage_baseline: float | None  # null: each answer's reward minus its group's mean (GRPO's); a number: minus
                                      # that fixed reward, so an all-wrong group still learns (REINFORCE's)
    positive_advantage_weight: float = knob(ge=0, le=1)  # advantages above 0 times this (W-REINFORCE, arXiv
                                                        # 2506.01347: wrong answers pushed down harder); 1: off
    importance_sampling_level: Literal["token", "sequence"]
    top_entropy_quantile: float = knob(ge=0, le=1)  # < 1: the policy loss keeps only this top share of the tokens
                                                   # by entropy (arXiv 2506.01939); 1: every token
    num_train_epochs: float = knob(gt=0)
    max_steps: int = knob(ge=-1)  # -1: use num_train_epochs
    save_steps: int = knob(ge=1)
    max_grad_norm: float = knob(gt=0)
    logging_steps: int = knob(ge=1)
    eval_steps: int = knob(ge=0)  # greedy held-out (val) accuracy every N steps, a curve next to the rewards; 0: off
    eval_samples: int = knob(ge=1)  # val images in that measure
    seed: int = knob(ge=0)
    resume: bool
    num_processes: int = knob(ge=1)
    accelerate_config: str  # ddp | zero2 | zero3 (vgrpo/accelerate_configs) or a path to an accelerate config
    use_vllm: bool
    vllm_mode: Literal["colocate", "server"]
    vllm_gpu_memory_utilization: float = knob(gt=0, le=1)
    vllm_server_base_url: str  # vllm_mode server: where `trl vllm-serve` listens (another node is fine)
    vllm_server_timeout: float = knob(gt=0)  # seconds to wait for that server at start-up
    report_to: list[Literal["wandb", "trackio", "tensorboard"]]  # besides DVCLive (always): live dashboards


@dataclass(frozen=True)
class EvaluateParams:
    splits: list[Split]
    max_samples: dict[str, int] = knob(ge=1)  # split -> the most samples evaluated from it
    batch_size: int = knob(ge=1)
    max_new_tokens: int = knob(ge=1)
    do_sample: bool
    temperature: float = knob(gt=0)
    seed: int = knob(ge=0)
    bootstrap_samples: int = knob(ge=100)
    attention_samples: int = knob(ge=0)  # images drawn as attention heatmaps
    pass_k: list[int] = knob(ge=1)  # pass@k at GRPO's sampling settings (train.temperature, top_p, top_k)
    pass_samples: dict[str, int] = knob(ge=0)  # split -> images answered max(pass_k) times each; 0: none


@dataclass(frozen=True)
class ExportParams:
    merged_dtype: Literal["float32", "bfloat16", "float16"]
    quantizations: list[str]


@dataclass(frozen=True)
class SmokeParams:
    num_images: int = knob(ge=2)
    max_new_tokens: int = knob(ge=1)
    n_threads: int = knob(ge=1)
    n_ctx: int = knob(ge=256)  # llama.cpp context: prompt (text + image tokens) + max_new_tokens
    cpu_repack: bool  # llama.cpp's repacked/AMX CPU weights (off: they crash in VMs without AMX state)
    n_gpu_layers: int | Literal["auto"] = knob(ge=-1)  # text-model layers on the GPU: -1 all, 0 none, auto: what fits
    # How close each GGUF must be to the merged model: vgrpo/smoke.py TOLERANCES, by precision and file type.
    max_quant_accuracy_drop: float = knob(ge=0, le=1)  # counting accuracy: merged model minus quantized file
    min_image_sensitivity: float = knob(ge=0, le=1)  # the merged model's first count, real vs blank image: TV
    min_image_sensitivity_ratio: float = knob(ge=0, le=1)  # each file's, as a share of the merged model's


@dataclass(frozen=True)
class Config:
    profile: str
    model: ModelParams
    generate: GenerateParams
    base: BaseParams
    train: TrainParams
    evaluate: EvaluateParams
    export: ExportParams
    smoke: SmokeParams

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_GROUP_CLASSES = {
    "model": ModelParams, "generate": GenerateParams, "base": BaseParams, "train": TrainParams,
    "evaluate": EvaluateParams, "export": ExportParams, "smoke": SmokeParams,
}  # fmt: skip


CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def load_config(path: str | Path = "params.yaml") -> Config:
    """Read and validate params.yaml."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(err).split())})") from None
    return config_from_dict(raw, source=path.name)


def config_from_dict(raw: Any, source: str = "params.yaml") -> Config:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {_show(raw)}")
    unknown = set(raw) - set(_GROUP_CLASSES) - {"profile"}
    if unknown:
        raise ConfigError(f"{source}: {sorted(unknown)[0]}: unknown key (expected one of "
                          f"{', '.join(['profile', *_GROUP_CLASSES])})")
    profile = raw.get("profile")
    if not isinstance(profile, str) or not profile:
        raise ConfigError(f"{source}: profile: expected the name of the profile composed (dvc exp run -S "
                          f"profile=...), got {_show(profile)}")
    groups = {group: _build(cls, raw.get(group), group, source) for group, cls in _GROUP_CLASSES.items()}
    config = Config(profile=profile, **groups)
    _check_relations(config, source)
    return config


def profiles(conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(path.stem for path in (conf_dir / "profile").glob("*.yaml"))


def compose(profile: str = "full", overrides: list[str] | tuple[str, ...] = (), conf_dir: Path = CONF_DIR) -> dict:
    """params.yaml as `dvc exp run -S profile=<profile> -S <override> ...` writes it: conf/ composed by
    Hydra through DVC's own function (dvc.utils.hydra.compose_and_dump). Overrides are Hydra's
    (`train.max_steps=2`), applied after the profile."""
    import tempfile

    from dvc.utils.hydra import compose_and_dump

    if profile not in profiles(conf_dir):
        raise ConfigError(f"profile: unknown profile {profile!r} (expected one of {', '.join(profiles(conf_dir))}: "
                          f"{conf_dir / 'profile'})")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "params.yaml"
        try:
            compose_and_dump(out, str(conf_dir), None, "config", "", [f"profile={profile}", *overrides])
        except Exception as err:  # noqa: BLE001 - Hydra's errors (a bad override) become one line
            raise ConfigError(f"{conf_dir}: cannot compose profile {profile} with {list(overrides)}: "
                              f"{' '.join(str(err).split())}") from None
        return yaml.safe_load(out.read_text())


def _build(cls: type, data: Any, path: str, source: str):
    if data is None:
        raise ConfigError(f"{source}: {path}: missing group")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {path}: expected a mapping, got {_show(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            raise ConfigError(f"{source}: {path}.{key}: unknown key (expected one of {', '.join(fields)})")
    values = {}
    for name, f in fields.items():
        if name not in data:
            raise ConfigError(f"{source}: {path}.{name}: missing key")
        values[name] = _check_value(data[name], hints[name], f.metadata, f"{path}.{name}", source)
    return cls(**values)


def _check_value(value: Any, hint: Any, bounds: Any, path: str, source: str) -> Any:
    def fail(expected: str):
        raise ConfigError(f"{source}: {path}: expected {expected}, got {_show(value)}")

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, source)
    if origin is Literal:
        if value not in args:
            fail("one of " + ", ".join(str(a) for a in args))
        return value
    if origin in (types.UnionType, typing.Union):  # `X | None`, `int | Literal["auto"]`: the first arm that fits
        if value is None and type(None) in args:
            return None
        expected = []
        for arm in (a for a in args if a is not type(None)):
            try:
                return _check_value(value, arm, bounds, path, source)
            except ConfigError as err:
                expected.append(str(err).split(": expected ", 1)[1].rsplit(", got ", 1)[0])
        fail(" or ".join(expected))
    if origin is list:
        if not isinstance(value, list):
            fail("a list")
        return [_check_value(v, args[0], {}, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not value:
            fail("a non-empty mapping of name -> number")
        bounds = bounds if bounds and any(v is not None for v in bounds.values()) else {"ge": 0}
        return {str(k): _check_value(v, args[1], bounds, f"{path}.{k}", source) for k, v in value.items()}
    if hint is bool:
        if not isinstance(value, bool):
            fail("true or false")
        return value
    if hint is str:
        if not isinstance(value, str) or not value:
            fail("a non-empty string")
        return value
    if hint is int:
        kind = "an integer"
        if isinstance(value, bool) or not isinstance(value, int):
            fail(kind + _bounds_text(bounds))
    elif hint is float:
        kind = "a number"
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            fail(kind + _bounds_text(bounds))
        value = float(value)
    else:  # pragma: no cover - a schema mistake, not a user one
        raise TypeError(f"unsupported params type {hint!r} at {path}")
    ge, gt, le, lt = ((bounds or {}).get(key) for key in ("ge", "gt", "le", "lt"))
    if ((ge is not None and value < ge) or (gt is not None and value <= gt) or (le is not None and value > le)
            or (lt is not None and value >= lt)):
        fail(kind + _bounds_text(bounds))
    return value


def _bounds_text(bounds: Any) -> str:
    parts = []
    if bounds and bounds.get("ge") is not None:
        parts.append(f">= {bounds['ge']:g}")
    if bounds and bounds.get("gt") is not None:
        parts.append(f"> {bounds['gt']:g}")
    if bounds and bounds.get("le") is not None:
        parts.append(f"<= {bounds['le']:g}")
    if bounds and bounds.get("lt") is not None:
        parts.append(f"< {bounds['lt']:g}")
    return (" " + " and ".join(parts)) if parts else ""


def _check_relations(config: Config, source: str) -> None:
    """Constraints between keys, named by the key that has to change."""

    def fail(key: str, message: str):
        raise ConfigError(f"{source}: {key}: {message}")

    m, g, b, t, e, x = config.model, config.generate, config.base, config.train, config.evaluate, config.export
    if m.min_pixels > m.max_pixels:
        fail("model.min_pixels", f"must be <= model.max_pixels ({m.min_pixels} > {m.max_pixels})")
    if g.min_count > g.max_count:
        fail("generate.min_count", f"must be <= generate.max_count ({g.min_count} > {g.max_count})")
    if g.ood_min_count <= g.max_count:
        fail("generate.ood_min_count", f"must exceed the training range, generate.max_count = {g.max_count}"
             f" (got {g.ood_min_count})")
    if g.ood_min_count > g.ood_max_count:
        fail("generate.ood_min_count", f"must be <= generate.ood_max_count ({g.ood_min_count} > "
             f"{g.ood_max_count})")
    if g.min_shape_size > g.max_shape_size:
        fail("generate.min_shape_size", f"must be <= generate.max_shape_size ({g.min_shape_size} > "
             f"{g.max_shape_size})")
    if g.max_shape_size + 2 * g.min_gap > g.image_size:
        fail("generate.max_shape_size", f"does not fit in a {g.image_size}px image")
    if g.other_min_count > g.other_max_count:
        fail("generate.other_min_count", f"must be <= generate.other_max_count ({g.other_min_count} > "
             f"{g.other_max_count})")
    if g.warmup_other_max_count is not None and g.warmup_other_max_count < g.other_min_count:
        fail("generate.warmup_other_max_count", f"must be >= generate.other_min_count ({g.warmup_other_max_count} < "
             f"{g.other_min_count})")
    if g.warmup_max_count is not None and g.warmup_max_count < g.max_count:
        fail("generate.warmup_max_count", f"must be >= generate.max_count ({g.warmup_max_count} < {g.max_count}): "
             "the warm-up split covers the training range")
    if g.layout == "grid":
        cells = (g.image_size // GRID_CELL) ** 2
        if g.image_size % GRID_CELL:
            fail("generate.image_size", f"layout grid needs a multiple of {GRID_CELL} px (one merged image token per "
                 f"cell), got {g.image_size}")
        if g.max_shape_size + 2 * g.min_gap > GRID_CELL:
            fail("generate.max_shape_size", f"layout grid puts each shape in a {GRID_CELL} px cell with "
                 f"generate.min_gap around it: at most {GRID_CELL - 2 * g.min_gap} px, got {g.max_shape_size}")
        most = max(g.max_count, g.ood_max_count) + 2 * g.other_max_count
        if most > cells:
            fail("generate.other_max_count", f"layout grid has {cells} cells at {g.image_size} px, but an image may "
                 f"need {most} (asked up to {max(g.max_count, g.ood_max_count)} + 2 x {g.other_max_count})")
        warmup_most = max(g.max_count, g.warmup_max_count or 0)
        if warmup_most + 2 * g.other_min_count > cells:  # warm-up images whose others do not fit are drawn again
            fail("generate.other_min_count", f"layout grid has {cells} cells at {g.image_size} px, but a warm-up image "
                 f"needs at least {warmup_most + 2 * g.other_min_count}")
    colours = dataclasses.asdict(g.colours)
    if len(set(colours.values())) < len(colours):
        fail("generate.colours", f"each shape needs its own colour, got {colours} (the label check counts "
             "connected regions per colour)")
    if b.sft_steps and m.name != "tiny":
        fail("base.sft_steps", f"the warm start is for the tiny model (model.name: tiny), not {m.name}: set it to 0")
    if b.sft_steps and not g.warmup_size:
        fail("base.sft_steps", f"{b.sft_steps} warm-start steps need warm-start images: set generate.warmup_size > 0")
    if b.brief_guess_max is not None and b.brief_answers != "guessed":
        fail("base.brief_guess_max", f"is only read with base.brief_answers: guessed (got {b.brief_answers}): set it "
             "to null")
    if b.brief_guess_max is not None and b.brief_guess_max < g.min_count:
        fail("base.brief_guess_max", f"must be >= generate.min_count ({b.brief_guess_max} < {g.min_count})")
    if b.answer_smoothing and not b.sampled_negatives:
        fail("base.answer_smoothing", "is computed in the sampled-softmax loss: set base.sampled_negatives > 0")
    for name in t.rewards:
        if name not in REWARD_NAMES:
            fail(f"train.rewards.{name}", f"unknown reward (expected one of {', '.join(REWARD_NAMES)})")
    if not any(t.rewards.values()):
        fail("train.rewards", "every weight is 0: GRPO would have no reward (a weight of 0 turns a reward off)")
    generation_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps * t.num_processes
    if generation_batch % t.num_generations:
        fail("train.num_generations", f"{t.num_generations} does not divide the generation batch "
             f"{generation_batch} (per_device_train_batch_size {t.per_device_train_batch_size} x "
             f"gradient_accumulation_steps {t.gradient_accumulation_steps} x num_processes {t.num_processes})")
    if t.prompt_oversampling > 1 and t.num_processes > 1:
        fail("train.prompt_oversampling", "dynamic sampling runs in one process (train.num_processes: 1)")
    if t.prompt_oversampling > 1 and t.per_device_train_batch_size % t.num_generations:
        fail("train.prompt_oversampling", f"needs whole groups per step: per_device_train_batch_size "
             f"{t.per_device_train_batch_size} is not a multiple of num_generations {t.num_generations}")
    groups_per_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps // t.num_generations
    if t.revisit_unsolved and t.num_processes > 1:
        fail("train.revisit_unsolved", "revisits run in one process (train.num_processes: 1)")
    if t.revisit_unsolved > groups_per_batch:
        fail("train.revisit_unsolved", f"{t.revisit_unsolved} groups, but a generation batch holds "
             f"{groups_per_batch} (per_device_train_batch_size x gradient_accumulation_steps / num_generations)")
    if t.revisit_unsolved and not any(weight for name, weight in t.rewards.items() if name.startswith("correctness")):
        fail("train.revisit_unsolved", "tells unsolved prompts by a correctness reward: give train.rewards a "
             "correctness_* weight")
    if t.advantage_baseline is not None and t.prompt_oversampling > 1:
        fail("train.advantage_baseline", "dynamic sampling picks groups by their spread around the group's mean: "
             "set train.prompt_oversampling: 1 with a fixed baseline")
    if t.advantage_baseline is not None and t.scale_rewards != "none":
        fail("train.advantage_baseline", f"a fixed baseline's advantages are not divided by a reward std: set "
             f"train.scale_rewards: none (got {t.scale_rewards})")
    if t.top_entropy_quantile < 1 and t.importance_sampling_level == "sequence":
        fail("train.top_entropy_quantile", "needs train.importance_sampling_level: token (at the sequence level "
             "every token's loss is the answer's mean ratio, so the mask only rescales each answer's loss)")
    if t.use_vllm and t.answer_temperature is not None:
        fail("train.answer_temperature", "vLLM samples the rollouts with its own settings: set "
             "train.use_vllm: false to sample the answer token hotter")
    if t.use_vllm and t.finetune_vision_layers:
        fail("train.use_vllm", "vLLM cannot apply LoRA to vision layers: set train.finetune_vision_layers: false "
             "to generate with vLLM, or train.use_vllm: false to keep the vision LoRA")
    if not t.vllm_server_base_url.startswith(("http://", "https://")):
        fail("train.vllm_server_base_url", f"expected an address like http://10.0.0.2:8000 (where `trl vllm-serve` "
             f"listens), got {t.vllm_server_base_url!r}")
    if not e.splits:
        fail("evaluate.splits", f"expected at least one of {', '.join(SPLITS)}")
    for split in e.max_samples:
        if split not in SPLITS:
            fail(f"evaluate.max_samples.{split}", f"unknown split (expected one of {', '.join(SPLITS)})")
    for split in e.splits:
        if split not in e.max_samples:
            fail("evaluate.max_samples", f"no cap for split {split!r} (listed in evaluate.splits)")
    for split in e.pass_samples:
        if split not in e.splits:
            fail(f"evaluate.pass_samples.{split}", f"not an evaluated split (evaluate.splits: {', '.join(e.splits)})")
    if e.pass_samples and not e.pass_k:
        fail("evaluate.pass_k", "empty, while evaluate.pass_samples asks for pass@k (give k values, e.g. [1, 4, 16])")
    if config.smoke.n_ctx < config.smoke.max_new_tokens + 256:
        fail("smoke.n_ctx", f"{config.smoke.n_ctx} leaves no room for the prompt (~130 tokens with a 256x256 image) "
             f"next to smoke.max_new_tokens {config.smoke.max_new_tokens}: use at least max_new_tokens + 256")
    for q in x.quantizations:
        if q not in QUANTIZATIONS:
            fail("export.quantizations", f"unknown quantization {q!r} (expected one of "
                 f"{', '.join(QUANTIZATIONS)})")


def _show(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."
