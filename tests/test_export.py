"""The export stage: merged checkpoint (logits = base + adapter), llama.cpp's GGUF text model, mmproj and
quantizations, and bad input that fails with one line and leaves no half-written output (the previous
merged model and GGUF files stay, both)."""

from __future__ import annotations

import hashlib
import re
import shutil
import types
from pathlib import Path

import pytest
from conftest import stage, tiny_adapter, tiny_params, write_params

from vgrpo import export, models
from vgrpo.config import QUANTIZATIONS, config_from_dict
from vgrpo.gguf_files import GGUFError, k_quant_share, read_gguf

STEM = "Qwen3-VL-tiny-shapes-grpo"  # llama.cpp's naming convention (vgrpo.export.gguf_name)


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def export_args(root: Path, **paths) -> list[str]:
    default = {"base": root / "base", "adapter": root / "adapter", "data": root / "shapes", "merged": root / "merged",
               "gguf": root / "gguf"}
    return [arg for key, path in {**default, **paths}.items() for arg in (f"--{key}", str(path))]


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_base):
    """One real export of the tiny model (merge, two converter runs, q4_k_m), through the stage script."""
    root = tmp_path_factory.mktemp("export")
    params = write_params(root / "params.yaml", tiny_params())
    assert stage("generate", "--params", str(params), "--out", str(root / "shapes")).returncode == 0
    (root / "base").symlink_to(tiny_base)
    tiny_adapter(root / "adapter", tiny_base)
    adapter_before = digest(root / "adapter")
    result = stage("export", "--params", str(params), *export_args(root))
    assert result.returncode == 0, result.stderr[-3000:]
    return types.SimpleNamespace(root=root, params=params, stdout=result.stdout, adapter_before=adapter_before)


@pytest.mark.slow
def test_export_writes_merged_model_and_gguf_files(exported):
    root = exported.root
    merged = {p.name for p in (root / "merged").iterdir()}
    assert {"model.safetensors", "config.json", "processor_config.json", "tokenizer.json",
            "chat_template.jinja"} <= merged
    assert not any(name.endswith((".bin", ".pt", ".pth")) for name in merged)
    assert {p.name for p in (root / "gguf").iterdir()} == {  # the model card comes after smoke (the card stage)
        f"{STEM}-F16.gguf", f"mmproj-{STEM}-F16.gguf", f"{STEM}-Q4_K_M.gguf"}
    assert not [p.name for p in root.iterdir() if p.name.startswith(".")]  # no temp dirs left behind
    assert digest(root / "adapter") == exported.adapter_before  # the adapter stays available as it was
    assert f"{root}/gguf/{STEM}-Q4_K_M.gguf (q4_k_m, " in exported.stdout
    # the merge was checked: every LoRA module in the saved weights, base + adapter's log-probs kept
    assert re.search(r"export: merged model in \S+ \(its 26 LoRA modules checked; log-probs within [0-9.e-]+ nats of "
                     r"base \+ adapter\)", exported.stdout), exported.stdout


@pytest.mark.slow
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


@pytest.mark.slow
def test_gguf_files_are_the_text_model_projector_and_k_quants(exported):
    gguf_dir = exported.root / "gguf"
    f16, q4 = read_gguf(gguf_dir / f"{STEM}-F16.gguf"), read_gguf(gguf_dir / f"{STEM}-Q4_K_M.gguf")
    projector = read_gguf(gguf_dir / f"mmproj-{STEM}-F16.gguf", projector=True)
    assert (f16.architecture, projector.architecture) == ("qwen3vl", "clip")
    assert (f16.file_type, q4.file_type, projector.file_type) == ("f16", "q4_k_m", "f16")
    assert f16.width == q4.width == projector.width == 256  # the projector feeds this text model
    assert set(projector.tensor_types) <= {"F16", "F32"}  # the projector stays f16
    assert set(f16.tensor_types) <= {"F16", "F32"}
    # Text hidden 256: every quantized tensor gets a K-quant (Q4_K, Q6_K for the sensitive ones), no fallbacks.
    assert "Q4_K" in q4.tensor_types and k_quant_share(q4.tensor_types) == 1.0
    assert k_quant_share({"Q4_K": 3, "Q5_0": 1, "F32": 5}) == 0.75 and k_quant_share(f16.tensor_types) is None


