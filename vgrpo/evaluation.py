"""Base vs trained, on the same images with the identical prompt and image budget, in one run.

One model is loaded with the adapter attached; the base answers with the adapter switched off
(`disable_adapter`), so nothing but the LoRA weights differs between the two. Generation is batched
and greedy by default. Accuracy reads the answer with `vgrpo.prompts.parse_answer`: the integer in
the single `<SOLUTION>` block, else the last integer in the response; no integer is unparseable.
"""

from __future__ import annotations

import contextlib
import csv
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from vgrpo import base, memory, models
from vgrpo.attention import attention_sheet, image_attention, with_eager_attention
from vgrpo.config import Config, EvaluateParams
from vgrpo.files import atomic_dir, write_json, write_jsonl
from vgrpo.generation import generate, next_token_logits
from vgrpo.intervals import bootstrap_ci, mcnemar_p, paired_bootstrap_ci
from vgrpo.prompts import brief_style_openings, parse_answer, reasoning_text
from vgrpo.rewards import REWARDS, stated_count

MODELS = ("base", "trained")
DESCRIBED = "base_described"  # the warm start with its brief style forbidden (only where it has one)
REASONING_BINS = (0, 16, 32, 64, 128, 256, 512, 10**9)  # tokens; edges of the accuracy-vs-length plot


def load_base_and_adapter(config: Config, base_dir: Path, adapter_dir: Path, dtype: str):
    """The base model, loaded as `train` loaded it (dtype, 4-bit), with the trained adapter attached, and
    the processor (image budget from params)."""
    from peft import PeftModel

    path = base.base_model_path(base_dir)
    model = models.load_model(path, dtype, load_in_4bit=config.train.load_in_4bit)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    return model, models.load_processor(path, config.model)


def as_model(model, name: str):
    """Run as `base` or `base_described` (adapter switched off) or as `trained`."""
    return contextlib.nullcontext() if name == "trained" else model.disable_adapter()


def has_brief_style(source: dict) -> bool:
    """Whether the warm start was taught a brief answer style beside the described one
    (base.described_share < 1): then its greedy answers are brief, and `base_described` measures what it
    can do when made to describe, the fair baseline for what GRPO adds."""
    return (source.get("warm_start") or {}).get("described_share", 1.0) < 1


def score(rows, completions: list[str], tokenizer) -> list[dict]:
    """One record per sample: parsed answer, correctness, every reward, reasoning length."""
    columns = {key: [row[key] for row in rows] for key in ("answer", "target_shape", "target_colour", "counts")
               if not rows or key in rows[0]}
    rewards = {name: fn(completions, **columns) for name, fn in REWARDS.items()}
    records = []
    for i, (row, completion) in enumerate(zip(rows, completions, strict=True)):
        parsed, reasoning = parse_answer(completion), reasoning_text(completion)
        records.append({
            "id": row["id"], "question": row["question"], "answer": row["answer"],
            "target_shape": row["target_shape"], "completion": completion, "parsed": parsed,
            "correct": parsed is not None and parsed == int(row["answer"]),
            "rewards": {name: values[i] for name, values in rewards.items()},
            "reasoning_tokens": len(tokenizer(reasoning, add_special_tokens=False)["input_ids"]),
            "reasoning_count": stated_count(reasoning, row["target_shape"]),
        })
    return records


def gain(base_records: list[dict], trained_records: list[dict], params: EvaluateParams) -> dict:
    """trained - base on one split: every number's difference, and for accuracy the paired interval,
    McNemar's p and the discordant counts it rests on."""
    base_correct = [r["correct"] for r in base_records]
    trained_correct = [r["correct"] for r in trained_records]
    return {**difference(summarize(trained_records, params), summarize(base_records, params)),
            "accuracy_ci95": paired_bootstrap_ci(base_correct, trained_correct, params.bootstrap_samples, params.seed),
            "mcnemar_p": mcnemar_p(base_correct, trained_correct),
            "only_trained_right": sum(t and not b for b, t in zip(base_correct, trained_correct, strict=True)),
            "only_base_right": sum(b and not t for b, t in zip(base_correct, trained_correct, strict=True))}


