"""The smoke stage and its gate: the shipped GGUF files answer as the evaluated model did.

`run_smoke` first checks that the merged model answers the smoke images as `evaluate`'s base + adapter
did (the file shipped is the model evaluated), then runs every GGUF in llama.cpp and measures it against
the merged model. What is gated is what carries the task, the counts: teacher-forced along the merged
model's answer, llama.cpp must choose the same digits where that answer states a count
(`count_agreement`; the other, template tokens are reported apart), give the first count the same
distribution (`count_tv`), parse to the same answers, answer as the trained model did where it differs
from its base (`trained_agreement`), and its counts must move with the image as much as the merged
model's do (`image_sensitivity`). How close is close enough depends on the reference's precision and the
file's type (`tolerances`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vgrpo import memory
from vgrpo.answers import Answer, Run, likely_tv, logprob_diff, tokens_per_second
from vgrpo.config import Config, SmokeParams, VgrpoError
from vgrpo.files import write_json, write_jsonl
from vgrpo.gguf_files import UNQUANTIZED, find_gguf_files, k_quant_share
from vgrpo.hf_reference import run_hf
from vgrpo.llama_runtime import gpu_layers, run_llama
from vgrpo.prompts import parse_answer


def projector_error(embeddings: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest relative L2 distance between llama.cpp's image embeddings and transformers', image by
    image: ~1e-4 for a faithful f16 projector, 1 for a zeroed one, ~1 or more for a noisy one. It tests
    the projector file itself, whether or not the language model has learned to use the image."""
    errors = [np.linalg.norm(e - r) / max(np.linalg.norm(r), 1e-12) if e.shape == r.shape else np.inf
              for e, r in zip(embeddings, reference, strict=True)]
    return float(max(errors))


# --- Runs and measures ----------------------------------------------------------------------------

def forced_agreement(run: Run, reference: Run) -> tuple[float | None, float | None]:
    """Share of the reference's tokens that llama.cpp also chose, each given the reference's own prefix:
    at the positions where the reference states a number (the counts), and at every other position (the
    template: tags, colour and shape words). None when there are no such positions. Teacher forcing, not
    free-running answers, so one near-tie cannot flip everything after it."""
    counts, template = [], []
    for forced, answer, numbers in zip(run.forced, reference.answers, reference.count_positions, strict=True):
        # Not strict: llama.cpp stops on an end-of-generation token that transformers may not stop on.
        for i, (choice, token) in enumerate(zip(forced.choices, answer.token_ids, strict=False)):
            (counts if i in numbers else template).append(choice == token)
    return (_mean(counts) if counts else None), (_mean(template) if template else None)


def image_sensitivity(counts: list[tuple[np.ndarray | None, np.ndarray | None]]) -> float | None:
    """How much the image moves the first count: mean TV distance between the count distribution with the
    real image and with a blank one, the answer's prefix the same. ~0 for a model (or a projector) that
    ignores the image. None when no answer states a count."""
    pairs = [(real, blank) for real, blank in counts if real is not None and blank is not None]
    return round(float(np.mean([likely_tv(blank, real) for real, blank in pairs])), 6) if pairs else None


def count_mismatch(run: Run, reference: Run) -> float | None:
    """Mean TV distance between llama.cpp's and the reference's count distributions, image by image,
    both following the reference's own answer up to its count. None when no answer states a count."""
    pairs = [(f.count_logprobs, r.count_logprobs) for f, r in zip(run.forced, reference.answers, strict=True)
             if f.count_logprobs is not None and r.count_logprobs is not None]
    return float(np.mean([likely_tv(p, q) for p, q in pairs])) if pairs else None


def scores(run: Run, samples: list[dict]) -> dict:
    """Load time, speed, and the task: how often an answer parses, how often it is right."""
    parsed = [parse_answer(a.text) for a in run.answers]
    return {
        "load_seconds": round(run.load_seconds, 3),
        "tokens_per_second": round(tokens_per_second(run.answers), 2),
        "parse_rate": _mean([p is not None for p in parsed]),
        "accuracy": _mean([p == int(s["answer"]) for p, s in zip(parsed, samples, strict=True)]),
    }


