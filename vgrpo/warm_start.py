"""The tiny model's warm start: supervised fine-tuning of the whole random tiny Qwen3-VL (TRL
`SFTTrainer`) on the `warmup` split, so that GRPO starts from a model whose answers vary in
quality. A random model emits no answer format at all, every completion gets the same reward, and
GRPO has no advantage to learn from (the tiny profile made no update before this existed).

The loss is on the answer tokens only, and the 151,936-token output layer is computed only there
(TRL's default `chunked_nll`): an SFT step of the tiny model costs about linearly in answer tokens.
The result is cached by its recipe (model, params, data, library versions), so a rerun with the
same inputs copies it instead of training again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from trl import SFTTrainer

from vgrpo.config import WARMUP, BaseParams, BriefAnswers, ConfigError, ModelParams
from vgrpo.files import atomic_dir, write_json
from vgrpo.prompts import REASONING_END, SOLUTION_END, SOLUTION_START, brief_answer, parse_answer, reference_answer
from vgrpo.vendor import cache_dir

RECIPE_VERSION = 4  # bump when the code below changes what a given recipe produces (4: built on one thread)


def sft_dataset(warmup, colours: dict[str, str], described_share: float = 1.0, seed: int = 0,
                brief_answers: BriefAnswers = "right", guess_max: int | None = None):
    """The `warmup` split as TRL's prompt-completion vision format: the image, the product's prompt
    (a user turn), and the reference answer (an assistant turn). With `described_share` < 1, that
    share of the answers (drawn with `seed`) states the three counts and the others are brief; with
    `brief_answers: guessed` a brief answer's number is drawn uniformly from the split's smallest to
    largest count (or to `guess_max`, with `seed` + 1), so that the brief style is a guess whatever CPU trains it."""
    described = np.random.default_rng(seed).random(len(warmup)) < described_share
    if brief_answers == "guessed":
        counts = [int(answer) for answer in warmup["answer"]]
        highest = max(counts) if guess_max is None else guess_max
        guesses = np.random.default_rng(seed + 1).integers(min(counts), highest + 1, len(warmup))

    def to_example(row, index):
        if described[index]:
            text = reference_answer(row["counts"], colours, row["target_shape"])
        elif brief_answers == "guessed":
            text = brief_answer({row["target_shape"]: int(guesses[index])}, colours, row["target_shape"])
        else:
            text = brief_answer(row["counts"], colours, row["target_shape"])
        return {"completion": [{"role": "assistant", "content": text}]}

    # in memory: a cache file written next to the split would change `generate`'s output, and DVC
    # would then rerun the whole pipeline on the next `dvc repro`
    return (warmup.map(to_example, with_indices=True, keep_in_memory=True)
            .select_columns(["image", "prompt", "completion"]))


def sft_config(params: BaseParams, output_dir: Path):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        max_steps=params.sft_steps,
        per_device_train_batch_size=params.batch_size,
        learning_rate=params.learning_rate,
        lr_scheduler_type=params.lr_scheduler_type,
        warmup_steps=params.warmup_ratio,  # a float < 1 is a ratio of the total steps (transformers 5)
        weight_decay=params.weight_decay,
        max_grad_norm=params.max_grad_norm,
        logging_steps=params.logging_steps,
        seed=params.seed,
        data_seed=params.seed,
        max_length=None,  # never cut a prompt: its image tokens must match the image
        completion_only_loss=True,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        disable_tqdm=False,
    )


class SampledSoftmaxSFTTrainer(SFTTrainer):
    """SFTTrainer whose loss normalises over the answers' own tokens plus `negatives` tokens drawn
    uniformly from the rest of the vocabulary at every step (sampled softmax, Jean et al. 2015), with
    the log-Q correction: each sampled token stands for (V - |answer tokens|) / k tokens, so its logit
    gets log of that added and the loss estimates the full softmax. On a CPU the 151,936-way output
    layer is most of a tiny model's step; this makes it about free.

    With `answer_smoothing` > 0 the number inside <SOLUTION> is label-smoothed over `answer_numbers`
    (the token of every number the answers give): its target puts that share evenly on all of them."""

    def __init__(self, *args, answer_token_ids=(), negatives: int = 1024, answer_smoothing: float = 0.0,
                 answer_numbers=(), solution_tags=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.answer_ids = torch.tensor(sorted(set(answer_token_ids)), dtype=torch.long)
        self.negatives = negatives
        self.answer_smoothing = answer_smoothing
        self.answer_numbers = torch.tensor(sorted(set(answer_numbers)), dtype=torch.long)
        self.solution_tags = solution_tags

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        inputs = dict(inputs)
        labels = inputs.pop("labels")
        hidden = model.model(**inputs, use_cache=False).last_hidden_state[:, :-1]
        targets = labels[:, 1:]
        scored = targets != -100
        is_number = answer_number_mask(labels, self.solution_tags)[:, 1:][scored] if self.answer_smoothing else None
        hidden, targets = hidden[scored], targets[scored]
        weight = model.get_output_embeddings().weight
        answer_ids = self.answer_ids.to(targets.device)
        sampled = torch.randint(0, weight.shape[0], (self.negatives,), device=targets.device)
        vocabulary = torch.unique(torch.cat([answer_ids, sampled]))  # sorted
        logits = hidden @ weight[vocabulary].t()
        others = ~torch.isin(vocabulary, answer_ids)
        logits = logits + others * torch.log((weight.shape[0] - len(answer_ids)) / others.sum().clamp(min=1))
        if is_number is None:
            return F.cross_entropy(logits, torch.searchsorted(vocabulary, targets))
        numbers = torch.searchsorted(vocabulary, self.answer_numbers.to(targets.device))
        return smoothed_cross_entropy(logits, torch.searchsorted(vocabulary, targets), is_number, numbers,
                                      self.answer_smoothing)


def smoothed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, is_number: torch.Tensor,
                           numbers: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Mean cross-entropy of `logits` (positions x classes); where `is_number`, the target is
    (1 - smoothing) x the target class + smoothing spread evenly over the classes `numbers`."""
    log_probs = logits.log_softmax(-1)
    nll = -log_probs.gather(1, targets[:, None]).squeeze(1)
    spread = -log_probs[:, numbers].mean(-1)
    return torch.where(is_number, (1 - smoothing) * nll + smoothing * spread, nll).mean()


