"""Export: the LoRA adapter merged into the base model (`models/merged`, safetensors + processor),
then llama.cpp's own GGUF files (`models/gguf`): the text model in f16, the vision projector as
`mmproj-*.gguf` (f16), every quantization in `export.quantizations`, and a model card.

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
import os
import subprocess
import sys
import time
from pathlib import Path

import llama_cpp

from vgrpo import base, models
from vgrpo.config import QUANTIZATIONS, Config, ModelParams, VgrpoError
from vgrpo.files import atomic_dir
from vgrpo.gguf_runtime import GGUFInfo, k_quant_share, quiet_llama_cpp, read_gguf
from vgrpo.prompts import prompt_text, question_for
from vgrpo.vendor import llama_cpp_dir


class ExportError(VgrpoError):
    """The adapter, the converter or the quantizer cannot produce the export."""


def gguf_stem(model: ModelParams) -> str:
    base = "qwen3vl-tiny" if model.name == "tiny" else Path(model.name).name
    return f"{base}-shapes-grpo"


# --- Merge ------------------------------------------------------------------------------------

def merge_adapter(config: Config, base_dir: Path, adapter_dir: Path, merged_dir: Path) -> None:
    """Base + adapter -> one model in `export.merged_dtype` (16-bit for the 8B, full precision for the
    tiny model), saved with the processor and chat template the adapter was trained with. The base is
    loaded in full 16 bits even when training used 4-bit weights (QLoRA adapters merge into those)."""
    from peft import PeftModel

    models.check_adapter(adapter_dir)
    # The base comes from models/base, not from adapter_config.json, whose path is the training machine's.
    base_model = models.load_model(base.base_model_path(base_dir), config.export.merged_dtype)
    merged = PeftModel.from_pretrained(base_model, str(adapter_dir)).merge_and_unload()
    processor = models.load_processor(str(adapter_dir), config.model)
    with atomic_dir(merged_dir) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True)
        processor.save_pretrained(tmp)


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


def run_export(config: Config, base_dir: Path, adapter_dir: Path, merged_dir: Path, gguf_dir: Path, data_dir: Path,
               eval_metrics: Path) -> dict:
    """The `export` stage: merge, convert, quantize, write the card. Each directory is swapped in
    whole, so a failure leaves the previous export as it was."""
    start = time.perf_counter()
    models.check_adapter(adapter_dir)
    source = base.read_source(base_dir)
    base.base_model_path(base_dir)
    llama_cpp_dir()  # a missing converter fails here, not after the merge
    merge_adapter(config, base_dir, adapter_dir, merged_dir)
    stem = gguf_stem(config.model)
    with atomic_dir(gguf_dir) as tmp:
        f16, projector_path = tmp / f"{stem}-f16.gguf", tmp / f"mmproj-{stem}-f16.gguf"
        convert(merged_dir, f16, stem)
        convert(merged_dir, projector_path, stem, projector=True)
        texts = [read_gguf(f16)]
        for quantization in config.export.quantizations:
            quantize(f16, tmp / f"{stem}-{quantization}.gguf", quantization)
            texts.append(read_gguf(tmp / f"{stem}-{quantization}.gguf"))
        projector = read_gguf(projector_path, projector=True)
        (tmp / "README.md").write_text(model_card(config, source, stem, texts, projector, adapter_dir, data_dir,
                                                  eval_metrics))
        files = {info.path.name: {"file_type": info.file_type, "bytes": info.path.stat().st_size,
                                  "tensor_types": info.tensor_types, "k_quant_share": k_quant_share(info.tensor_types)}
                 for info in [*texts, projector]}
    return {"merged": str(merged_dir), "gguf": str(gguf_dir), "files": files,
            "seconds": round(time.perf_counter() - start, 1)}


# --- Model card -------------------------------------------------------------------------------

def eval_table(path: Path) -> str:
    """The accuracies in reports/eval/metrics.json as a Markdown table, read defensively: any
    numeric `accuracy` at any depth is shown, a split x model grid when the nesting is two deep."""
    path = Path(path)
    try:
        metrics = json.loads(path.read_text())
    except FileNotFoundError:
        return f"Evaluation results are missing: `{path}` does not exist (run `dvc repro evaluate`)."
    except (OSError, ValueError) as err:
        return f"Evaluation results are missing: `{path}` is not readable JSON ({type(err).__name__})."
    found = list(_accuracies(metrics, ()))
    if not found:
        return f"Evaluation results are missing: `{path}` holds no numeric `accuracy`."
    if all(len(where) == 2 for where, _ in found):
        rows = list(dict.fromkeys(where[0] for where, _ in found))
        columns = list(dict.fromkeys(where[1] for where, _ in found))
        value = {where: v for where, v in found}
        lines = ["| accuracy | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        lines += [f"| {row} | " + " | ".join(_number(value.get((row, c))) for c in columns) + " |" for row in rows]
    else:
        lines = ["| result | accuracy |", "|---|---|"]
        lines += [f"| {' / '.join(where) or 'overall'} | {_number(v)} |" for where, v in found]
    return "\n".join(lines)


def _accuracies(node, where: tuple[str, ...]):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "accuracy" and isinstance(value, int | float) and not isinstance(value, bool):
                yield where, value
            else:
                yield from _accuracies(value, (*where, str(key)))


def _number(value) -> str:
    return "" if value is None else f"{value:.3f}"


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_card(config: Config, source: dict, stem: str, texts: list[GGUFInfo], projector: GGUFInfo,
               adapter_dir: Path, data_dir: Path, eval_metrics: Path) -> str:
    """README.md for models/gguf: what the model is, how it was made, how well it does, how to run it."""
    model = config.model
    lora = _read_json(Path(adapter_dir) / "adapter_config.json")
    towers = " and ".join(t for t, key in (("language", "language_model"), ("vision", "visual"))
                          if key in str(lora.get("target_modules", "")))
    stats = _read_json(Path(data_dir) / "stats.json")
    data = stats.get("params", {})
    splits = ", ".join(f"{split} {info.get('size')}" for split, info in stats.get("splits", {}).items())
    ood = f"{data.get('ood_min_count')}..{data.get('ood_max_count')}"
    about = [
        "Base model: " + (f"a tiny random Qwen3-VL built by `vgrpo/tiny.py` (seed {model.tiny_seed}; the architecture, "
                          "tokenizer and chat format of Qwen3-VL-8B, random weights)." if model.name == "tiny"
                          else f"`{base.describe(source)}` (revision `{model.revision}` resolved to that commit)."
                          if source["kind"] == "hub" else f"`{base.describe(source)}`."),
        f"Training: GRPO with a LoRA adapter (r={lora.get('r')}, alpha={lora.get('lora_alpha')}, on the "
        f"{towers or 'model'} layers), merged into the base in {config.export.merged_dtype}. The adapter is also "
        "available on its own (`models/adapter`), the merged transformers model is `models/merged`.",
        f"Data: synthetic {data.get('image_size')} px images, shapes placed without overlap, every label re-counted by "
        f"an independent counter; splits {splits or 'unknown (no data/shapes/stats.json)'}; "
        f"{data.get('min_count')}..{data.get('max_count')} of each shape, {ood} of the asked shape in `ood`.",
        "Export: `convert_hf_to_gguf.py` and the quantizer of the llama.cpp inside llama-cpp-python "
        f"{llama_cpp.__version__}; quantizations: {', '.join(config.export.quantizations) or 'none'}; "
        "the projector stays f16.",
    ]
    limits = [
        "Trained on red triangles, blue circles and green squares on white 256x256 images only; the `ood` split "
        f"({ood} of the asked shape) shows how far counting carries beyond the training range.",
        "Image-token budget: llama.cpp picks the number of image tokens itself (64 for 256x256); the model was "
        "trained and evaluated with the same 64. Other image sizes change the budget and are untested.",
        f"`{texts[0].path.name}` follows the merged model token for token; quantized files may drift from it "
        "(`reports/smoke/metrics.json`).",
        "In virtual machines whose CPU advertises AMX without enabling it, llama.cpp's repacked CPU weights crash "
        "on quantized files: pass `--no-repack` to the llama.cpp tools.",
        *(["Tiny profile: random weights, so the text is meaningless; it exists to test the pipeline."]
          if model.name == "tiny" else []),
    ]
    files = [f"| `{info.path.name}` | {'vision projector' if info is projector else 'text model'} | {info.file_type} "
             f"| {info.path.stat().st_size / 2**20:.1f} MiB "
             f"| {', '.join(f'{t} x{n}' for t, n in info.tensor_types.items())} |" for info in [*texts, projector]]
    best = next((t for t in texts if t.file_type in config.export.quantizations), texts[0]).path.name
    mmproj = projector.path.name
    prompt = prompt_text(question_for("circles"))
    return f"""# {stem}: Qwen3-VL that counts shapes (GGUF for llama.cpp)

