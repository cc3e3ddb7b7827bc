"""The model card (`models/README.md`), written last, from what the pipeline measured: where the base
came from, the data as generated, evaluation (base vs trained, paired interval, McNemar), and what
`smoke` measured on every GGUF file in llama.cpp. It reads only files the other stages wrote, so a
new evaluation refreshes the card without a new export.
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp

from vgrpo import base
from vgrpo.config import VgrpoError
from vgrpo.gguf_runtime import find_gguf_files
from vgrpo.prompts import prompt_text, question_for

IMAGE_MARKER = "<__media__>"  # where llama-mtmd-cli puts the image in a prompt


def read_metrics(path: Path, stage: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise VgrpoError(f"{path}: not found (run the {stage} stage: dvc repro {stage})") from None
    except ValueError as err:
        raise VgrpoError(f"{path}: not valid JSON ({err}); run the {stage} stage again") from None


def mtmd_cli_command(text_file: str, projector_file: str, question: str) -> str:
    """llama-mtmd-cli with the image before the text, as the model was trained (TRL and our prompt put
    the image first; without the marker, llama-mtmd-cli would put the image after the text)."""
    return (f'llama-mtmd-cli -m {text_file} --mmproj {projector_file} --image shapes.png --temp 0 \\\n'
            f'  -p "{IMAGE_MARKER}{prompt_text(question)}"')


def decoding(evaluation: dict) -> str:
    how = evaluation.get("decoding", {})
    if how.get("do_sample"):
        return f"sampled at temperature {how.get('temperature')}"
    return "greedy"


def evaluation_table(evaluation: dict) -> str:
    lines = ["| split | images | base | trained | trained - base (paired 95% CI) | McNemar p |",
             "|---|---|---|---|---|---|"]
    for split, m in evaluation.items():
        if not isinstance(m, dict) or "trained_minus_base" not in m:
            continue
        gain = m["trained_minus_base"]
        low, high = gain.get("accuracy_ci95", [None, None])
        lines.append(f"| {split} | {m['base']['samples']} | {m['base']['accuracy']:.3f} | "
                     f"{m['trained']['accuracy']:.3f} | {gain['accuracy']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{gain.get('mcnemar_p', float('nan')):.3g} |")
    return "\n".join(lines)


def smoke_table(smoke: dict) -> str:
    lines = ["| model | counting accuracy | answers agree with merged | first tokens agree (teacher-forced) "
             "| first-token log-prob diff | projector error | tokens/s |", "|---|---|---|---|---|---|---|",
             f"| merged model (transformers, {smoke['hf'].get('dtype')}) | {smoke['hf']['accuracy']:.3f} | - | - | - "
             f"| - | {smoke['hf']['tokens_per_second']:.1f} |"]
    for name, m in smoke["files"].items():
        lines.append(f"| `{name}` | {m['accuracy']:.3f} | {m['answer_agreement']:.3f} | "
                     f"{m['first_k_token_agreement']:.3f} | {m['first_token_logprob_diff']:.3g} | "
                     f"{m['projector_error']:.2g} | {m['tokens_per_second']:.1f} |")
    return "\n".join(lines)


def model_card(base_dir: Path, adapter_dir: Path, gguf_dir: Path, data_dir: Path, eval_metrics: Path,
               smoke_metrics: Path) -> str:
    """README.md for models/: what the model is, how it was made, what was measured, how to run it."""
    evaluation, smoke = read_metrics(eval_metrics, "evaluate"), read_metrics(smoke_metrics, "smoke")
    source = base.read_source(base_dir)
    texts, projector = find_gguf_files(gguf_dir)
    lora = read_metrics(Path(adapter_dir) / "adapter_config.json", "train")
    stats = read_metrics(Path(data_dir) / "stats.json", "generate")
    data = stats["params"]
    colours = data["colours"]
    shapes = ", ".join(f"{colours[shape]} {shape}" for shape in ("triangles", "circles", "squares"))
    size = f"{data['image_size']}x{data['image_size']}"
    splits = ", ".join(f"{split} {info['size']}" for split, info in stats["splits"].items())
    towers = " and ".join(t for t, key in (("language", "language_model"), ("vision", "visual"))
                          if key in str(lora.get("target_modules", "")))
    tiny = source["kind"] == "tiny"
    if source["kind"] == "hub":
        origin = f"`{base.describe(source)}` (revision `{source['revision']}` resolved to that commit)"
    elif tiny:
        warm = source.get("warm_start") or {}
        origin = (f"a tiny Qwen3-VL built by `vgrpo/tiny.py` (seed {source.get('seed')}; the architecture, tokenizer "
                  "and chat format of Qwen3-VL-8B, tiny sizes), " + (
                      f"warm-started by {warm['sft_steps']} supervised steps on {warm.get('warmup_images')} warm-up "
                      f"images (held-out accuracy {warm['val']['accuracy']:.3f})" if warm.get("sft_steps")
                      else "random weights"))
    else:
        origin = f"`{base.describe(source)}`"
    quantized = [t for t in texts if t.file_type not in ("f16", "f32", "bf16")]
    best, mmproj = f"gguf/{(quantized or texts)[0].path.name}", f"gguf/{projector.path.name}"  # from models/
    question = question_for("circles")
    files = [f"| `{info.path.name}` | {'vision projector' if info is projector else 'text model'} | {info.file_type} "
             f"| {info.path.stat().st_size / 2**20:.1f} MiB |" for info in [*texts, projector]]
    gate = "passed" if smoke["gate"]["passed"] else "FAILED: " + "; ".join(smoke["gate"]["failures"])
    return f"""# Qwen3-VL that counts shapes, post-trained with GRPO (GGUF for llama.cpp)

