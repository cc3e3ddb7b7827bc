"""Export: the LoRA adapter merged into the base model (`models/merged`, safetensors + processor),
then llama.cpp's own GGUF files (`models/gguf`): the text model unquantized (BF16 from a bfloat16
merge, lossless; F16 otherwise), the vision projector as `mmproj-*-F16.gguf`, and every quantization
in `export.quantizations`, named as llama.cpp's convention does (`Qwen3-VL-8B-Instruct-shapes-grpo-Q4_K_M.gguf`:
`llama-server -hf <repo>:Q4_K_M` and Ollama's `hf.co/<repo>:Q4_K_M` find files by that suffix). The
model card comes later, from what `smoke` measured (vgrpo/card.py).

The converter is `convert_hf_to_gguf.py` from the sdist of the installed llama-cpp-python (see
vgrpo/vendor.py), so the files are written by the same llama.cpp that reads them in `smoke`. It runs
as a subprocess with PYTHONPATH on its own `gguf-py`, the version it was written against, never the
installed `gguf` package. Quantization goes through llama.cpp's C API, the code of `llama-quantize`.

No Ollama Modelfile: current Ollama runs Qwen3-VL only on its own engine, which does not take a
separate projector (see the card's Ollama section for the sources and the way that works).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import llama_cpp

from vgrpo import base, memory, models
from vgrpo.answers import logprob_diff
from vgrpo.config import QUANTIZATIONS, Config, ModelParams, VgrpoError
from vgrpo.files import atomic_dir, replace_dir
from vgrpo.gguf_files import k_quant_share, read_gguf
from vgrpo.llama_runtime import quiet_llama_cpp
from vgrpo.vendor import llama_cpp_dir


class ExportError(VgrpoError):
    """The adapter, the converter or the quantizer cannot produce the export."""


FINETUNE = "shapes-grpo"
GGUF_TYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f16"}  # merged dtype -> unquantized GGUF type


def gguf_stem(model: ModelParams) -> str:
    """The name before the type: base model, fine-tune (gguf-py's naming_convention, llama.cpp's own)."""
    base = "Qwen3-VL-tiny" if model.name == "tiny" else Path(model.name).name
    return gguf.naming_convention(base, None, FINETUNE, None, None, None)


def gguf_name(stem: str, file_type: str, projector: bool = False) -> str:
    """`<stem>-Q4_K_M.gguf`; the projector `mmproj-<stem>-F16.gguf`, as the converter's --mmproj names it."""
    return ("mmproj-" if projector else "") + gguf.naming_convention(stem, None, None, None, None, file_type) + ".gguf"


# --- Where to merge -----------------------------------------------------------------------------

def merge_device(config: Config, base_path: str) -> str:
    """The GPU when the base in `export.merged_dtype` fits its free memory and the GPU computes that dtype
    natively; else the CPU, where the merge holds the base in host RAM (about its weights: 17.5 GB for the
    8B in bfloat16)."""
    import torch

    from vgrpo.devices import current_device

    if not torch.cuda.is_available():
        return "cpu"
    if config.export.merged_dtype == "bfloat16" and not current_device().native_bf16:
        return "cpu"
    need = memory.weights_bytes(memory.model_shape(base_path), config.export.merged_dtype, False) + memory.OVERHEAD
    return "cuda" if need <= memory.gpu_free_and_name()[0] else "cpu"


# --- Merge ------------------------------------------------------------------------------------

MERGE_CHECK_IMAGES = 2  # test images whose next-token log-probs the merged model must keep
# How far rounding the merge into each dtype moves the next-token log-probs of base + adapter (nats, over the
# tokens base + adapter gives p > 1e-3): measured on the tiny Qwen3-VL by bench/gate_figures.py (docs/stages.md),
# a few times that; float16 keeps 3 more mantissa bits than bfloat16, so bfloat16's bound holds for it.
MERGE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5, "float16": 0.5}
ULPS = 4  # the merged weights may differ from base + scale x B A by this many rounding steps of the operands