def parity(run: Run, reference: Run) -> dict:
    """How closely a llama.cpp run follows the reference (the merged HF model) on the same images."""
    pairs = list(zip(run.answers, reference.answers, strict=True))
    answers = [(parse_answer(a.text), parse_answer(r.text)) for a, r in pairs]
    mismatch = count_mismatch(run, reference)
    count_agreement, template_agreement = forced_agreement(run, reference)
    return {
        "count_agreement": count_agreement,
        "template_agreement": template_agreement,
        "count_tv": None if mismatch is None else round(mismatch, 6),
        # Two answers that give no number are not an agreement.
        "answer_agreement": _mean([a is not None and a == r for a, r in answers]),
        "first_token_logprob_diff": round(max(logprob_diff(a.first_logprobs, r.first_logprobs)
                                              for a, r in pairs), 6),
        "same_answers": _mean([a.token_ids == r.token_ids for a, r in pairs]),
        "distinct_answers": len({tuple(a.token_ids) for a in run.answers}),
        "image_sensitivity": image_sensitivity([(f.count_logprobs, f.blank_count_logprobs) for f in run.forced]),
        "projector_error": round(projector_error(run.image_embeddings, reference.image_embeddings), 6),
    }


def _mean(values) -> float:
    values = [float(v) for v in values]
    return round(sum(values) / len(values), 4) if values else 0.0


# --- How close is close enough -------------------------------------------------------------------

@dataclass(frozen=True)
class Tolerance:
    """How far a GGUF file may be from the merged model (and the merged model from evaluate's answers),
    for one precision of the reference and one kind of file."""
    evaluated_agreement: float  # >= merged model vs evaluate's trained answers (the reference side alone)
    count_agreement: float  # >= teacher-forced digits where the reference states counts
    count_tv: float  # <= the first count's distribution
    answer_agreement: float  # >= parsed answers
    trained_agreement: float  # >= where evaluate's base and trained answers differ: answers as trained did
    logprob_diff: float  # <= first token, over the reference's likely tokens (nats)
    projector_error: float  # <= image embeddings, relative L2


# Set from what faithful files measure against their merged model on the tiny Qwen3-VL in each precision a CPU
# runs, and what another training run's file measures (`python bench/gate_figures.py --repo <run> --other
# <second run>`; the figures are in docs/stages.md). A float32 reference against an F16 file is held tight:
# faithful files measured count TV <= 5e-5, first-token log-probs <= 3e-6 nats, projector error <= 2.2e-4 and
# every answer alike, where a second GRPO run from the same warm start measured 31 answers of 32 alike, count TV
# 1.6e-3 and projector error 2.8e-3. Log-probs do not tell runs apart (the second run: 3.2e-5) and move more
# in a far-from-trained model: the faithful F16 file of an adapter with random LoRA B at std 0.1 measured
# 3.4e-3 nats (AMD EPYC Zen 5), so their bound is 0.01. bfloat16 and 4-bit references are looser by what
# they measured (bfloat16: count TV 2.3e-3, projector 2.5e-3 on the tiny model) and by what the 8B, never run,
# may add: their bounds are the ones the 16-bit and 4-bit profiles carried before these were measured.
# float16 cannot run on a CPU: it gets bfloat16's bounds (bfloat16 keeps 3 fewer mantissa bits).
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("float32", "unquantized"): Tolerance(evaluated_agreement=0.97, count_agreement=0.97, count_tv=0.001,
                                          answer_agreement=0.97, trained_agreement=0.97, logprob_diff=0.01,
                                          projector_error=0.001),
    ("float32", "quantized"): Tolerance(evaluated_agreement=0.97, count_agreement=0.85, count_tv=0.1,
                                        answer_agreement=0.85, trained_agreement=0.8, logprob_diff=1.0,
                                        projector_error=0.001),
    ("bfloat16", "unquantized"): Tolerance(evaluated_agreement=0.9, count_agreement=0.9, count_tv=0.05,
                                           answer_agreement=0.9, trained_agreement=0.85, logprob_diff=0.5,
                                           projector_error=0.05),
    ("bfloat16", "quantized"): Tolerance(evaluated_agreement=0.9, count_agreement=0.8, count_tv=0.25,
                                         answer_agreement=0.8, trained_agreement=0.75, logprob_diff=1.5,
                                         projector_error=0.05),
    ("4bit", "unquantized"): Tolerance(evaluated_agreement=0.75, count_agreement=0.8, count_tv=0.25,
                                       answer_agreement=0.8, trained_agreement=0.75, logprob_diff=1.5,
                                       projector_error=0.05),
    ("4bit", "quantized"): Tolerance(evaluated_agreement=0.75, count_agreement=0.75, count_tv=0.3,
                                     answer_agreement=0.75, trained_agreement=0.7, logprob_diff=2.0,
                                     projector_error=0.05),
}


