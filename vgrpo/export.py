"""Export: the LoRA adapter merged into the base model (`models/merged`, safetensors + processor),
then llama.cpp's own GGUF files (`models/gguf`): the text model in f16, the vision projector as
`mmproj-*.gguf` (f16), and every quantization in `export.quantizations`. The model card comes later,
from what `smoke` measured (vgrpo/card.py).

The converter is `convert_hf_to_gguf.py` from the sdist of the installed llama-cpp-python (see
vgrpo/vendor.py), so the files are written by the same llama.cpp that reads them in `smoke`. It runs
as a subprocess with PYTHONPATH on its own `gguf-py`, the version it was written against, never the
installed `gguf` package. Quantization goes through llama.cpp's C API, the code of `llama-quantize`.

No Ollama Modelfile: current Ollama runs Qwen3-VL only on its own engine, which does not take a
separate projector (see the card's Ollama section for the sources and the way that works).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp

from vgrpo import base, models
from vgrpo.config import QUANTIZATIONS, Config, ModelParams, VgrpoError
from vgrpo.files import atomic_dir, replace_dir
from vgrpo.gguf_runtime import k_quant_share, quiet_llama_cpp, read_gguf
from vgrpo.vendor import llama_cpp_dir


class ExportError(VgrpoError):
    """The adapter, the converter or the quantizer cannot produce the export."""


def gguf_stem(model: ModelParams) -> str:
    base = "qwen3vl-tiny" if model.name == "tiny" else Path(model.name).name
    return f"{base}-shapes-grpo"


# --- Merge ------------------------------------------------------------------------------------

def merge_adapter(config: Config, base_dir: Path, adapter_dir: Path, out_dir: Path) -> None:
    """Base + adapter -> one model in `export.merged_dtype` (16-bit for the 8B, full precision for the
    tiny model), saved with the processor and chat template the adapter was trained with. The base is
    loaded in full 16 bits even when training used 4-bit weights (QLoRA adapters merge into those)."""
    from peft import PeftModel

    models.check_adapter(adapter_dir)
    # The base comes from models/base, not from adapter_config.json, whose path is the training machine's.
    base_model = models.load_model(base.base_model_path(base_dir), config.export.merged_dtype)
    merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
    processor = models.load_processor(str(adapter_dir), config.model)
    merged.save_pretrained(out_dir, safe_serialization=True)
    processor.save_pretrained(out_dir)


# --- GGUF -------------------------------------------------------------------------------------

def convert(merged_dir: Path, outfile: Path, name: str, projector: bool = False) -> None:
    """One run of llama.cpp's converter: the text model, or with `--mmproj` the vision projector."""
    converter = llama_cpp_dir()
    command = [sys.executable, str(converter / "convert_hf_to_gguf.py"), str(merged_dir), "--outtype", "f16",
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


def run_export(config: Config, base_dir: Path, adapter_dir: Path, merged_dir: Path, gguf_dir: Path) -> dict:
    """The `export` stage: merge, convert, quantize. Both outputs are built beside the old ones and
    swapped in together at the end, so a failure anywhere leaves the previous export whole."""
    start = time.perf_counter()
    models.check_adapter(adapter_dir)
    base.base_model_path(base_dir)
    llama_cpp_dir()  # a missing converter fails here, not after the merge
    stem = gguf_stem(config.model)
    with atomic_dir(merged_dir, swap=False) as merged_tmp, atomic_dir(gguf_dir, swap=False) as gguf_tmp:
        merge_adapter(config, base_dir, adapter_dir, merged_tmp)
        f16, projector_path = gguf_tmp / f"{stem}-f16.gguf", gguf_tmp / f"mmproj-{stem}-f16.gguf"
        convert(merged_tmp, f16, stem)
        convert(merged_tmp, projector_path, stem, projector=True)
        texts = [read_gguf(f16)]
        for quantization in config.export.quantizations:
            quantize(f16, gguf_tmp / f"{stem}-{quantization}.gguf", quantization)
            texts.append(read_gguf(gguf_tmp / f"{stem}-{quantization}.gguf"))
        projector = read_gguf(projector_path, projector=True)
        files = {info.path.name: {"file_type": info.file_type, "bytes": info.path.stat().st_size,
                                  "tensor_types": info.tensor_types, "k_quant_share": k_quant_share(info.tensor_types)}
                 for info in [*texts, projector]}
        replace_dir(merged_tmp, merged_dir)
        replace_dir(gguf_tmp, gguf_dir)
    return {"merged": str(merged_dir), "gguf": str(gguf_dir), "files": files,
            "seconds": round(time.perf_counter() - start, 1)}