def merge_adapter(config: Config, base_dir: Path, adapter_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    """Base + adapter -> one model in `export.merged_dtype` (16-bit for the 8B, full precision for the
    tiny model), saved with the processor and chat template the adapter was trained with. The base is
    loaded in full 16 bits even when training used 4-bit weights (QLoRA adapters merge into those).
    Then it is checked to be the model `evaluate` scored: every LoRA module merged (`merge_mismatches`)
    and the next-token log-probs of base + adapter on test images, measured here and checked by
    `check_merge_logprobs`."""
    from peft import PeftModel

    from vgrpo.generation import next_token_logits
    from vgrpo.shapes import load_dataset

    models.check_adapter(adapter_dir)
    # The base comes from models/base, not from adapter_config.json, whose path is the training machine's.
    path = base.base_model_path(base_dir)
    test = load_dataset(data_dir, splits=("test",))["test"]
    rows = [test[i] for i in range(min(MERGE_CHECK_IMAGES, len(test)))]
    processor = models.load_processor(str(adapter_dir), config.model)
    dtype = config.export.merged_dtype
    base_model = models.load_model(path, dtype, device=merge_device(config, path), vision_float32=False)
    adapted = PeftModel.from_pretrained(base_model, str(adapter_dir)).eval()
    before = [next_token_logits(adapted, processor, row).log_softmax(-1).double().cpu().numpy() for row in rows]
    merged = adapted.merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)

    checked, missing, rounded_away = merge_mismatches(path, adapter_dir, out_dir, dtype)
    if missing:
        raise ExportError(f"{adapter_dir}: {len(missing)} of {checked} LoRA modules are not in the merged model "
                          f"(merged weight != base + scale x B A in {dtype}; first: {missing[0]}): the merge dropped "
                          "them, so the export would not be the model evaluate scored")
    after = [next_token_logits(merged.eval(), processor, row).log_softmax(-1).double().cpu().numpy() for row in rows]
    diff = max(logprob_diff(a, b) for a, b in zip(after, before, strict=True))
    return {"lora_modules": checked, "lora_modules_rounded_away": rounded_away, "merge_logprob_diff": round(diff, 6)}


def check_merge_logprobs(merge: dict, dtype: str, adapter_dir: Path) -> None:
    """The merged model keeps base + adapter's next-token log-probs within what rounding the merge into
    `dtype` moves them (`MERGE_TOLERANCE`), or the export stops: the merge changed the model."""
    bound = MERGE_TOLERANCE[dtype]
    if merge["merge_logprob_diff"] > bound:
        raise ExportError(f"{adapter_dir}: the merged model's next-token log-probs differ from base + adapter's by "
                          f"{merge['merge_logprob_diff']:.3g} nats on test images (> {bound:g}, the bound for a "
                          f"{dtype} merge): the merge changed the model")