# --- Bad input: one line, exit 2, nothing half-written ---------------------------------------------

def last_line(result) -> str:
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_unknown_quantization_lists_the_valid_ones(exported, tmp_path):
    with pytest.raises(export.ExportError, match=r"unknown quantization 'q4_k_xl' \(expected one of q4_0, q4_1"):
        export.quantize(exported.root / "gguf" / f"{STEM}-F16.gguf", tmp_path / "out.gguf", "q4_k_xl")
    assert not (tmp_path / "out.gguf").exists()
    params = write_params(tmp_path / "params.yaml", tiny_params(export={"quantizations": ["q4_k_xl"]}))
    result = stage("export", "--params", str(params), *export_args(exported.root, merged=tmp_path / "m",
                                                                   gguf=tmp_path / "g"))
    assert result.returncode == 2
    assert last_line(result) == ("error: params.yaml: export.quantizations: unknown quantization 'q4_k_xl' (expected "
                                 f"one of {', '.join(QUANTIZATIONS)})")


@pytest.mark.slow
def test_truncated_gguf_is_refused_before_llama_cpp_reads_it(exported, tmp_path):
    source = (exported.root / "gguf" / f"{STEM}-F16.gguf").read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(source[: len(source) // 2])
    with pytest.raises(GGUFError, match=f"{truncated}: truncated or corrupt GGUF"):
        export.quantize(truncated, tmp_path / "out.gguf", "q4_k_m")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.slow
def test_missing_adapter(exported, tmp_path):
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, adapter=tmp_path / "a", merged=tmp_path / "m", gguf=tmp_path / "g"))
    assert result.returncode == 2
    assert last_line(result) == f"error: {tmp_path / 'a'}: no LoRA adapter here (run the train stage: dvc repro train)"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_missing_converter_fails_before_the_merge(exported, tmp_path):
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, merged=tmp_path / "m", gguf=tmp_path / "g"),
                   env={"VGRPO_LLAMA_CPP_DIR": str(tmp_path / "nowhere")})
    assert result.returncode == 2
    assert last_line(result).startswith(f"error: {tmp_path / 'nowhere'}: llama.cpp converter not found (run ./setup.sh")
    assert not (tmp_path / "m").exists() and not (tmp_path / "g").exists()


@pytest.mark.slow
def test_failing_converter_keeps_the_previous_merged_model_and_gguf(exported, tmp_path):
    """The new merged model is ready before the converter runs; it must not replace the old one when the
    conversion then fails, or merged/ and gguf/ would belong to different models."""
    converter = tmp_path / "llama.cpp"
    converter.mkdir()
    (converter / "convert_hf_to_gguf.py").write_text(
        "import sys\nprint('INFO: loading', file=sys.stderr)\nprint('NotImplementedError: Architecture not supported',"
        " file=sys.stderr)\nsys.exit(1)\n")
    previous_gguf, previous_merged = tmp_path / "gguf", tmp_path / "merged"
    shutil.copytree(exported.root / "gguf", previous_gguf)
    shutil.copytree(exported.root / "merged", previous_merged)
    before = digest(previous_gguf), digest(previous_merged)
    other = tmp_path / "adapter"
    tiny_adapter(other, exported.root / "base", seed=1)  # a different model: its merge differs from the old one
    result = stage("export", "--params", str(exported.params),
                   *export_args(exported.root, adapter=other, merged=previous_merged, gguf=previous_gguf),
                   env={"VGRPO_LLAMA_CPP_DIR": str(converter)})
    assert result.returncode == 2, result.stderr[-2000:]
    line = last_line(result)
    assert line.startswith(f"error: {converter / 'convert_hf_to_gguf.py'} failed on {tmp_path}/.merged.tmp-")
    assert line.endswith("(exit 1): NotImplementedError: Architecture not supported")
    assert (digest(previous_gguf), digest(previous_merged)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "gguf", "llama.cpp", "merged"]  # no temp dirs


