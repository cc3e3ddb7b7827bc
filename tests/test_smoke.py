"""The smoke stage: every GGUF answers test images in llama.cpp, parity with the merged model is measured
and gated (a broken projector fails the stage), bad files fail with one line before llama.cpp reads
them, and the GGUF-vs-transformers benchmark prints its figure."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, stage, tiny_adapter, tiny_params, write_params

from vgrpo import gguf_files, hf_reference, llama_runtime
from vgrpo import smoke as gate
from vgrpo.answers import Answer, Forced, Run, likely_tokens, likely_tv, logprob_diff
from vgrpo.config import ConfigError, config_from_dict

STEM = "Qwen3-VL-tiny-shapes-grpo"  # llama.cpp's naming convention (vgrpo.export.gguf_name)
# One thread: this machine has two cores, shared with whatever else runs.
SMOKE = {"n_threads": 1}
EVALUATE = {"splits": ["test"], "max_samples": {"test": 8}, "attention_samples": 0}  # the smoke images
TIGHT = gate.TOLERANCES[("float32", "unquantized")]  # a float32 reference against an F16 file
LOOSE = gate.TOLERANCES[("float32", "quantized")]
# An adapter that changes about half of the base's answers (base and trained differ), so far from any trained
# model that its answers sit on knife edges: a 4-bit file flips many of them, so only F16 files are compared.
TRAINED_SCALE = 0.1


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_base):
    """The tiny model with an adapter: evaluate's answers (the stage, on the smoke images), then exported
    in-process (merge, GGUF F16 + mmproj, Q4_K_M)."""
    from vgrpo.export import run_export

    root = tmp_path_factory.mktemp("smoke")
    params = write_params(root / "params.yaml", tiny_params(smoke=SMOKE, evaluate=EVALUATE))
    assert stage("generate", "--params", str(params), "--out", str(root / "shapes")).returncode == 0
    adapter = tiny_adapter(root / "adapter", tiny_base)
    result = stage("evaluate", "--params", str(params), "--data", str(root / "shapes"), "--base", str(tiny_base),
                   "--adapter", str(adapter), "--reports", str(root / "eval"))
    assert result.returncode == 0, result.stderr[-3000:]
    config = config_from_dict(tiny_params(smoke=SMOKE, evaluate=EVALUATE))
    run_export(config, tiny_base, adapter, root / "shapes", root / "merged", root / "gguf")
    return types.SimpleNamespace(root=root, params=params, config=config, base=tiny_base)


def smoke_args(root: Path, gguf: Path | None = None, merged: Path | None = None, reports: Path | None = None):
    return ["--merged", str(merged or root / "merged"), "--gguf", str(gguf or root / "gguf"), "--data",
            str(root / "shapes"), "--eval-predictions", str(root / "eval" / "predictions.jsonl"), "--reports",
            str(reports or root / "reports")]


@pytest.fixture(scope="module")
def smoked(exported):
    result = stage("smoke", "--params", str(exported.params), *smoke_args(exported.root))
    assert result.returncode == 0, result.stderr[-3000:]
    reports = exported.root / "reports"
    predictions = [json.loads(line) for line in (reports / "predictions.jsonl").read_text().splitlines()]
    return types.SimpleNamespace(stdout=result.stdout, metrics=json.loads((reports / "metrics.json").read_text()),
                                 predictions=predictions)


@pytest.mark.slow
def test_the_transformers_model_is_freed_before_llama_cpp_loads(smoked):
    hf = smoked.metrics["hf"]
    held = hf["memory_freed_gb"]
    assert 0.1 < held < 1.0  # the tiny model's float32 weights (~0.16 GB), on this CPU machine
    assert hf["model_released"] is True  # no reference keeps it alive (on a GPU, its memory would stay taken)
    assert hf["gpu_free_gb_loaded"] is None and hf["gpu_free_gb_after"] is None  # no GPU here
    assert f"freed the transformers model ({held:.2f} GiB of weights) before llama.cpp loads" in smoked.stdout


@pytest.mark.slow
def test_a_model_kept_alive_by_a_caller_is_reported_as_not_released(exported, monkeypatch):
    """The measure can fail: a reference kept outside run_hf (as the landed code's own `model` variable
    was) shows as model_released false."""
    kept = []
    load_model = hf_reference.models.load_model
    monkeypatch.setattr(hf_reference.models, "load_model", lambda *a, **k: kept.append(load_model(*a, **k)) or kept[-1])
    samples = gate.smoke_samples(exported.root / "shapes", 2)
    _, freed = hf_reference.run_hf(exported.root / "merged", exported.config, "float32", samples)
    assert freed["model_released"] is False and kept


@pytest.mark.slow
def test_llama_cpp_layers_on_the_gpu(exported):
    """auto: none without a GPU (this machine); a number is used as given."""
    import dataclasses

    texts, projector = gguf_files.find_gguf_files(exported.root / "gguf")
    params = exported.config.smoke
    assert params.n_gpu_layers == "auto" and llama_runtime.gpu_layers(texts[0], projector, params) == 0
    assert llama_runtime.gpu_layers(texts[0], projector, dataclasses.replace(params, n_gpu_layers=7)) == 7
    assert {t.layers for t in texts} == {2}  # the tiny model's block count, from the header


@pytest.mark.slow
def test_every_gguf_answers_and_matches_the_merged_model(smoked):
    files = smoked.metrics["files"]
    assert set(files) == {f"{STEM}-F16.gguf", f"{STEM}-Q4_K_M.gguf"}
    f16, q4 = files[f"{STEM}-F16.gguf"], files[f"{STEM}-Q4_K_M.gguf"]
    for m in (f16, q4):
        assert m["mmproj"] == f"mmproj-{STEM}-F16.gguf"
        assert m["load_seconds"] > 0 and m["tokens_per_second"] > 0 and m["n_gpu_layers"] == 0
        assert 0 <= m["parse_rate"] <= 1 and 0 <= m["accuracy"] <= 1
        assert m["projector_error"] < 1e-3  # measured 2e-4: the mmproj gives the merged model's image embeddings
        assert m["count_tv"] is not None and m["count_tv"] < 0.05
        assert m["template_agreement"] >= 0.9 and m["image_sensitivity"] is not None
    assert f16["file_type"] == "f16" and f16["count_agreement"] >= 0.95 and f16["answer_agreement"] >= 0.9
    assert f16["first_token_logprob_diff"] < 0.01  # measured 2e-6
    assert q4["file_type"] == "q4_k_m" and q4["answer_agreement"] >= 0.8 and q4["count_agreement"] >= 0.8
    assert q4["accuracy_drop"] <= 0.25 and q4["first_token_logprob_diff"] < 0.5
    assert q4["k_quant_share"] == 1.0 and "Q4_K" in q4["tensor_types"]  # no legacy fallbacks at hidden 256
    hf = smoked.metrics["hf"]
    assert hf["tokens_per_second"] > 0 and hf["parse_rate"] == 1.0  # the warm-started model answers in format
    assert hf["evaluated_agreement"] == 1.0  # the merged model answers as evaluate's base + adapter did
    assert smoked.metrics["num_images"] == 8
    assert "smoke: 2 GGUF files pass" in smoked.stdout


@pytest.mark.slow
def test_predictions_keep_every_answer(smoked):
    by_model = {}
    for record in smoked.predictions:
        by_model.setdefault(record["model"], []).append(record)
    assert set(by_model) == {"hf", f"{STEM}-F16.gguf", f"{STEM}-Q4_K_M.gguf"}
    for records in by_model.values():
        assert [r["id"] for r in records] == [f"test-{i:05d}" for i in range(8)]
        assert all(r["tokens"] > 0 and isinstance(r["completion"], str) for r in records)


def break_projector(source: Path, dest: Path, how: str) -> Path:
    """A copy of the export (f16 text model only) whose projector's weights are zeros, or have noise added."""
    import gguf

    dest.mkdir()
    for name in (f"{STEM}-F16.gguf", f"mmproj-{STEM}-F16.gguf"):
        shutil.copy(source / name, dest / name)
    rng = np.random.default_rng(0)
    for tensor in gguf.GGUFReader(dest / f"mmproj-{STEM}-F16.gguf", "r+").tensors:
        data = tensor.data
        # "noise": each weight moved by half its tensor's spread, a damaged file that still runs
        data[...] = 0 if how == "zeros" else data + rng.standard_normal(data.shape) * 0.5 * float(np.std(data))
    return dest