def solution_tags(tokenizer) -> tuple[list[int], list[int]]:
    """The token runs around the answer's number as they appear in a reference answer: Qwen's BPE
    merges the `>` of </REASONING> with the `<` of <SOLUTION>, so the opening run starts at </REASONING>."""
    return (tokenizer(REASONING_END + SOLUTION_START, add_special_tokens=False)["input_ids"],
            tokenizer(SOLUTION_END, add_special_tokens=False)["input_ids"])


def answer_number_mask(labels: torch.Tensor, tags: tuple[list[int], list[int]]) -> torch.Tensor:
    """True where a row of `labels` holds the number between the two tag runs of `solution_tags`."""
    opening, closing = tags
    mask = torch.zeros_like(labels, dtype=torch.bool)
    for row, row_mask in zip(labels.tolist(), mask, strict=True):
        start = next((i + len(opening) for i in range(len(row)) if row[i:i + len(opening)] == opening), None)
        end = None if start is None else next(
            (i for i in range(start, len(row)) if row[i:i + len(closing)] == closing), None)
        if end is None:
            raise ConfigError("base.answer_smoothing: a tokenized warm-up answer has no <SOLUTION>...</SOLUTION>")
        row_mask[start:end] = True
    return mask


def answer_number_ids(tokenizer, answers) -> list[int]:
    """The token of every number inside <SOLUTION> in `answers`; each must be one token."""
    numbers = {parse_answer(text) for text in answers}
    ids = [tokenizer(str(n), add_special_tokens=False)["input_ids"] for n in sorted(numbers)]
    if any(len(one) != 1 for one in ids):
        raise ConfigError(f"base.answer_smoothing: the answers {sorted(numbers)} are not one token each")
    return [one[0] for one in ids]


def answer_token_ids(tokenizer, answers) -> set[int]:
    """Every token the reference answers use, and the end of the assistant turn."""
    ids = set()
    for text in [*answers, "<|im_end|>", "\n"]:
        ids.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def sft_trainer(net, processor, params: BaseParams, train_dataset, output_dir: Path, callbacks=()) -> SFTTrainer:
    """TRL's SFTTrainer for `net` on `train_dataset` (from `sft_dataset`), with the sampled-softmax loss
    (and the answers' label smoothing) when `params.sampled_negatives` > 0."""
    common = dict(model=net, args=sft_config(params, output_dir), train_dataset=train_dataset,
                  processing_class=processor, callbacks=list(callbacks))
    if not params.sampled_negatives:
        return SFTTrainer(**common)
    tokenizer = processor.tokenizer
    answers = [turn[0]["content"] for turn in train_dataset["completion"]]
    smoothing = {}
    if params.answer_smoothing:  # fail here, not at the first step, when the answers cannot be smoothed
        tags = solution_tags(tokenizer)
        answer_number_mask(torch.tensor([tokenizer(answers[0], add_special_tokens=False)["input_ids"]]), tags)
        smoothing = dict(answer_smoothing=params.answer_smoothing, solution_tags=tags,
                         answer_numbers=answer_number_ids(tokenizer, answers))
    return SampledSoftmaxSFTTrainer(**common, negatives=params.sampled_negatives,
                                    answer_token_ids=answer_token_ids(tokenizer, answers), **smoothing)