@pytest.mark.slow
def test_a_bfloat16_merge_converts_to_bf16_named_as_llama_cpp_looks_for_it(exported, tiny_base, tmp_path):
    """The 8B's merge is bfloat16: its text GGUF is BF16 (lossless, not F16), named `<stem>-BF16.gguf`,
    the projector `mmproj-<stem>-F16.gguf` (`llama-server -hf repo:Q4_K_M` matches the type suffix)."""
    from vgrpo.export import run_export

    config = config_from_dict(tiny_params(export={"merged_dtype": "bfloat16", "quantizations": []}))
    summary = run_export(config, tiny_base, exported.root / "adapter", exported.root / "shapes", tmp_path / "merged",
                         tmp_path / "gguf")
    assert sorted(summary["files"]) == [f"{STEM}-BF16.gguf", f"mmproj-{STEM}-F16.gguf"]
    text = read_gguf(tmp_path / "gguf" / f"{STEM}-BF16.gguf")
    assert text.file_type == "bf16" and "BF16" in text.tensor_types and "F16" not in text.tensor_types


# --- The merge is the evaluated model ------------------------------------------------------------

def export_in_process(exported, tmp_path, monkeypatch, merge):
    """run_export with PEFT's merge_and_unload (LoraModel's, which PeftModel hands the call to) replaced by
    `merge`, called with the LoRA model and the original."""
    from peft.tuners.lora import LoraModel

    from vgrpo.export import run_export

    original = LoraModel.merge_and_unload
    monkeypatch.setattr(LoraModel, "merge_and_unload", lambda self, *a, **k: merge(self, original, *a, **k))
    config = config_from_dict(tiny_params())
    return run_export(config, exported.root / "base", exported.root / "adapter", exported.root / "shapes",
                      tmp_path / "merged", tmp_path / "gguf")


@pytest.mark.slow
def test_a_merge_that_silently_drops_the_adapter_fails_the_stage(exported, tmp_path, monkeypatch):
    with pytest.raises(export.ExportError) as err:
        export_in_process(exported, tmp_path, monkeypatch, lambda model, original, *a, **k: model.unload())
    line = str(err.value)
    assert "\n" not in line
    assert line == (f"{exported.root / 'adapter'}: 26 of 26 LoRA modules are not in the merged model (merged weight != "
                    "base + scale x B A in float32; first: model.language_model.layers.0.mlp.down_proj): the merge "
                    "dropped them, so the export would not be the model evaluate scored")
    assert not (tmp_path / "merged").exists() and not (tmp_path / "gguf").exists()


@pytest.mark.slow
def test_a_merge_that_drops_one_module_names_it(exported, tmp_path, monkeypatch):
    """PEFT merges every module but one, whose weight stays the base's."""
    dropped = "model.language_model.layers.1.self_attn.v_proj"

    def merge_all_but_one(model, original, *args, **kwargs):
        layer = model.get_submodule(f"model.{dropped}")
        kept = layer.base_layer.weight.detach().clone()
        merged = original(model, *args, **kwargs)
        merged.get_submodule(dropped).weight.data.copy_(kept)
        return merged

    with pytest.raises(export.ExportError, match=rf"1 of 26 LoRA modules are not in the merged model .*first: "
                                                 rf"{re.escape(dropped)}\)"):
        export_in_process(exported, tmp_path, monkeypatch, merge_all_but_one)


def test_gguf_names_follow_llama_cpps_convention():
    """gguf-py's naming convention (what `llama-server -hf repo:Q4_K_M` and Ollama's `hf.co/...:Q4_K_M`
    match on): base name, fine-tune, then the type in capitals; the projector as `mmproj-` + that."""
    from vgrpo.config import ModelParams

    eight_b = ModelParams("Qwen/Qwen3-VL-8B-Instruct", "main", "auto", 65536, 65536, 0)
    stem = export.gguf_stem(eight_b)
    assert stem == "Qwen3-VL-8B-Instruct-shapes-grpo"
    assert export.gguf_name(stem, "q4_k_m") == "Qwen3-VL-8B-Instruct-shapes-grpo-Q4_K_M.gguf"
    assert export.gguf_name(stem, "bf16") == "Qwen3-VL-8B-Instruct-shapes-grpo-BF16.gguf"
    assert export.gguf_name(stem, "f16", projector=True) == "mmproj-Qwen3-VL-8B-Instruct-shapes-grpo-F16.gguf"
    assert export.GGUF_TYPES == {"bfloat16": "bf16", "float16": "f16", "float32": "f16"}  # bf16 stays bf16