@pytest.mark.slow
@pytest.mark.parametrize("how", ["noise"])  # zeros: the image-sensitivity test below
def test_a_broken_projector_fails_the_stage(how, exported, tmp_path):
    broken = break_projector(exported.root / "gguf", tmp_path / "gguf", how)
    result = stage("smoke", "--params", str(exported.params),
                   *smoke_args(exported.root, gguf=broken, reports=tmp_path / "reports"))
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: smoke: ")]
    text = broken / f"{STEM}-F16.gguf"
    assert any(re.fullmatch(rf"error: smoke: {re.escape(str(text))}: projector_error [0-9.e+]+ > "
                            rf"{TIGHT.projector_error:.4g} \(float32 reference, unquantized file\)", line)
               for line in errors), errors
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())  # kept for the post-mortem
    error = metrics["files"][f"{STEM}-F16.gguf"]["projector_error"]
    assert error == pytest.approx(1.0) if how == "zeros" else error > 0.1


@pytest.mark.slow
def test_a_projector_that_ignores_the_image_fails_on_image_sensitivity(exported, tmp_path):
    """A zeroed projector hands llama.cpp constant embeddings: the file's counts no longer move with the
    image (real vs blank), while the merged model's do. The tiny profile leaves this gate off (its warm
    start barely looks at the image, TV ~7e-4); here it is on, as a share of the merged model's."""
    broken = break_projector(exported.root / "gguf", tmp_path / "gguf", "zeros")
    raw = tiny_params(smoke={**SMOKE, "min_image_sensitivity_ratio": 0.5}, evaluate=EVALUATE)
    params = write_params(tmp_path / "params.yaml", raw)
    result = stage("smoke", "--params", str(params), *smoke_args(exported.root, gguf=broken,
                                                                  reports=tmp_path / "reports"))
    assert result.returncode == 1, result.stderr[-3000:]
    text = broken / f"{STEM}-F16.gguf"
    assert any(re.fullmatch(rf"error: smoke: {re.escape(str(text))}: image_sensitivity 0 < [0-9.e-]+ "
                            r"\(smoke.min_image_sensitivity_ratio\)", line)
               for line in result.stderr.splitlines()), result.stderr[-2000:]
    assert any(re.fullmatch(rf"error: smoke: {re.escape(str(text))}: projector_error 1 > {TIGHT.projector_error:.4g} "
                            r"\(float32 reference, unquantized file\)", line) for line in result.stderr.splitlines())
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())  # kept for the post-mortem
    assert metrics["files"][f"{STEM}-F16.gguf"]["image_sensitivity"] == 0 < metrics["hf"]["image_sensitivity"]
    assert metrics["files"][f"{STEM}-F16.gguf"]["projector_error"] == pytest.approx(1.0)


