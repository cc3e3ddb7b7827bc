"""The export stage: merged checkpoint (logits = base + adapter), llama.cpp's GGUF text model, mmproj and
quantizations, the model card, and bad input that fails with one line and leaves no half-written output."""

from __future__ import annotations

import hashlib
import json
import shutil
import types
from pathlib import Path

import pytest
from conftest import stage, tiny_adapter, tiny_params, write_params

from vgrpo import export, models
from vgrpo.config import QUANTIZATIONS, config_from_dict
from vgrpo.gguf_runtime import GGUFError, k_quant_share, read_gguf

STEM = "qwen3vl-tiny-shapes-grpo"
# The evaluate stage's metrics.json: split -> model -> summary (plus figures that are not accuracies).
EVAL_METRICS = {"speed": {"samples": 32, "seconds": 3.2},
                "val": {"base": {"accuracy": 0.125, "accuracy_ci95": [0.0, 0.3]}, "trained": {"accuracy": 0.5},
                        "trained_minus_base": {"accuracy": 0.375}},
                "ood": {"base": {"accuracy": 0.0}, "trained": {"accuracy": 0.25},
                        "trained_minus_base": {"accuracy": 0.25}}}


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def export_args(root: Path, **paths) -> list[str]:
    default = {"base": root / "base", "adapter": root / "adapter", "merged": root / "merged", "gguf": root / "gguf",
               "data": root / "shapes",
               "eval-metrics": root / "eval.json"}
    return [arg for key, path in {**default, **paths}.items() for arg in (f"--{key}", str(path))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_base):
    """One real export of the tiny model (merge, two converter runs, q4_k_m), through the stage script."""
    root = tmp_path_factory.mktemp("export")
    params = write_params(root / "params.yaml", tiny_params())
    assert stage("generate", "--params", str(params), "--out", str(root / "shapes")).returncode == 0
    (root / "base").symlink_to(tiny_base)
    tiny_adapter(root / "adapter", tiny_base)
    (root / "eval.json").write_text(json.dumps(EVAL_METRICS))
    adapter_before = digest(root / "adapter")
    result = stage("export", "--params", str(params), *export_args(root))
    assert result.returncode == 0, result.stderr[-3000:]
    return types.SimpleNamespace(root=root, params=params, stdout=result.stdout, adapter_before=adapter_before)


def test_export_writes_merged_model_gguf_files_and_card(exported):
    root = exported.root
    merged = {p.name for p in (root / "merged").iterdir()}
    assert {"model.safetensors", "config.json", "processor_config.json", "tokenizer.json",
            "chat_template.jinja"} <= merged
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in merged)
    assert {p.name for p in (root / "gguf").iterdir()} == {
        f"{STEM}-f16.gguf", f"mmproj-{STEM}-f16.gguf", f"{STEM}-q4_k_m.gguf", "README.md"}
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
    assert digest(root / "adapter") == exported.adapter_before  # the adapter stays available as it was
    assert f"{root}/gguf/{STEM}-q4_k_m.gguf (q4_k_m, " in exported.stdout