def merge_mismatches(base_path: str, adapter_dir: Path, merged_dir: Path, dtype: str) -> tuple[int, list[str], int]:
    """Every LoRA module of the adapter, read back from the saved files: is the merged weight the base
    weight plus scale x B A, rounded to `dtype` (within ULPS of its rounding steps, as PEFT's merge rounds
    it)? Tensor by tensor, so no second model is held in memory. Returns the modules checked, those whose
    update is missing, and how many modules' whole update is below the dtype's resolution (merged or not,
    their weights would be the same)."""
    import torch
    from safetensors import safe_open

    lora = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    scale = lora["lora_alpha"] / (math.sqrt(lora["r"]) if lora.get("use_rslora") else lora["r"])
    base_files, merged_files = tensor_files(Path(base_path)), tensor_files(Path(merged_dir))
    eps = torch.finfo(models.DTYPES[dtype]).eps
    missing, rounded_away, checked = [], 0, 0
    with safe_open(str(Path(adapter_dir) / "adapter_model.safetensors"), "pt") as adapter:
        for key in sorted(k for k in adapter.keys() if ".lora_A." in k):
            module = key.removeprefix("base_model.model.").split(".lora_A.")[0]
            name = f"{module}.weight"
            if name not in base_files or name not in merged_files:
                where = "the base" if name not in base_files else "the merged model"
                raise ExportError(f"{merged_dir}: no tensor {name} in {where} for the adapter's LoRA module: the merge "
                                  "cannot be checked")
            delta = scale * (adapter.get_tensor(key.replace(".lora_A.", ".lora_B.")).float()
                             @ adapter.get_tensor(key).float())
            weight = read_tensor(base_files[name], name).float()
            expected = (weight + delta).to(models.DTYPES[dtype]).float()
            merged = read_tensor(merged_files[name], name).float()
            # PEFT rounds the base and the update to `dtype` before it adds them: allow that on each operand
            tolerance = ULPS * eps * (weight.abs() + delta.abs()) + 1e-30
            checked += 1
            if ((merged - expected).abs() > tolerance).any():
                missing.append(module)
            elif torch.equal(expected, weight.to(models.DTYPES[dtype]).float()):
                rounded_away += 1
    return checked, missing, rounded_away


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (a single file, or shards with their index)."""
    from safetensors import safe_open

    files = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            files.update({name: path for name in f.keys()})
    return files


def read_tensor(path: Path, name: str):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor(name)


# --- GGUF -------------------------------------------------------------------------------------

def convert(merged_dir: Path, outfile: Path, name: str, outtype: str = "f16", projector: bool = False) -> None:
    """One run of llama.cpp's converter: the text model, or with `--mmproj` the vision projector."""
    converter = llama_cpp_dir()
    command = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(merged_dir), "--outtype", outtype,
               "--outfile", str(outfile), "--model-name", name, *(["--mmproj"] if projector else [])]
    pythonpath = os.pathsep.join(p for p in (str(converter / "gguf-py"), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(command, env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True)
    if result.returncode != 0 or not outfile.is_file():
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExportError(f"{converter / 'convert_hf_to_gguf.py'} failed on {merged_dir} "
                          f"({'--mmproj, ' if projector else ''}exit {result.returncode}): {last}")


def quantize(source: Path, dest: Path, quantization: str) -> None:
    """`llama-quantize source dest <type>` through the C API, llama.cpp's default settings (K-quant
    mixes per tensor, legacy fallbacks where a row is not a multiple of 256)."""
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"unknown quantization {quantization!r} (expected one of {', '.join(QUANTIZATIONS)})")
    read_gguf(source)  # llama.cpp reads it next
    quiet_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANTIZATIONS[quantization]
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(dest).encode(), ctypes.byref(params))
    if code != 0 or not dest.is_file():
        raise ExportError(f"{source}: llama.cpp could not quantize it to {quantization} (code {code})")


def run_export(config: Config, base_dir: Path, adapter_dir: Path, data_dir: Path, merged_dir: Path,
               gguf_dir: Path) -> dict:
    """The `export` stage: merge (and check the merge), convert, quantize. Both outputs are built beside
    the old ones and swapped in together at the end, so a failure anywhere leaves the previous export whole."""
    from vgrpo.shapes import load_dataset

    start = time.perf_counter()
    models.check_adapter(adapter_dir)
    base.base_model_path(base_dir)
    llama_cpp_dir()  # a missing converter fails here, not after the merge
    load_dataset(data_dir, splits=("test",))  # the merge check's images
    stem = gguf_stem(config.model)
    with atomic_dir(merged_dir, swap=False) as merged_tmp, atomic_dir(gguf_dir, swap=False) as gguf_tmp:
        merge = merge_adapter(config, base_dir, adapter_dir, data_dir, merged_tmp)
        check_merge_logprobs(merge, config.export.merged_dtype, adapter_dir)
        outtype = GGUF_TYPES[config.export.merged_dtype]
        unquantized = gguf_tmp / gguf_name(stem, outtype)
        projector_path = gguf_tmp / gguf_name(stem, "f16", projector=True)
        convert(merged_tmp, unquantized, stem, outtype)
        convert(merged_tmp, projector_path, stem, "f16", projector=True)
        texts = [read_gguf(unquantized)]
        for quantization in config.export.quantizations:
            quantize(unquantized, gguf_tmp / gguf_name(stem, quantization), quantization)
            texts.append(read_gguf(gguf_tmp / gguf_name(stem, quantization)))
        projector = read_gguf(projector_path, projector=True)
        files = {info.path.name: {"file_type": info.file_type, "bytes": info.path.stat().st_size,
                                  "tensor_types": info.tensor_types, "k_quant_share": k_quant_share(info.tensor_types)}
                 for info in [*texts, projector]}
        replace_dir(merged_tmp, merged_dir)
        replace_dir(gguf_tmp, gguf_dir)
    return {"merged": str(merged_dir), "gguf": str(gguf_dir), "files": files, "merge": merge,
            "seconds": round(time.perf_counter() - start, 1)}