def permute_digits(path: Path, tokenizer) -> None:
    """Rotate the embedding rows of the tokens 0..9 in a GGUF (the tiny model ties input and output
    embeddings): wherever the model would say one count it says the next one, in the same template."""
    import gguf

    digits = tokenizer.convert_tokens_to_ids([str(d) for d in range(10)])
    for tensor in gguf.GGUFReader(path, "r+").tensors:
        if tensor.name == "token_embd.weight":
            rows = tensor.data[digits].copy()
            tensor.data[digits] = np.roll(rows, 1, axis=0)
            return
    raise AssertionError("no token_embd.weight")


@pytest.mark.slow
def test_an_export_whose_counts_are_all_wrong_fails_though_its_template_agrees(exported, tmp_path):
    """Every count wrong, every tag, colour and shape word right: the template agrees (as the first-16-token
    agreement smoke gated until now would have), the counts do not, and the gate says so."""
    from transformers import AutoTokenizer

    gguf_dir = tmp_path / "gguf"
    gguf_dir.mkdir()
    for name in (f"{STEM}-F16.gguf", f"mmproj-{STEM}-F16.gguf"):
        shutil.copy(exported.root / "gguf" / name, gguf_dir / name)
    permute_digits(gguf_dir / f"{STEM}-F16.gguf", AutoTokenizer.from_pretrained(exported.root / "merged"))
    result = stage("smoke", "--params", str(exported.params),
                   *smoke_args(exported.root, gguf=gguf_dir, reports=tmp_path / "reports"))
    assert result.returncode == 1, result.stderr[-3000:]
    text = gguf_dir / f"{STEM}-F16.gguf"
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"error: smoke: {text}: ")]
    expected = rf": count_agreement 0 < {TIGHT.count_agreement:.4g} \(float32 reference, unquantized file\)$"
    assert any(re.search(expected, e) for e in errors), errors
    assert any("answer_agreement" in e for e in errors), errors
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())["files"][text.name]
    assert metrics["template_agreement"] >= 0.8 and metrics["count_agreement"] == 0


def gguf_of(adapter: Path, exported, dest: Path) -> Path:
    """The F16 GGUF files (text model, projector) of an adapter on the exported model's base, and its merge."""
    from vgrpo.export import run_export

    run_export(exported.config, exported.base, adapter, exported.root / "shapes", dest / "merged", dest / "gguf")
    (dest / "gguf" / f"{STEM}-Q4_K_M.gguf").unlink()
    return dest / "gguf"