PRECISIONS = ("float32", "bfloat16", "4bit")  # finest to coarsest
# An unquantized file's own precision: F16 keeps what a float32 reference says to ~1e-5 nats (measured), BF16
# rounds the weights as a bfloat16 model does.
FILE_PRECISION = {"f32": "float32", "f16": "float32", "bf16": "bfloat16"}


def reference_precision(dtype: str, load_in_4bit: bool) -> str:
    """The merged model's precision in smoke: 4-bit weights, else its dtype (float16 is bounded by bfloat16)."""
    return "4bit" if load_in_4bit else ("bfloat16" if dtype == "float16" else dtype)


def comparison_precision(dtype: str, load_in_4bit: bool, file_type: str) -> str:
    """The precision that sets a file's bounds: the coarser of the reference's and the file's own."""
    return coarser(reference_precision(dtype, load_in_4bit), file_type)


def coarser(precision: str, file_type: str) -> str:
    return max(precision, FILE_PRECISION.get(file_type, "float32"), key=PRECISIONS.index)


def file_kind(file_type: str) -> str:
    return "unquantized" if file_type in UNQUANTIZED else "quantized"


def tolerance(precision: str, kind: str) -> Tolerance:
    return TOLERANCES[(precision, kind)]


def gate_failures(file_metrics: dict[str, dict], reference: dict, params: SmokeParams) -> list[str]:
    """One line per missed bound: file, measure, value, bound and where the bound comes from. Every file is
    gated on the counts (teacher-forced count agreement, the first count's distribution, parsed answers,
    and the trained model's answers where they differ from its base), the first token's log-probs, the
    image (its counts move with it as the merged model's do; its projector's embeddings) and, for
    quantized files, its accuracy next to the merged model's. The bounds follow the coarser of the
    reference's precision and the file's own, and whether the file is quantized (`TOLERANCES`). The merged
    model's own counts must move with the image too."""
    failures = []

    def check(path: str, measure: str, value, sense: str, bound: float, source: str) -> None:
        if value is None:
            if measure != "trained_agreement":  # no image where base and trained differ: nothing to tell apart
                failures.append(f"{path}: {measure}: no answer of the merged model states a count, nothing to "
                                f"compare ({source})")
        elif (value < bound) if sense == ">=" else (value > bound):
            failures.append(f"{path}: {measure} {value:.4g} {'<' if sense == '>=' else '>'} {bound:.4g} ({source})")

    reference_sensitivity = reference["image_sensitivity"]
    check("the merged model", "image_sensitivity", reference_sensitivity, ">=", params.min_image_sensitivity,
          "smoke.min_image_sensitivity")
    for m in file_metrics.values():
        kind, precision = file_kind(m["file_type"]), coarser(reference["precision"], m["file_type"])
        bounds, source = tolerance(precision, kind), f"{precision} reference, {kind} file"
        for measure, sense in (("count_agreement", ">="), ("count_tv", "<="), ("answer_agreement", ">="),
                               ("trained_agreement", ">="), ("first_token_logprob_diff", "<="),
                               ("projector_error", "<=")):
            bound = getattr(bounds, measure.removeprefix("first_token_"))
            check(m["path"], measure, m[measure], sense, bound, source)
        if kind == "quantized":
            m["accuracy_drop"] = round(reference["accuracy"] - m["accuracy"], 4)
            check(m["path"], "accuracy_drop", m["accuracy_drop"], "<=", params.max_quant_accuracy_drop,
                  "smoke.max_quant_accuracy_drop")
        if reference_sensitivity:  # the file's counts move with the image as much as the merged model's do
            check(m["path"], "image_sensitivity", m["image_sensitivity"], ">=",
                  params.min_image_sensitivity_ratio * reference_sensitivity, "smoke.min_image_sensitivity_ratio")
    return failures


# --- The merged model is the evaluated one -------------------------------------------------------------