Qwen3-VL post-trained with multimodal GRPO (TRL + LoRA) to count red triangles, blue circles and
green squares in 256x256 images, exported for llama.cpp: a text model and a separate vision
projector (`mmproj`), which llama.cpp loads together.

{chr(10).join(f"- {line}" for line in about)}

## Evaluation (transformers, greedy, base vs trained)

{eval_table(eval_metrics)}

The `smoke` stage checks these files against the merged model on the same images:
`reports/smoke/metrics.json` (token agreement, answer agreement, image sensitivity, speed).

## Files

| file | role | type | size | tensor types |
|---|---|---|---|---|
{chr(10).join(files)}

## Prompt

The model was trained and evaluated on exactly this prompt (the image, then the text), and answers
`<REASONING>...</REASONING><SOLUTION>n</SOLUTION>`:

```
{prompt}
```

## Run it

llama.cpp (`llama-mtmd-cli`, one question):

```bash
llama-mtmd-cli -m {best} --mmproj {mmproj} --image shapes.png --temp 0 \\
  -p "{prompt}"
```

llama.cpp server (OpenAI-compatible; send the image as an `image_url` content part):

```bash
llama-server -m {best} --mmproj {mmproj} --port 8080
```

llama-cpp-python:

```python
from llama_cpp import Llama
from llama_cpp.llama_chat_format import MTMDChatHandler

llm = Llama(model_path="{best}", n_ctx=2048, verbose=False,
            chat_handler=MTMDChatHandler(clip_model_path="{mmproj}", verbose=False))
image = "data:image/png;base64,..."  # the PNG, base64-encoded
out = llm.create_chat_completion(temperature=0, repeat_penalty=1.0, messages=[{{"role": "user", "content": [
    {{"type": "image_url", "image_url": {{"url": image}}}},
    {{"type": "text", "text": "{prompt}"}}]}}])
print(out["choices"][0]["message"]["content"])
llm.close()
```

## Ollama

Not with these files. Ollama runs Qwen3-VL only on its own engine, and that engine does not take
a separate projector: a Modelfile with `FROM {best}` and `FROM {mmproj}` makes Ollama fall back to
its llama.cpp runner, which does not know the `qwen3vl` architecture ("unknown model architecture:
'qwen3vl'"; ollama/ollama#12896 and #12897; in PR #13306 the maintainers keep split vision models
for legacy architectures only, Qwen3-VL is supported as one merged file). Ollama's own converter
reads Qwen3-VL safetensors, so build the Ollama model from the merged checkpoint instead (not
verified here: no Ollama on the machine that wrote this card):

```bash
printf 'FROM ./models/merged\\nPARAMETER temperature 0\\n' > Modelfile
ollama create shapes-counter -f Modelfile --quantize q4_K_M
```

## Limits

{chr(10).join(f"- {line}" for line in limits)}
"""