@pytest.fixture(scope="module")
def trained(exported, tmp_path_factory):
    """An adapter whose answers differ from the base's on about half of the smoke images, evaluated, exported
    (F16 only) and smoked: its own file answers as evaluate's trained model did where it differs from the base."""
    root = tmp_path_factory.mktemp("trained")
    adapter = tiny_adapter(root / "adapter", exported.base, scale=TRAINED_SCALE)
    result = stage("evaluate", "--params", str(exported.params), "--data", str(exported.root / "shapes"), "--base",
                   str(exported.base), "--adapter", str(adapter), "--reports", str(root / "eval"))
    assert result.returncode == 0, result.stderr[-3000:]
    gguf_of(adapter, exported, root)
    args = smoke_args(exported.root, gguf=root / "gguf", merged=root / "merged", reports=root / "reports")
    args[args.index("--eval-predictions") + 1] = str(root / "eval" / "predictions.jsonl")
    result = stage("smoke", "--params", str(exported.params), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return types.SimpleNamespace(root=root, args=args, metrics=json.loads((root / "reports/metrics.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("other", ["second run", "the base"])
def test_smoke_tells_the_evaluated_model_from_another(other, exported, trained, tmp_path):
    """A second training run's file (another adapter of the same size), or the base model's (an adapter at 0),
    put where the evaluated model's belongs: several measures refuse it, the answers evaluate's trained model
    gave where it differs from its base among them. The evaluated model's own file measures 1.0 there."""
    assert trained.metrics["hf"]["base_trained_differ"] >= 2  # something to tell apart on 8 images
    assert trained.metrics["files"][f"{STEM}-F16.gguf"]["trained_agreement"] == 1.0
    assert trained.metrics["hf"]["trained_agreement"] == 1.0
    adapter = tiny_adapter(tmp_path / "adapter", exported.base, seed=1, scale=TRAINED_SCALE if other == "second run"
                           else 0.0)
    gguf_dir = gguf_of(adapter, exported, tmp_path)
    args = list(trained.args)
    args[args.index("--gguf") + 1], args[args.index("--reports") + 1] = str(gguf_dir), str(tmp_path / "reports")
    result = stage("smoke", "--params", str(exported.params), *args)
    assert result.returncode == 1, result.stderr[-3000:]
    text = gguf_dir / f"{STEM}-F16.gguf"
    failed = {line.split(": ")[3].split()[0] for line in result.stderr.splitlines()
              if line.startswith(f"error: smoke: {text}: ")}
    assert "trained_agreement" in failed and len(failed) >= 3, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "reports" / "metrics.json").read_text())["files"][text.name]
    assert metrics["trained_agreement"] < 0.5


@pytest.mark.slow
def test_a_merge_that_dropped_the_adapter_stops_smoke_before_llama_cpp(exported, tmp_path):
    """evaluate scored base + an adapter that changes about half the answers; the base model stands where
    the merged one should (as a merge that silently drops the adapter leaves it): it answers the smoke
    images otherwise than evaluate did, so smoke stops in one line, before llama.cpp."""
    adapter = tiny_adapter(tmp_path / "adapter", exported.base, scale=0.1)
    result = stage("evaluate", "--params", str(exported.params), "--data", str(exported.root / "shapes"), "--base",
                   str(exported.base), "--adapter", str(adapter), "--reports", str(tmp_path / "eval"))
    assert result.returncode == 0, result.stderr[-3000:]
    merged = tmp_path / "merged"
    shutil.copytree(exported.base, merged)
    args = smoke_args(exported.root, merged=merged, reports=tmp_path / "reports")
    args[args.index("--eval-predictions") + 1] = str(tmp_path / "eval" / "predictions.jsonl")
    result = stage("smoke", "--params", str(exported.params), *args)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"error: {re.escape(str(merged))}: the merged model answers \d of 8 smoke images as "
                        rf"evaluate's trained model did \([0-9.]+ < {TIGHT.evaluated_agreement:g}, the bound for a "
                        r"float32 reference; test-\d{5}: \d "
                        r"here, \d in evaluate\): the merge is not the evaluated model \(a dropped adapter or LoRA "
                        r"module\?\)", line)
    assert not (tmp_path / "reports").exists()


def corrupt_weights(path: Path, tensor_name: str, seed: int = 0) -> None:
    """Overwrite one tensor's quantized bytes with random bytes: the header stays valid, so llama.cpp
    loads the file and answers, from damaged weights."""
    import gguf

    rng = np.random.default_rng(seed)
    for tensor in gguf.GGUFReader(path, "r+").tensors:
        if tensor.name == tensor_name:
            raw = tensor.data.view(np.uint8)
            raw[...] = rng.integers(0, 256, size=raw.shape, dtype=np.uint8)
            return
    raise AssertionError(f"no tensor {tensor_name}")


@pytest.mark.slow
def test_a_corrupted_quantized_file_fails_the_stage(exported, tmp_path):
    gguf_dir = tmp_path / "gguf"
    shutil.copytree(exported.root / "gguf", gguf_dir)
    quantized = gguf_dir / f"{STEM}-Q4_K_M.gguf"
    corrupt_weights(quantized, "blk.1.ffn_down.weight")
    result = stage("smoke", "--params", str(exported.params),
                   *smoke_args(exported.root, gguf=gguf_dir, reports=tmp_path / "reports"))
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith(f"error: smoke: {quantized}: ")]
    assert errors and all(line.endswith(("(float32 reference, quantized file)", "(smoke.max_quant_accuracy_drop)"))
                          for line in errors), errors
    assert not any(str(gguf_dir / f"{STEM}-F16.gguf") in line for line in result.stderr.splitlines())