def evaluated_answers(predictions_path: Path) -> dict[str, dict[str, dict]]:
    """evaluate's test answers by image id: {"base": record, "trained": record}."""
    answers: dict[str, dict[str, dict]] = {}
    try:
        for line in Path(predictions_path).read_text().splitlines():
            record = json.loads(line)
            if record["split"] == "test" and record["model"] in ("base", "trained"):
                answers.setdefault(record["id"], {})[record["model"]] = record
    except FileNotFoundError:
        raise VgrpoError(f"{predictions_path}: not found (run the evaluate stage: dvc repro evaluate)") from None
    return answers


def same_answer(answer: Answer, record: dict) -> bool:
    """An answer is evaluate's `record`: the same parsed count when both finished; when either hit its token
    limit, the shorter text begins the longer one (an empty answer agrees with nothing)."""
    parsed, text, evaluated = parse_answer(answer.text), answer.text.strip(), record["completion"].strip()
    if not (answer.cut or record.get("truncated")):
        return parsed == record["parsed"] and (parsed is not None or text == evaluated)
    shorter, longer = sorted((text, evaluated), key=len)
    return bool(shorter) and longer.startswith(shorter)


def evaluated_share(run: Run, samples: list[dict], evaluated: dict[str, dict[str, dict]]) -> tuple[float, list]:
    """The share of the smoke images evaluate answered where this run answers as evaluate's trained model
    did (`same_answer`), and the (image id, answer, evaluate's record, same?) behind it."""
    pairs = [(s["id"], a, evaluated[s["id"]]["trained"]) for s, a in zip(samples, run.answers, strict=True)
             if "trained" in evaluated.get(s["id"], {})]
    if not pairs:
        raise VgrpoError(f"evaluate answered none of smoke's {len(samples)} test images (raise "
                         "evaluate.max_samples.test, or lower smoke.num_images)")
    checked = [(image, answer, record, same_answer(answer, record)) for image, answer, record in pairs]
    return round(sum(same for *_, same in checked) / len(checked), 4), checked


def evaluated_agreement(run: Run, samples: list[dict], evaluated: dict[str, dict[str, dict]], merged_dir: Path,
                        threshold: float, source: str) -> float:
    """The merged model is the evaluated one: on the smoke images that `evaluate` answered, its greedy
    answers are evaluate's trained answers (base + adapter, same prompt, image budget and decoding). A
    merge that dropped the adapter, or a module of it, ships another model; that stops the stage here."""
    share, checked = evaluated_share(run, samples, evaluated)
    if share < threshold:
        image, answer, record, _ = next(c for c in checked if not c[3])
        agree = sum(same for *_, same in checked)
        raise VgrpoError(f"{merged_dir}: the merged model answers {agree} of {len(checked)} smoke images as "
                         f"evaluate's trained model did ({share:.4g} < {threshold:g}, {source}; {image}: "
                         f"{parse_answer(answer.text)} here, {record['parsed']} in evaluate): the merge is not the "
                         "evaluated model (a dropped adapter or LoRA module?)")
    return share


def trained_agreement(run: Run, samples: list[dict], evaluated: dict[str, dict[str, dict]]) -> float | None:
    """On the smoke images where evaluate's base and trained answers differ, the share this run answers as
    trained did: a file of the base model, or of another training run, answers otherwise. None when base
    and trained agree on every smoke image (nothing to tell apart)."""
    picks = [(a, evaluated[s["id"]]["trained"]) for s, a in zip(samples, run.answers, strict=True)
             if len(evaluated.get(s["id"], {})) == 2
             and evaluated[s["id"]]["base"]["parsed"] != evaluated[s["id"]]["trained"]["parsed"]]
    return _mean([parse_answer(a.text) == record["parsed"] for a, record in picks]) if picks else None


# --- The stage ------------------------------------------------------------------------------------

def smoke_samples(data_dir: Path, n: int) -> list[dict]:
    from vgrpo.shapes import load_dataset

    test = load_dataset(data_dir, splits=("test",))["test"]
    if len(test) < n:
        raise VgrpoError(f"{data_dir}: the test split has {len(test)} images, smoke.num_images asks for {n}")
    return [test[i] for i in range(n)]