def summarize(records: list[dict], params: EvaluateParams) -> dict:
    correct = [r["correct"] for r in records]
    by_shape, by_count = defaultdict(list), defaultdict(list)
    for r in records:
        by_shape[r["target_shape"]].append(r["correct"])
        by_count[int(r["answer"])].append(r["correct"])
    return {
        "samples": len(records),
        "accuracy": _mean(correct),
        "accuracy_ci95": bootstrap_ci(correct, params.bootstrap_samples, params.seed),
        "format_compliance": _mean([r["rewards"]["format_tags"] == 1.0 for r in records]),
        "description_rate": _mean([r["rewards"]["description"] > 0 for r in records]),
        "unparseable_rate": _mean([r["parsed"] is None for r in records]),
        "mean_reasoning_tokens": _mean([r["reasoning_tokens"] for r in records]),
        "rewards": {name: _mean([r["rewards"][name] for r in records]) for name in REWARDS},
        # Where a wrong answer goes wrong: no count stated before the answer, counting (the reasoning states
        # the wrong number), or answering (the reasoning states the right one, and the answer does not repeat it).
        "count_stated_rate": _mean([r["reasoning_count"] is not None for r in records]),
        "reasoning_count_accuracy": _mean([r["reasoning_count"] == int(r["answer"]) for r in records]),
        "answer_matches_reasoning": _mean([r["reasoning_count"] is not None and r["parsed"] == r["reasoning_count"]
                                           for r in records]),
        "accuracy_by_shape": {shape: _mean(v) for shape, v in sorted(by_shape.items())},
        "accuracy_by_count": {str(count): _mean(v) for count, v in sorted(by_count.items())},
    }


def difference(trained, base):
    """trained - base for every number, keeping the structure (intervals are not subtracted)."""
    if isinstance(trained, dict):
        skip = ("accuracy_ci95", "samples")
        return {key: difference(trained[key], base[key]) for key in trained if key in base and key not in skip}
    if isinstance(trained, int | float) and not isinstance(trained, bool):
        return round(trained - base, 4)
    return None


@torch.no_grad()
def adapter_effect(model, processor, row, dtype: str) -> dict:
    """Are base and trained different models? The largest |lora_B| (0 means the adapter never moved:
    LoRA starts with B = 0) and the largest change it makes to the next-token logits on one image.
    Both logits must be finite (`models.check_finite`)."""
    lora_b = max((p.abs().max().item() for n, p in model.named_parameters() if "lora_B" in n), default=0.0)
    trained = next_token_logits(model, processor, row)
    with model.disable_adapter():
        untrained = next_token_logits(model, processor, row)
    models.check_finite(untrained, dtype, "evaluate: the base model")
    models.check_finite(trained, dtype, "evaluate: the trained model")
    return {"max_lora_b": lora_b, "max_logit_change": round((trained - untrained).abs().max().item(), 6)}


def _mean(values) -> float:
    values = list(values)
    return round(float(np.mean(values)), 4) if values else 0.0


# --- The stage ----------------------------------------------------------------------------------