@pytest.mark.slow
def test_token_ids_are_the_ones_llama_cpp_generated_and_forcing_follows_the_reference(exported):
    texts, projector = gguf_files.find_gguf_files(exported.root / "gguf")
    sample = gate.smoke_samples(exported.root / "shapes", 1)[0]
    question, image = sample["question"], sample["image"]
    with llama_runtime.open_llama(texts[0], projector, exported.config.smoke) as (llama, load_seconds):
        answer = llama_runtime.llama_answer(llama, question, image, 8)
        text = llama.detokenize(answer.token_ids).decode("utf-8", errors="ignore")
        reference = llama.tokenize(b" There are 3 circles here.", add_bos=False)
        plain = llama_runtime.llama_forced(llama, question, image, reference, count_at=None)
        followed = llama.input_ids[llama.n_tokens - len(reference) + 1:llama.n_tokens].tolist()
        forced = llama_runtime.llama_forced(llama, question, image, reference, count_at=3)
        own = llama_runtime.llama_forced(llama, question, image, answer.token_ids, count_at=None)
    assert len(answer.token_ids) == 8 and load_seconds > 0
    assert text == answer.text
    assert answer.first_logprobs.shape == (151936,) and abs(np.exp(answer.first_logprobs).sum() - 1) < 1e-6
    assert followed == reference[:-1]  # generation went along the reference, not the model's own choices
    assert len(plain.choices) == len(reference) and plain.choices[0] == answer.token_ids[0]
    assert plain.count_logprobs is None and plain.blank_count_logprobs is None
    assert forced.choices == plain.choices and forced.count_logprobs.shape == (151936,)  # at the count position
    assert forced.blank_count_logprobs.shape == (151936,)  # the same position with a blank image
    assert own.choices == answer.token_ids and own.count_logprobs is None  # its own greedy path: its own tokens


@pytest.mark.slow
def test_projector_embeddings_match_transformers_token_by_token(exported):
    from vgrpo import models

    texts, projector = gguf_files.find_gguf_files(exported.root / "gguf")
    image = gate.smoke_samples(exported.root / "shapes", 1)[0]["image"]
    model = models.load_model(str(exported.root / "merged"), "float32").eval()
    processor = models.load_processor(str(exported.root / "merged"), exported.config.model)
    reference = hf_reference.hf_image_embeddings(model, processor, image)
    with llama_runtime.open_llama(texts[0], projector, exported.config.smoke) as (llama, _):
        embeddings = llama_runtime.llama_image_embeddings(llama, image)
    assert embeddings.shape == reference.shape == (64, 2 * 256)  # 64 image tokens; main + one deepstack layer
    assert gate.projector_error([embeddings], [reference]) < 1e-3
    assert gate.projector_error([np.zeros_like(reference)], [reference]) == 1.0
    assert gate.projector_error([embeddings[::-1]], [reference]) > 0.1  # the token order matters


# --- Measures -------------------------------------------------------------------------------------

def run_of(answers: list[list[int]], counts: list[list[int]] | None = None, choices=None) -> Run:
    """A Run of answers with these token ids (and, for llama.cpp, teacher-forced choices)."""
    made = [Answer("", ids, np.zeros(2), 0.1) for ids in answers]
    forced = None if choices is None else [Forced(c, None) for c in choices]
    return Run(made, 0.0, [np.ones((1, 2))] * len(made), forced=forced, count_positions=counts)


@pytest.mark.parametrize("choices, expected", [
    ([[10, 3, 11, 4, 12]], (1.0, 1.0)),
    ([[10, 3, 11, 9, 12]], (0.5, 1.0)),  # one count wrong: half the counts, no template token
    ([[10, 3, 13, 4, 14]], (1.0, 0.3333)),  # the template wrong, every count right (4 decimals)
    ([[10, 3]], (1.0, 1.0)),  # llama.cpp stopped early: only the positions it reached
])
def test_agreement_is_split_between_counts_and_template(choices, expected):
    reference = run_of([[10, 3, 11, 4, 12]], counts=[[1, 3]])
    assert gate.forced_agreement(run_of([[0]], choices=choices), reference) == expected