def check_merged(merged_dir: Path) -> None:
    if not (Path(merged_dir) / "config.json").is_file() or not any(Path(merged_dir).glob("*.safetensors")):
        raise VgrpoError(f"{merged_dir}: no merged model here (run the export stage: dvc repro export)")


def run_smoke(config: Config, dtype: str, merged_dir: Path, gguf_dir: Path, data_dir: Path, reports_dir: Path,
              predictions_path: Path, log=print) -> tuple[dict, list[str]]:
    """Answer the same test images with the merged HF model (checked against evaluate's predictions
    first) and every GGUF; write metrics and predictions; return the metrics and the thresholds missed."""
    params = config.smoke
    check_merged(merged_dir)
    texts, projector = find_gguf_files(gguf_dir)  # every header, before any model loads
    samples = smoke_samples(data_dir, params.num_images)
    torch.set_num_threads(params.n_threads)  # the same CPU threads on both sides

    if torch.cuda.is_available():
        memory.check_fits(memory.smoke_plan(config, memory.model_shape(str(merged_dir)), dtype),
                          "the merged model in smoke", config, *memory.gpu_free_and_name())
    evaluated = evaluated_answers(predictions_path)
    precision = reference_precision(dtype, config.train.load_in_4bit)
    runs = {}
    runs["hf"], freed = run_hf(merged_dir, config, dtype, samples)
    agreement = evaluated_agreement(runs["hf"], samples, evaluated, merged_dir,
                                    tolerance(precision, "unquantized").evaluated_agreement,
                                    f"the bound for a {precision} reference")
    log(f"smoke: hf {tokens_per_second(runs['hf'].answers):.1f} tokens/s; freed the transformers model "
        f"({freed['memory_freed_gb']:.2f} GiB {'of GPU memory' if torch.cuda.is_available() else 'of weights'}) "
        "before llama.cpp loads")
    files = {}
    for text in texts:
        run = runs[text.path.name] = run_llama(text, projector, samples, params, runs["hf"])
        m = files[text.path.name] = {
            "path": str(text.path), "file_type": text.file_type, "mmproj": projector.path.name,
            "n_gpu_layers": gpu_layers(text, projector, params),
            **scores(run, samples), **parity(run, runs["hf"]),
            "trained_agreement": trained_agreement(run, samples, evaluated),
            "tensor_types": text.tensor_types, "k_quant_share": k_quant_share(text.tensor_types)}
        log(f"smoke: {text.path.name} {m['tokens_per_second']:.1f} tokens/s, count agreement "
            f"{m['count_agreement']}, count TV {m['count_tv']}, answers agree {m['answer_agreement']} (as trained "
            f"where it differs from its base: {m['trained_agreement']}), image sensitivity {m['image_sensitivity']}")
    hf_sensitivity = image_sensitivity([(a.count_logprobs, a.blank_count_logprobs) for a in runs["hf"].answers])
    metrics = {"num_images": len(samples),
               "hf": {**scores(runs["hf"], samples), "dtype": dtype, "load_in_4bit": config.train.load_in_4bit,
                      "precision": precision, "evaluated_agreement": agreement,
                      "trained_agreement": trained_agreement(runs["hf"], samples, evaluated),
                      "base_trained_differ": sum(len(e) == 2 and e["base"]["parsed"] != e["trained"]["parsed"]
                                                 for e in (evaluated.get(s["id"], {}) for s in samples)),
                      "image_sensitivity": hf_sensitivity, **freed},
               "files": files}
    records = [{"model": name, "id": s["id"], "question": s["question"], "answer": s["answer"],
                "completion": a.text, "parsed": parse_answer(a.text), "tokens": len(a.token_ids)}
               for name, run in runs.items() for s, a in zip(samples, run.answers, strict=True)]
    metrics["peak_vram_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None
    failures = gate_failures(files, metrics["hf"], params)
    metrics["gate"] = {"passed": not failures, "failures": failures}
    write_jsonl(Path(reports_dir) / "predictions.jsonl", records)
    write_json(Path(reports_dir) / "metrics.json", metrics)
    # the headline `dvc exp show` prints: the verdict, and the worst counting accuracy of a shipped file
    write_json(Path(reports_dir) / "headline.json", {
        "passed": not failures, "gguf_accuracy": min((m["accuracy"] for m in files.values()), default=None)})
    return metrics, failures