Counts the {shapes} in {size} images on white. Exported for llama.cpp as a text model plus a separate
vision projector (`mmproj`), which llama.cpp loads together (`gguf/`); the merged transformers model is
`merged/`, the LoRA adapter alone `adapter/`.

- Base model: {origin}.
- Training: GRPO with a LoRA adapter (r={lora.get('r')}, alpha={lora.get('lora_alpha')}, on the
  {towers or 'model'} layers), merged into the base.
- Data: synthetic {size} px images, shapes never overlap, every label re-counted by an independent counter;
  splits {splits}; {data['min_count']}..{data['max_count']} of each shape,
  {data['ood_min_count']}..{data['ood_max_count']} of the asked shape in `ood` (above the training range).
- Export: `convert_hf_to_gguf.py` and the quantizer of the llama.cpp inside llama-cpp-python
  {llama_cpp.__version__}; the projector stays f16.

## Evaluation (transformers, {decoding(evaluation)}, base vs trained on the same images and prompt)

{evaluation_table(evaluation)}

The interval resamples the same images for both models; McNemar's exact test counts the images only one
of the two answers right.

## What the GGUF files do in llama.cpp (`smoke`, greedy, {smoke['num_images']} test images)

{smoke_table(smoke)}

Teacher-forced agreement: share of the merged model's first {smoke['first_k_tokens']} answer tokens that
llama.cpp also picks given the same prefix. Projector error: relative L2 distance between the image
embeddings llama.cpp's `mmproj` produces and the merged model's. Gate: {gate}.

## Files

| file | role | type | size |
|---|---|---|---|
{chr(10).join(files)}

## Prompt

The model was trained and evaluated on exactly this prompt, the image first, then the text, and answers
`<REASONING>...</REASONING><SOLUTION>n</SOLUTION>`:

```
{prompt_text(question)}
```

## Run it

llama.cpp (`llama-mtmd-cli`, one question; `{IMAGE_MARKER}` puts the image before the text):

```bash
{mtmd_cli_command(best, mmproj, question)}
```

llama.cpp server (OpenAI-compatible; send the image as an `image_url` content part before the text):

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
    {{"type": "text", "text": "{prompt_text(question)}"}}]}}])
print(out["choices"][0]["message"]["content"])
llm.close()
```

## Ollama

Not with these files. Ollama runs Qwen3-VL only on its own engine, and that engine does not take
a separate projector: a Modelfile with `FROM {best}` and `FROM {mmproj}` makes Ollama fall back
to its llama.cpp runner, which does not know the `qwen3vl` architecture ("unknown model architecture:
'qwen3vl'"; ollama/ollama#12896 and #12897; in PR #13306 the maintainers keep split vision models
for legacy architectures only, Qwen3-VL is supported as one merged file). Ollama's own converter
reads Qwen3-VL safetensors, so build the Ollama model from the merged checkpoint instead (not
verified here: no Ollama on the machine that wrote this card):

```bash
printf 'FROM ./merged\\nPARAMETER temperature 0\\n' > Modelfile
ollama create shapes-counter -f Modelfile --quantize q4_K_M
```

## Limits

- Trained on {shapes} on white {size} images only; the `ood` split shows how far counting carries
  beyond the training range.
- Image-token budget: llama.cpp picks the number of image tokens itself from the image size; the model was
  trained and evaluated with the same budget at {size}. Other image sizes are untested.
- In virtual machines whose CPU advertises AMX without enabling it, llama.cpp's repacked CPU weights crash
  on quantized files: pass `--no-repack` to the llama.cpp tools.
{"- A tiny model trained on a CPU: a demonstration of the pipeline, not a useful counter." if tiny else ""}
"""