def test_logprob_diff_and_tv_look_at_the_likely_tokens_only():
    moved = [np.log([0.7, 0.1, 0.1, 0.1]), np.log([0.1, 0.7, 0.1, 0.1])]
    assert logprob_diff(moved[0], moved[0]) == 0
    assert logprob_diff(moved[1], moved[0]) == pytest.approx(np.log(7))
    assert likely_tv(moved[0], moved[0]) == 0
    assert likely_tv(moved[1], moved[0]) == pytest.approx(0.6)
    # A tail token (p 1e-5 in the reference) moved 100-fold, as a bf16 reference moves it: not counted.
    reference = np.log([0.6, 0.39999, 0.00001])
    tail_moved = np.log([0.6, 0.399, 0.001])
    assert logprob_diff(tail_moved, reference) == pytest.approx(np.log(0.39999 / 0.399))
    assert list(likely_tokens(reference)) == [0, 1]


def test_two_answers_without_a_number_do_not_agree():
    def answer(text):
        return Answer(text, [1], np.zeros(2), 0.1)

    reference = Run([answer("no idea"), answer("<SOLUTION>3</SOLUTION>")], 0.0, [np.ones((1, 2))] * 2,
                       count_positions=[[], []])
    run = Run([answer("still no idea"), answer("3")], 0.0, [np.ones((1, 2))] * 2,
                 forced=[Forced([1], None)] * 2)
    assert gate.parity(run, reference)["answer_agreement"] == 0.5


GOOD = {"count_agreement": 1.0, "count_tv": 0.001, "answer_agreement": 1.0, "trained_agreement": 1.0,
        "first_token_logprob_diff": 0.001, "image_sensitivity": 0.3, "projector_error": 2e-4, "accuracy": 0.5}


def test_gates_name_file_measure_value_and_where_the_bound_comes_from():
    smoke = {"min_image_sensitivity": 0.1, "min_image_sensitivity_ratio": 0.5, "max_quant_accuracy_drop": 0.25}
    params = config_from_dict(tiny_params(smoke=smoke)).smoke
    files = {"a": {**GOOD, "path": "g/a-F16.gguf", "file_type": "f16", "count_agreement": 0.25},
             "b": {**GOOD, "path": "g/b-Q4_K_M.gguf", "file_type": "q4_k_m", "answer_agreement": 0.25,
                   "count_tv": 0.9, "first_token_logprob_diff": 0.3, "accuracy": 0.0},
             "c": {**GOOD, "path": "g/c-BF16.gguf", "file_type": "bf16", "projector_error": 0.9,
                   "image_sensitivity": 0.0},
             "d": {**GOOD, "path": "g/d-Q8_0.gguf", "file_type": "q8_0", "count_agreement": None},
             "e": {**GOOD, "path": "g/e-Q8_0.gguf", "file_type": "q8_0", "trained_agreement": None},
             "f": {**GOOD, "path": "g/f-F16.gguf", "file_type": "f16", "trained_agreement": 0.5}}
    reference = {"image_sensitivity": 0.4, "accuracy": 0.5, "precision": "float32"}
    bf16 = gate.TOLERANCES[("bfloat16", "unquantized")]
    assert gate.gate_failures(files, reference, params) == [
        f"g/a-F16.gguf: count_agreement 0.25 < {TIGHT.count_agreement:.4g} (float32 reference, unquantized file)",
        f"g/b-Q4_K_M.gguf: count_tv 0.9 > {LOOSE.count_tv:.4g} (float32 reference, quantized file)",
        f"g/b-Q4_K_M.gguf: answer_agreement 0.25 < {LOOSE.answer_agreement:.4g} (float32 reference, quantized file)",
        "g/b-Q4_K_M.gguf: accuracy_drop 0.5 > 0.25 (smoke.max_quant_accuracy_drop)",
        # a BF16 file is a bfloat16 model, whatever the reference: bfloat16's bounds
        f"g/c-BF16.gguf: projector_error 0.9 > {bf16.projector_error:.4g} (bfloat16 reference, unquantized file)",
        "g/c-BF16.gguf: image_sensitivity 0 < 0.2 (smoke.min_image_sensitivity_ratio)",
        "g/d-Q8_0.gguf: count_agreement: no answer of the merged model states a count, nothing to compare "
        "(float32 reference, quantized file)",
        # e: base and trained answered alike on every image: nothing to tell apart, not a failure
        f"g/f-F16.gguf: trained_agreement 0.5 < {TIGHT.trained_agreement:.4g} (float32 reference, unquantized file)"]
    blind = gate.gate_failures({}, {**reference, "image_sensitivity": 0.01}, params)
    assert blind == ["the merged model: image_sensitivity 0.01 < 0.1 (smoke.min_image_sensitivity)"]