def test_merged_logits_equal_base_plus_adapter(exported, tiny_base):
    import torch
    from peft import PeftModel

    from vgrpo.prompts import hf_messages
    from vgrpo.shapes import load_dataset

    config = config_from_dict(tiny_params())
    row = load_dataset(exported.root / "shapes", splits=("test",))["test"][0]
    processor = models.load_processor(str(exported.root / "merged"), config.model)
    inputs = processor.apply_chat_template(hf_messages(row["question"], row["image"]), add_generation_prompt=True,
                                           tokenize=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        merged = models.load_model(str(exported.root / "merged"), "float32").eval()(**inputs).logits
        adapted = PeftModel.from_pretrained(models.load_model(str(tiny_base), "float32"),
                                            str(exported.root / "adapter")).eval()
        unmerged = adapted(**inputs).logits
        with adapted.disable_adapter():
            base = adapted(**inputs).logits
    assert (merged - unmerged).abs().max().item() < 1e-4
    assert (merged - base).abs().max().item() > 1e-2  # the adapter really changed the model


def test_gguf_files_are_the_text_model_projector_and_k_quants(exported):
    gguf_dir = exported.root / "gguf"
    f16, q4 = read_gguf(gguf_dir / f"{STEM}-f16.gguf"), read_gguf(gguf_dir / f"{STEM}-q4_k_m.gguf")
    projector = read_gguf(gguf_dir / f"mmproj-{STEM}-f16.gguf", projector=True)
    assert (f16.architecture, projector.architecture) == ("qwen3vl", "clip")
    assert (f16.file_type, q4.file_type, projector.file_type) == ("f16", "q4_k_m", "f16")
    assert f16.width == q4.width == projector.width == 256  # the projector feeds this text model
    assert set(projector.tensor_types) <= {"F16", "F32"}  # the projector stays f16
    assert set(f16.tensor_types) <= {"F16", "F32"}
    # Text hidden 256: every quantized tensor gets a K-quant (Q4_K, Q6_K for the sensitive ones), no fallbacks.
    assert "Q4_K" in q4.tensor_types and k_quant_share(q4.tensor_types) == 1.0
    assert k_quant_share({"Q4_K": 3, "Q5_0": 1, "F32": 5}) == 0.75 and k_quant_share(f16.tensor_types) is None


def test_model_card(exported):
    card = (exported.root / "gguf" / "README.md").read_text()
    assert "tiny random Qwen3-VL" in card and "r=16, alpha=16" in card and "language and vision" in card
    assert "train 64, val 16, test 16, ood 16" in card
    assert "| accuracy | base | trained | trained_minus_base |" in card
    assert "| val | 0.125 | 0.500 | 0.375 |" in card and "| ood | 0.000 | 0.250 | 0.250 |" in card
    for how in [f"llama-mtmd-cli -m {STEM}-q4_k_m.gguf --mmproj mmproj-{STEM}-f16.gguf",
                f"llama-server -m {STEM}-q4_k_m.gguf --mmproj mmproj-{STEM}-f16.gguf",
                "MTMDChatHandler(clip_model_path=",
                "ollama/ollama#12896", "FROM ./models/merged", "--no-repack", "How many circles are in the image?"]:
        assert how in card, how
    assert not (exported.root / "gguf" / "Modelfile").exists()  # Ollama cannot load these split files


def test_model_card_names_the_hub_commit(exported):
    from vgrpo.gguf_runtime import find_gguf_files

    texts, projector = find_gguf_files(exported.root / "gguf")
    full = config_from_dict(tiny_params() | {"profile": "full"})
    source = {"kind": "hub", "name": full.model.name, "revision": full.model.revision, "sha": "f" * 40}
    card = export.model_card(full, source, STEM, texts, projector, exported.root / "adapter", exported.root / "shapes",
                             exported.root / "eval.json")
    assert f"Base model: `Qwen/Qwen3-VL-8B-Instruct@{'f' * 40}` (revision `{full.model.revision}`" in card


@pytest.mark.parametrize("content, expected", [
    (None, "Evaluation results are missing: `{path}` does not exist"),
    ("{not json", "Evaluation results are missing: `{path}` is not readable JSON"),
    ("[1, 2]", "Evaluation results are missing: `{path}` holds no numeric `accuracy`"),
    ('{"val": {"trained": {"accuracy": "high"}}}', "holds no numeric `accuracy`"),
    ('{"accuracy": 0.5, "test": {"accuracy": 0.25}}', "| result | accuracy |\n|---|---|\n| overall | 0.500 |\n"
                                                       "| test | 0.250 |"),
    ('{"val": {"base": {"accuracy": 0.1}}, "ood": {"trained": {"accuracy": 0.2}}}',
     "| accuracy | base | trained |\n|---|---|---|\n| val | 0.100 |  |\n| ood |  | 0.200 |"),
], ids=["missing", "not json", "a list", "not a number", "flat", "sparse grid"])
def test_eval_table_renders_whatever_accuracy_it_finds(content, expected, tmp_path):
    path = tmp_path / "metrics.json"
    if content is not None:
        path.write_text(content)
    assert expected.format(path=path) in export.eval_table(path)


# --- Bad input: one line, exit 2, nothing half-written ---------------------------------------------

def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_unknown_quantization_lists_the_valid_ones(exported, tmp_path):
    with pytest.raises(export.ExportError, match=r"unknown quantization 'q4_k_xl' \(expected one of q4_0, q4_1"):
        export.quantize(exported.root / "gguf" / f"{STEM}-f16.gguf", tmp_path / "out.gguf", "q4_k_xl")
    assert not (tmp_path / "out.gguf").exists()
    params = write_params(tmp_path / "params.yaml", tiny_params(export={"quantizations": ["q4_k_xl"]}))
    result = stage("export", "--params", str(params), *export_args(exported.root, merged=tmp_path / "m",
                                                                   gguf=tmp_path / "g"))
    assert result.returncode == 2
    assert last_line(result) == ("error: params.yaml: export.quantizations: unknown quantization 'q4_k_xl' (expected "
                                 f"one of {', '.join(QUANTIZATIONS)})")


def test_truncated_gguf_is_refused_before_llama_cpp_reads_it(exported, tmp_path):
    source = (exported.root / "gguf" / f"{STEM}-f16.gguf").read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source[: len(source) // 2])
    with pytest.raises(GGUFError, match=f"{truncated}: truncated or corrupt GGUF"):
        export.quantize(truncated, tmp_path / "out.gguf", "q4_k_m")
    assert not (tmp_path / "out.gguf").exists()


def test_missing_adapter(exported, tmp_path):
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, adapter=tmp_path / "a", merged=tmp_path / "m", gguf=tmp_path / "g"))
    assert result.returncode == 2
    assert last_line(result) == f"error: {tmp_path / 'a'}: no LoRA adapter here (run the train stage: dvc repro train)"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_converter_fails_before_the_merge(exported, tmp_path):
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, merged=tmp_path / "m", gguf=tmp_path / "g"),
                   env={"VGRPO_LLAMA_CPP_DIR": str(tmp_path / "nowhere")})
    assert result.returncode == 2
    assert last_line(result).startswith(f"error: {tmp_path / 'nowhere'}: llama.cpp converter not found (run ./setup.sh")
    assert not (tmp_path / "m").exists() and not (tmp_path / "g").exists()


def test_failing_converter_keeps_the_previous_export(exported, tmp_path):
    converter = tmp_path / "llama.cpp"
    converter.mkdir()
    (converter / "convert_hf_to_gguf.py").write_text(
        "import sys\nprint('INFO: loading', file=sys.stderr)\nprint('NotImplementedError: Architecture not supported',"
        " file=sys.stderr)\nsys.exit(1)\n")
    previous = tmp_path / "gguf"
    shutil.copytree(exported.root / "gguf", previous)
    before = digest(previous)
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, merged=tmp_path / "merged", gguf=previous),
                   env={"VGRPO_LLAMA_CPP_DIR": str(converter)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert last_line(result) == (f"error: {converter / 'convert_hf_to_gguf.py'} failed on {tmp_path / 'merged'} "
                                 "(exit 1): NotImplementedError: Architecture not supported")
    assert digest(previous) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gguf", "llama.cpp", "merged"]  # no temp dirs