def recipe_key(model: ModelParams, params: BaseParams, model_dir: Path, data_fingerprint: str) -> str:
    """What determines the warm-started weights: the random model, the params, the data, the code."""
    import transformers
    import trl

    weights = hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()
    recipe = {"version": RECIPE_VERSION, "model": dataclasses.asdict(model), "base": dataclasses.asdict(params),
              "weights": weights, "data": data_fingerprint, "torch": torch.__version__,
              "transformers": transformers.__version__, "trl": trl.__version__}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def warm_start(model_dir: Path, model: ModelParams, params: BaseParams, data_dir: Path, reports_dir: Path,
               log=print) -> dict:
    """Fine-tune the model in `model_dir` in place on the warmup split; write curves and held-out
    accuracy to `reports_dir`. Returns the summary (also reports_dir/metrics.json)."""
    from vgrpo.shapes import dataset_colours, load_dataset

    dataset = load_dataset(data_dir, splits=(WARMUP, "val"))
    colours = dataset_colours(data_dir)
    fingerprint = json.loads((Path(data_dir) / "stats.json").read_text())["fingerprint"]
    cached = cache_dir() / f"warm-start-{recipe_key(model, params, model_dir, fingerprint)}"
    if not (cached / "model" / "model.safetensors").is_file():
        with atomic_dir(cached) as tmp, one_thread():
            train_and_measure(model_dir, model, params, dataset, colours, tmp / "model", tmp / "reports", log)
    else:
        log(f"base: warm start found in the cache ({cached})")
    for item in (cached / "model").iterdir():
        shutil.copy2(item, model_dir / item.name)
    with atomic_dir(reports_dir) as tmp:
        shutil.copytree(cached / "reports", tmp, dirs_exist_ok=True)
    return json.loads((reports_dir / "metrics.json").read_text())


@contextmanager
def one_thread():
    """Torch on one thread while the warm start trains. Its float sums then run in one order whatever
    the core count, so a recipe gives the same weights on a CPU of 2 cores or 16 of the same kind (on 2
    threads the cpu profile's warm start came out another: val 82.8% instead of 70.3%). It costs time
    once; the result is cached."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def train_and_measure(model_dir: Path, model: ModelParams, params: BaseParams, dataset, colours: dict,
                      out_dir: Path, reports_dir: Path, log) -> None:
    from dvclive import Live

    from vgrpo.curves import LiveCurves
    from vgrpo.generation import greedy_accuracy
    from vgrpo.models import load_model, load_processor

    torch.manual_seed(params.seed)
    processor = load_processor(str(model_dir), model)
    net = load_model(str(model_dir), "float32")
    if params.output_norm_init:  # a larger final norm lets frozen, random embeddings give confident logits
        net.model.language_model.norm.weight.data.fill_(params.output_norm_init)
    if params.freeze_embeddings:
        net.get_input_embeddings().weight.requires_grad_(False)
    live = Live(str(reports_dir), dvcyaml=None, save_dvc_exp=False, report=None)
    examples = sft_dataset(dataset[WARMUP], colours, params.described_share, params.seed, params.brief_answers,
                           params.brief_guess_max)
    trainer = sft_trainer(net, processor, params, examples, out_dir / "trainer",
                          callbacks=[LiveCurves(live, prefix="sft")])
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    net.eval()
    held_out = greedy_accuracy(net, processor, dataset["val"], params.eval_samples)
    shutil.rmtree(out_dir / "trainer", ignore_errors=True)
    net.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)
    summary = {"sft_steps": params.sft_steps, "warmup_images": len(dataset[WARMUP]), "seconds": round(seconds, 1),
               "seconds_per_step": round(seconds / max(1, params.sft_steps), 3),
               "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
               "val": held_out}
    for key, value in summary.items():
        live.summary[key] = value
    live.make_summary()
    live.end()
    write_json(reports_dir / "metrics.json", summary)
    log(f"base: warm start {params.sft_steps} steps in {seconds:.0f} s; val accuracy {held_out['accuracy']:.3f}, "
        f"answer format {held_out['format_compliance']:.3f} ({held_out['samples']} images)")