def test_bounds_follow_the_coarser_of_reference_and_file():
    assert gate.comparison_precision("float32", False, "f16") == "float32"
    assert gate.comparison_precision("float32", False, "bf16") == "bfloat16"
    assert gate.comparison_precision("bfloat16", False, "f16") == "bfloat16"
    assert gate.comparison_precision("float16", False, "f16") == "bfloat16"  # not measurable on a CPU: bf16 bounds it
    assert gate.comparison_precision("float32", True, "bf16") == "4bit"
    for precision in ("float32", "bfloat16", "4bit"):  # each coarser precision is at least as lenient
        tight, loose = gate.TOLERANCES[(precision, "unquantized")], gate.TOLERANCES[(precision, "quantized")]
        assert loose.count_tv >= tight.count_tv and loose.answer_agreement <= tight.answer_agreement
    order = [gate.TOLERANCES[(p, "unquantized")] for p in ("float32", "bfloat16", "4bit")]
    assert [t.count_tv for t in order] == sorted(t.count_tv for t in order)
    assert [t.evaluated_agreement for t in order] == sorted((t.evaluated_agreement for t in order), reverse=True)


def test_figures_of_a_file_that_is_nearly_the_model_fail_the_float32_bounds():
    """What a new user fed the old gate and it passed: a file that answers 29 of 32 images alike (first-count
    TV 0.04), and a projector 4% off. A faithful F16 file measured 1.0 and 2e-4 (docs/stages.md)."""
    params = config_from_dict(tiny_params()).smoke
    reference = {"image_sensitivity": 0.3, "accuracy": 0.5, "precision": "float32"}
    nearly = {**GOOD, "path": "near-F16.gguf", "file_type": "f16", "answer_agreement": round(29 / 32, 4),
              "count_tv": 0.04}
    off = {**GOOD, "path": "off-F16.gguf", "file_type": "f16", "projector_error": 0.04}
    failures = gate.gate_failures({"near": nearly, "off": off}, reference, params)
    assert [f.split(":")[1].split()[0] for f in failures] == ["count_tv", "answer_agreement", "projector_error"]
    assert gate.gate_failures({"good": {**GOOD, "path": "F16.gguf", "file_type": "f16"}}, reference, params) == []


def answer_of(text: str, cut: bool = False) -> Answer:
    return Answer(text, [1], np.zeros(2), 0.1, cut=cut)


@pytest.mark.parametrize("text, cut, record, same", [
    ("<SOLUTION>3</SOLUTION>", False, {"completion": "<REASONING>x</REASONING><SOLUTION>3</SOLUTION>", "parsed": 3},
     True),
    ("<SOLUTION>4</SOLUTION>", False, {"completion": "<SOLUTION>3</SOLUTION>", "parsed": 3}, False),
    ("", False, {"completion": "<SOLUTION>3</SOLUTION>", "parsed": 3}, False),  # empty: agreed with anything before
    ("<SOLUTION>3", True, {"completion": "<SOLUTION>3</SOLUTION>", "parsed": 3}, True),  # cut: the text so far
    ("<SOLUTION>4", True, {"completion": "<SOLUTION>3</SOLUTION>", "parsed": 3}, False),
    ("", True, {"completion": "<SOLUTION>3</SOLUTION>", "parsed": 3}, False),  # an empty prefix agrees with nothing
    ("<REASONING>2 red", False, {"completion": "<REASONING>2 red triangles", "parsed": 2, "truncated": True}, True),
    ("no idea", False, {"completion": "no idea", "parsed": None}, True),  # the same words, both finished
    ("no clue", False, {"completion": "no idea", "parsed": None}, False),
])
def test_an_answer_is_evaluates_by_its_count_unless_it_was_cut(text, cut, record, same):
    assert gate.same_answer(answer_of(text, cut), record) is same


def test_trained_agreement_looks_where_base_and_trained_differ():
    samples = [{"id": f"test-{i}"} for i in range(4)]
    evaluated = {f"test-{i}": {"base": {"parsed": base}, "trained": {"parsed": trained}}
                 for i, (base, trained) in enumerate([(1, 1), (2, 3), (4, 5), (2, 2)])}
    run = Run([answer_of(f"<SOLUTION>{n}</SOLUTION>") for n in (9, 3, 4, 9)], 0.0, [])
    assert gate.trained_agreement(run, samples, evaluated) == 0.5  # 3 as trained on test-1; 4 as the base on test-2
    alike = {k: {"base": v["trained"], "trained": v["trained"]} for k, v in evaluated.items()}
    assert gate.trained_agreement(run, samples, alike) is None


def test_n_ctx_must_leave_room_for_the_prompt():
    with pytest.raises(ConfigError, match="smoke.n_ctx: 256 leaves no room for the prompt"):
        config_from_dict(tiny_params(smoke={"n_ctx": 256}))


# --- Bad files: one line, exit 2, before llama.cpp reads anything ------------------------------------