def run_evaluation(config: Config, dtype: str, data_dir: Path, base_dir: Path, adapter_dir: Path, reports_dir: Path,
                   progress=None) -> dict:
    """The `evaluate` stage. Every input is checked before the model loads; `progress` (a tqdm bar)
    is given its total once the splits are known."""
    from vgrpo.shapes import load_dataset

    params = config.evaluate
    models.check_adapter(adapter_dir)
    base.base_model_path(base_dir)
    dataset = load_dataset(data_dir, splits=tuple(params.splits))
    splits = {split: dataset[split].select(range(min(params.max_samples[split], len(dataset[split]))))
              for split in params.splits}
    names = MODELS + ((DESCRIBED,) if has_brief_style(base.read_source(base_dir)) else ())
    if progress is not None:
        progress.reset(total=len(names) * sum(len(rows) for rows in splits.values()))
    if torch.cuda.is_available():
        plan = memory.evaluate_plan(config, memory.model_shape(base.base_model_path(base_dir)), dtype,
                                    (adapter_dir / "adapter_model.safetensors").stat().st_size)
        memory.check_fits(plan, "evaluate", config, *memory.gpu_free_and_name(),
                          stored_bytes=memory.stored_weights_bytes(base.read_source(base_dir)))
    model, processor = load_base_and_adapter(config, base_dir, adapter_dir, dtype)
    effect = adapter_effect(model, processor, next(iter(splits.values()))[0], dtype)  # before the long part
    forbidden = {DESCRIBED: brief_style_openings(processor.tokenizer)}

    records: dict[tuple[str, str], list[dict]] = {}
    completions_ids: dict[tuple[str, str], list[list[int]]] = {}
    torch.manual_seed(params.seed)
    start = time.perf_counter()
    for split, rows in splits.items():
        for name in names:
            ids = []
            for begin in range(0, len(rows), params.batch_size):
                batch = [rows[i] for i in range(begin, min(begin + params.batch_size, len(rows)))]
                with as_model(model, name):
                    ids += generate(model, processor, batch, params.max_new_tokens, params.do_sample,
                                    params.temperature, bad_words_ids=forbidden.get(name))
                if progress is not None:
                    progress.update(len(batch))
            texts = processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
            completions_ids[(split, name)] = ids
            records[(split, name)] = score([rows[i] for i in range(len(rows))], texts, processor.tokenizer)
            for record, completion in zip(records[(split, name)], ids, strict=True):  # generate stops before the end
                record["completion_tokens"] = len(completion)  # token, so a full-length answer was cut off
                record["truncated"] = len(completion) >= params.max_new_tokens
    seconds = time.perf_counter() - start
    generated = sum(len(r) for r in records.values())
    passes = sampled_pass_rates(model, processor, splits, names, params, config.train, forbidden)

    metrics = {"speed": {"samples": generated, "seconds": round(seconds, 2),
                         "samples_per_second": round(generated / seconds, 3),
                         "peak_vram_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                         if torch.cuda.is_available() else None}}
    metrics["decoding"] = {"do_sample": params.do_sample, "temperature": params.temperature if params.do_sample
                           else None, "max_new_tokens": params.max_new_tokens}
    metrics["adapter"] = effect
    for split in splits:
        base_records, trained_records = records[(split, "base")], records[(split, "trained")]
        metrics[split] = {"base": summarize(base_records, params), "trained": summarize(trained_records, params),
                          "trained_minus_base": gain(base_records, trained_records, params)}
        if DESCRIBED in names:  # what GRPO added over the warm start's better decoding
            described = records[(split, DESCRIBED)]
            metrics[split][DESCRIBED] = summarize(described, params)
            metrics[split]["trained_minus_base_described"] = gain(described, trained_records, params)
        for name in names:
            if (split, name) in passes:
                metrics[split][name]["pass_at_k"] = passes[(split, name)]

    with_eager_attention(model)
    attention_dir = reports_dir / "attention"
    shares: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with atomic_dir(attention_dir) as tmp:
        for split, rows in splits.items():
            for i in range(min(params.attention_samples, len(rows))):
                row = rows[i]
                grids = {}
                for name in MODELS:
                    with as_model(model, name):
                        share, grids[name] = image_attention(model, processor, row, completions_ids[(split, name)][i])
                    shares[split][name].append(share)
                low, high = min(g.min() for g in grids.values()), max(g.max() for g in grids.values())
                attention_sheet(row["image"], {name: grids[name] for name in MODELS}, low, high,
                                row["question"]).save(tmp / f"{row['id']}.png")
    for split in splits:
        for name in MODELS:
            metrics[split][name]["attention_on_image"] = _mean(shares[split][name]) if shares[split][name] else None
            metrics[split][name]["attention_samples"] = len(shares[split][name])
        if shares[split]["base"]:
            metrics[split]["trained_minus_base"]["attention_on_image"] = round(
                _mean(shares[split]["trained"]) - _mean(shares[split]["base"]), 4)

    write_predictions(reports_dir / "predictions.jsonl", records)
    write_plots(reports_dir / "plots", records)
    write_json(reports_dir / "metrics.json", metrics)
    write_json(reports_dir / "headline.json", headline(metrics))
    return metrics


def headline(metrics: dict) -> dict:
    """The few numbers `dvc exp show` and `dvc metrics show` print (the rest stays in metrics.json): test
    accuracy of base and trained, the gain with its paired interval and McNemar's p, the warm start made to
    describe where there is one, and out-of-distribution accuracy."""
    out = {}
    if "test" in metrics:
        test, gain = metrics["test"], metrics["test"]["trained_minus_base"]
        out["test"] = {"base": test["base"]["accuracy"], "trained": test["trained"]["accuracy"],
                       "gain": gain["accuracy"], "low": gain["accuracy_ci95"][0], "high": gain["accuracy_ci95"][1],
                       "p": gain["mcnemar_p"]}  # the gain's paired 95% interval, McNemar's p
        if DESCRIBED in test:
            out["test"]["described"] = test[DESCRIBED]["accuracy"]
    if "ood" in metrics:
        out["ood"] = {"base": metrics["ood"]["base"]["accuracy"], "trained": metrics["ood"]["trained"]["accuracy"]}
    return out


def sampled_pass_rates(model, processor, splits: dict, names: tuple[str, ...], params: EvaluateParams, train,
                       forbidden: dict) -> dict[tuple[str, str], dict]:
    """pass@k (`vgrpo.pass_at_k`) of each model on the first `evaluate.pass_samples[split]` images of a split,
    sampled as GRPO's rollouts are: does training pick from what the warm start could already answer?"""
    from vgrpo.pass_at_k import pass_rates, right_answers

    passes = {}
    n = max(params.pass_k, default=0)
    for split, rows in splits.items():
        images = min(params.pass_samples.get(split, 0), len(rows))
        if not images or not n:
            continue
        chosen = [rows[i] for i in range(images)]
        for name in names:
            torch.manual_seed(params.seed)
            with as_model(model, name):
                right = right_answers(model, processor, chosen, n, params.max_new_tokens, train.temperature,
                                      train.top_p, train.top_k, params.batch_size, forbidden.get(name),
                                      train.answer_temperature)
            # each image's right answers too: two models' pass@k can then be compared image by image
            passes[(split, name)] = {**pass_rates(right, n, params.pass_k), "images": images, "samples_per_image": n,
                                     "right_per_image": right}
    return passes


def write_predictions(path: Path, records: dict[tuple[str, str], list[dict]]) -> None:
    """One line per sample and model."""
    write_jsonl(path, ({"split": split, "model": name, **record}
                       for (split, name), rows in records.items() for record in rows))


def write_plots(plots_dir: Path, records: dict[tuple[str, str], list[dict]]) -> None:
    """Plot data for `dvc plots show`: accuracy by true count (in and out of the training range),
    confusion matrices, accuracy by reasoning length. Written into a temp dir, then swapped in."""
    with atomic_dir(plots_dir) as tmp:
        ood_counts = {int(r["answer"]) for (split, _), rows in records.items() if split == "ood" for r in rows}
        by_count: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
        by_bin: dict[int, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
        for (_, name), rows in records.items():
            for r in rows:
                by_count[int(r["answer"])][name].append(r["correct"])
                by_bin[bin_start(r["reasoning_tokens"])][name].append(r["correct"])
        _write_csv(tmp / "accuracy_by_count.csv", ["count", "range", *MODELS], [
            [count, "out of range" if count in ood_counts else "in range", *(_mean(by_count[count][m]) for m in MODELS)]
            for count in sorted(by_count)])
        # x is the bin's lower edge, a number: DVC's linear template draws no point for a text x.
        _write_csv(tmp / "accuracy_by_reasoning_length.csv", ["reasoning_tokens", *MODELS,
                                                             *[f"{m}_samples" for m in MODELS]], [
            [edge, *(_mean(by_bin[edge][m]) for m in MODELS), *(len(by_bin[edge][m]) for m in MODELS)]
            for edge in REASONING_BINS[:-1] if edge in by_bin])
        for name in MODELS:
            _write_csv(tmp / f"confusion_{name}.csv", ["actual", "predicted"], [
                [r["answer"], "none" if r["parsed"] is None else str(r["parsed"])]
                for (_, model_name), rows in records.items() if model_name == name for r in rows])


def bin_start(tokens: int) -> int:
    """The lower edge of the reasoning-length bin that `tokens` falls in."""
    return max(edge for edge in REASONING_BINS[:-1] if edge <= tokens)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