@pytest.mark.slow
def test_header_reader_agrees_with_the_gguf_package(exported):
    import gguf

    path = exported.root / "gguf" / f"mmproj-{STEM}-F16.gguf"
    reader = gguf.GGUFReader(path)
    info = gguf_files.read_gguf(path, projector=True)
    assert info.width == reader.fields["clip.vision.projection_dim"].contents()
    assert info.file_type == gguf_files.FILE_TYPES[reader.fields["general.file_type"].contents()]
    assert sum(info.tensor_types.values()) == len(reader.tensors)
    assert set(info.tensor_types) == {t.tensor_type.name for t in reader.tensors}


def small_gguf(path: Path, architecture: str, width: int) -> Path:
    """A valid GGUF of the given architecture and width (a projector's output width for `clip`)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    if architecture == "clip":
        writer.add_vision_projection_dim(width)
    else:
        writer.add_embedding_length(width)
    writer.add_tensor("token_embd.weight", np.zeros((4, 256), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.slow
@pytest.mark.parametrize("damage, message", [
    ("truncated", "{text}: truncated or corrupt GGUF (tensor token_embd.weight ends at byte "),
    ("not gguf", "{text}: not a GGUF file (starts with b'PK\\x03\\x04', expected b'GGUF')"),
    ("foreign", "{text}: not a Qwen3-VL text model: general.architecture is 'llama', expected 'qwen3vl'"),
    ("text model as projector", "{projector}: not a vision projector (mmproj): general.architecture is 'qwen3vl', "
                                "expected 'clip'"),
    ("projector of another model", "{projector}: projects to width 64, but " + STEM + "-F16.gguf has embedding "
                                   "length 256: the projector belongs to another model"),
    ("no projector", "{gguf}: expected one mmproj-*.gguf, found 0"),
])
def test_bad_gguf_files_are_refused(damage, message, exported, tmp_path):
    gguf_dir = tmp_path / "gguf"
    shutil.copytree(exported.root / "gguf", gguf_dir)
    text, projector = gguf_dir / f"{STEM}-F16.gguf", gguf_dir / f"mmproj-{STEM}-F16.gguf"
    if damage == "truncated":
        text.write_bytes(text.read_bytes()[: text.stat().st_size // 2])
    elif damage == "not gguf":
        text.write_bytes(b"PK\x03\x04 a zip archive")
    elif damage == "foreign":
        small_gguf(text, "llama", 256)
    elif damage == "projector of another model":
        small_gguf(projector, "clip", 64)
    elif damage == "text model as projector":
        shutil.copy(text, projector)
    else:
        projector.unlink()
    with pytest.raises(gguf_files.GGUFError) as error:
        gguf_files.find_gguf_files(gguf_dir)
    assert str(error.value).startswith(message.format(text=text, projector=projector, gguf=gguf_dir))


@pytest.mark.slow
def test_stage_refuses_a_truncated_gguf_without_crashing(exported, tmp_path):
    gguf_dir = tmp_path / "gguf"
    shutil.copytree(exported.root / "gguf", gguf_dir)
    quantized = gguf_dir / f"{STEM}-Q4_K_M.gguf"
    quantized.write_bytes(quantized.read_bytes()[:-1000])
    result = stage("smoke", "--params", str(exported.params),
                   *smoke_args(exported.root, gguf=gguf_dir, reports=tmp_path / "reports"))
    assert result.returncode == 2, result.stderr[-2000:]  # not -11: llama.cpp never saw the file
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {quantized}: truncated or corrupt GGUF (tensor ")
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_stage_needs_the_merged_model(exported, tmp_path):
    result = stage("smoke", "--params", str(exported.params),
                   *smoke_args(exported.root, merged=tmp_path / "merged", reports=tmp_path / "reports"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (f"error: {tmp_path / 'merged'}: no merged model here (run the "
                                                      "export stage: dvc repro export)")


# --- Speed ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_benchmark_prints_tokens_per_second_and_the_ratio(exported):
    command = [sys.executable, str(ROOT / "bench" / "gguf_vs_hf.py"), "--params", str(exported.params), "--merged",
               str(exported.root / "merged"), "--gguf", str(exported.root / "gguf"), "--data",
               str(exported.root / "shapes"), "--images", "2", "--max-new-tokens", "8", "--threads", "1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"^transformers float32: [0-9.]+ tokens/s \(16 tokens in ", result.stdout, re.MULTILINE)
    assert re.search(rf"^llama.cpp {STEM}-Q4_K_M.gguf: [0-9.]+ tokens/s \(16 tokens in ", result.stdout, re.MULTILINE)
    assert re.search(r"^speed-up: [0-9.]+x \((meets|misses) the 2x goal\)$", result.stdout, re.MULTILINE)
