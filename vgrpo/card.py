"""The model card (`models/README.md`), written last, from what the pipeline measured: where the base
came from, the data as generated, evaluation (base vs trained, paired interval, McNemar; and, where the
warm start answers a brief style by default, trained vs the warm start made to describe, which is what
GRPO added), and what `smoke` measured on every GGUF file in llama.cpp. It starts with Hugging Face
model-card metadata (huggingface_hub's ModelCardData: base model, license, pipeline tag, tags and a
model-index with the test results), so the Hub links it to its base and shows the results. It reads only
files the other stages wrote, so a new evaluation refreshes the card without a new export.
"""

from __future__ import annotations

import json
from pathlib import Path

import llama_cpp
from huggingface_hub import ModelCard

from vgrpo import base
from vgrpo.config import VgrpoError
from vgrpo.gguf_files import find_gguf_files
from vgrpo.prompts import prompt_text, question_for

IMAGE_MARKER = "<__media__>"  # where llama-mtmd-cli puts the image in a prompt


def read_metrics(path: Path, stage: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise VgrpoError(f"{path}: not found (run the {stage} stage: dvc repro {stage})") from None
    except ValueError as err:
        raise VgrpoError(f"{path}: not valid JSON ({err}); run the {stage} stage again") from None


# llama.cpp's repacked CPU weights crash (SIGSEGV) on quantized files in VMs whose CPU advertises AMX
# without enabling it: the commands carry --no-repack, and the card says why beside them.
NO_REPACK = "--no-repack"
NO_REPACK_WHY = ("`--no-repack` keeps llama.cpp off its repacked CPU weights, which crash on quantized files "
                 "in virtual machines whose CPU advertises AMX without enabling it; drop it elsewhere for speed.")


def mtmd_cli_command(text_file: str, projector_file: str, question: str) -> str:
    """llama-mtmd-cli with the image before the text, as the model was trained (TRL and our prompt put
    the image first; without the marker, llama-mtmd-cli would put the image after the text), greedy."""
    return (f'llama-mtmd-cli -m {text_file} --mmproj {projector_file} --image shapes.png --temp 0 {NO_REPACK} \\\n'
            f'  -p "{IMAGE_MARKER}{prompt_text(question)}"')


def server_command(text_file: str, projector_file: str) -> str:
    return f"llama-server -m {text_file} --mmproj {projector_file} --port 8080 {NO_REPACK}"


def what_it_is(tiny: bool) -> str:
    """The title's claim: what the runs show GRPO did, no more (the card's sections give the figures)."""
    if tiny:
        return "a tiny Qwen3-VL from the pipeline's CPU run, GRPO with a LoRA on a shape-counting task"
    return "Qwen3-VL with a GRPO-trained LoRA for counting shapes"


def decoding(evaluation: dict) -> str:
    how = evaluation.get("decoding", {})
    if how.get("do_sample"):
        return f"sampled at temperature {how.get('temperature')}"
    return "greedy"


def evaluation_table(evaluation: dict, baseline: str = "base") -> str:
    """One row per split: `baseline` (the warm start as it answers, or made to describe) vs trained."""
    gain_key = "trained_minus_base" if baseline == "base" else f"trained_minus_{baseline}"
    lines = [f"| split | images | {BASELINES[baseline]} | trained | trained - that (paired 95% CI) | McNemar p |",
             "|---|---|---|---|---|---|"]
    for split, m in evaluation.items():
        if not isinstance(m, dict) or gain_key not in m:
            continue
        gain = m[gain_key]
        low, high = gain.get("accuracy_ci95", [None, None])
        lines.append(f"| {split} | {m[baseline]['samples']} | {m[baseline]['accuracy']:.3f} | "
                     f"{m['trained']['accuracy']:.3f} | {gain['accuracy']:+.3f} [{low:+.3f}, {high:+.3f}] | "
                     f"{gain.get('mcnemar_p', float('nan')):.3g} |")
    return "\n".join(lines)


BASELINES = {"base": "base", "base_described": "warm start made to describe"}


def smoke_table(smoke: dict) -> str:
    def number(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    hf = smoke["hf"]
    lines = ["| model | counting accuracy | answers agree with merged | count digits agree (teacher-forced) "
             "| template tokens agree | first count TV | image sensitivity | projector error | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|",
             f"| merged model (transformers, {hf.get('dtype')}) | {hf['accuracy']:.3f} | - | - | - "
             f"| - | {number(hf.get('image_sensitivity'), '.3g')} | - | {hf['tokens_per_second']:.1f} |"]
    for name, m in smoke["files"].items():
        lines.append(f"| `{name}` | {m['accuracy']:.3f} | {m['answer_agreement']:.3f} | "
                     f"{number(m['count_agreement'], '.3f')} | {number(m['template_agreement'], '.3f')} | "
                     f"{number(m['count_tv'], '.3g')} | {number(m['image_sensitivity'], '.3g')} | "
                     f"{m['projector_error']:.2g} | {m['tokens_per_second']:.1f} |")
    return "\n".join(lines)


def data_line(data: dict, size: str, splits: str) -> str:
    """The data as generated, for any profile's generate params."""
    grid = " one shape per 32 px cell," if data.get("layout") == "grid" else ""
    ood_range = "above the training range"
    if (data.get("warmup_max_count") or 0) > data["max_count"]:  # the warm start was taught those counts
        ood_range = (f"above GRPO's training range, within the warm start's "
                     f"{data['min_count']}..{data['warmup_max_count']}")
    return (f"synthetic {size} px images,{grid} shapes never overlap, every label re-counted by an independent "
            f"counter; splits {splits}; {data['min_count']}..{data['max_count']} of the asked shape and "
            f"{data['other_min_count']}..{data['other_max_count']} of each other shape, "
            f"{data['ood_min_count']}..{data['ood_max_count']} of the asked shape in `ood` ({ood_range})")


def what_grpo_did(source: dict, evaluation: dict) -> str:
    """Where the warm start answers a brief style by default, what its greedy accuracy is (a guess, when
    its brief answers were taught as guesses), and what GRPO added over it made to describe."""
    warm = source.get("warm_start") or {}
    test = evaluation.get("test") or {}
    if warm.get("described_share", 1.0) >= 1 or "base_described" not in test:
        return ""
    guessed = warm.get("brief_answers") == "guessed"
    guess = ", and their number is a guess by design (`base.brief_answers: guessed`)" if guessed else ""
    gain = test["trained_minus_base_described"]
    low, high = gain["accuracy_ci95"]
    difference = (f"a difference of {gain['accuracy'] * 100:+.1f} points (paired 95% CI [{low * 100:+.1f}, "
                  f"{high * 100:+.1f}], McNemar p = {gain['mcnemar_p']:.3g})")
    return f"""
## What GRPO did

The starting point (the warm start, `base`) was taught two answer styles by supervised steps: a share of
{warm['described_share']:.0%} of its answers state the three counts before answering, the others are brief
("I count the blue circles."){guess}.
Greedy decoding of the warm start answers brief, so its greedy accuracy
({test['base']['accuracy']:.1%} on the test images) {"is a guess's" if guessed else "is the brief style's"}.
Made to describe (the brief style's first token forbidden), the warm start answers
{test['base_described']['accuracy']:.1%} of them right; after GRPO, {test['trained']['accuracy']:.1%}:
{difference}.
That difference is what GRPO did to its starting point's own counting; the rest of its gain over greedy
decoding is the choice of the described style.{pass_line(test)}

{evaluation_table(evaluation, "base_described")}
"""


def pass_line(test: dict) -> str:
    """pass@k beside pass@1, where evaluate measured it: does GRPO choose among answers its start could give?"""
    start, trained = test.get("base", {}).get("pass_at_k"), test.get("trained", {}).get("pass_at_k")
    if not start or not trained:
        return ""
    ks = [key for key in start if key.startswith("pass@")]
    shown = ", ".join(f"{k} {start[k]:.1%} -> {trained[k]:.1%}" for k in ks)
    return (f"\nSampled as GRPO samples ({start['samples_per_image']} answers to each of {start['images']} test "
            f"images), warm start -> after GRPO: {shown}. A pass@1 that rises while the largest k falls is GRPO "
            "choosing among answers its start could already give, not a new ability.")


REPORTED_SPLITS = ("test", "ood")  # val chose the recipe's step count: not reported as a result


def card_metadata(evaluation: dict, model_name: str, tiny: bool, base_model: str | None,
                  relation: str | None = None, library: str = "gguf"):
    """Hugging Face model-card metadata: the base model and how this model relates to it (the Hub's model
    tree), license, pipeline tag, library, tags, and a model-index with the trained model's accuracy on the
    splits that report results (test, ood; not val, which chose the recipe)."""
    from huggingface_hub import EvalResult, ModelCardData

    results = [EvalResult(task_type="image-text-to-text", task_name="shape counting", dataset_type="synthetic-shapes",
                          dataset_name=f"synthetic shapes ({split})", dataset_split=split, metric_type="accuracy",
                          metric_name=f"{split} accuracy",
                          metric_value=round(evaluation[split]["trained"]["accuracy"], 4))
               for split in REPORTED_SPLITS if isinstance(evaluation.get(split), dict)]
    extra = {"base_model_relation": relation} if base_model and relation else {}
    return ModelCardData(base_model=base_model, license="apache-2.0", pipeline_tag="image-text-to-text",
                         library_name=library, model_name=model_name,
                         tags=["qwen3_vl", "grpo", "lora", "gguf", "llama.cpp", "vision-language", "counting"]
                         + (["tiny", "cpu"] if tiny else []), eval_results=results or None, **extra)


def model_card(base_dir: Path, adapter_dir: Path, gguf_dir: Path, data_dir: Path, eval_metrics: Path,
               smoke_metrics: Path, profile: str = "full", files_prefix: str = "gguf/", gguf_repo: str | None = None,
               base_model: str | None = "source", relation: str | None = None) -> str:
    """README.md for models/ (files under `files_prefix`), or for a GGUF repo on the Hub (`gguf_repo`, files at
    its root): what the model is, how it was made, what was measured, how to run it. `base_model`: the
    metadata's base model ("source": the hub model the run started from, if any) and `relation` to it."""
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
    best, mmproj = f"{files_prefix}{(quantized or texts)[0].path.name}", f"{files_prefix}{projector.path.name}"
    question = question_for("circles")
    files = [f"| `{info.path.name}` | {'vision projector' if info is projector else 'text model'} | {info.file_type} "
             f"| {info.path.stat().st_size / 2**20:.1f} MiB |" for info in [*texts, projector]]
    gate = "passed" if smoke["gate"]["passed"] else "FAILED: " + "; ".join(smoke["gate"]["failures"])
    name = projector.path.name.removeprefix("mmproj-").rsplit("-", 1)[0]  # the GGUF stem: Qwen3-VL-...-shapes-grpo
    hub_base = source["name"] if source["kind"] == "hub" else None
    metadata = card_metadata(evaluation, name, tiny, hub_base if base_model == "source" else base_model, relation)
    title = f"# {name}: {what_it_is(tiny)} (GGUF for llama.cpp)"
    hub_line = "" if gguf_repo is None else f"""
From the Hub, llama.cpp picks the quantization and the projector by the repo's file names:

```bash
llama-server -hf {gguf_repo}:{(quantized or texts)[0].file_type.upper()} {NO_REPACK}
```
"""
    where = (" (`gguf/`); the merged transformers model is `merged/`, the LoRA adapter alone `adapter/`"
             if gguf_repo is None else f"; the merged transformers model and the LoRA adapter have repos of their own "
             f"(`{gguf_repo.removesuffix('-GGUF')}`, `{gguf_repo.removesuffix('-GGUF')}-LoRA`)")
    body = f"""{title}

Asked how many {shapes.replace(", ", ", or ")} are in a {size} image on white, it answers with its
reasoning and a count. Exported for llama.cpp as a text model plus a separate vision projector (`mmproj`),
which llama.cpp loads together{where}.

- Made by the vgrpo pipeline, profile `{profile}` (`dvc exp run -S profile={profile}`).
- Base model: {origin}.
- Training: GRPO with a LoRA adapter (r={lora.get('r')}, alpha={lora.get('lora_alpha')}, on the
  {towers or 'model'} layers), merged into the base.
- Data: {data_line(data, size, splits)}.
- Export: `convert_hf_to_gguf.py` and the quantizer of the llama.cpp inside llama-cpp-python
  {llama_cpp.__version__}; the projector stays f16.

## Evaluation (transformers, {decoding(evaluation)}, base vs trained on the same images and prompt)

{evaluation_table(evaluation)}

The interval resamples the same images for both models; McNemar's exact test counts the images only one
of the two answers right.
{what_grpo_did(source, evaluation)}
## What the GGUF files do in llama.cpp (`smoke`, greedy, {smoke['num_images']} test images)

{smoke_table(smoke)}

Teacher-forced along the merged model's answers: the share of the digits where they state counts that
llama.cpp also picks given the same prefix, and of the other (template) tokens; the first count's
distribution as total-variation distance. Image sensitivity: how far the first count's distribution moves
when a blank image replaces the real one. Projector error: relative L2 distance between the image
embeddings llama.cpp's `mmproj` produces and the merged model's. Before these, the merged model answered
the smoke images as `evaluate`'s base + adapter did ({smoke['hf'].get('evaluated_agreement', 0):.0%} of
them). Gate: {gate}.

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

llama.cpp (`llama-mtmd-cli`, one question; `{IMAGE_MARKER}` puts the image before the text). {NO_REPACK_WHY}

```bash
{mtmd_cli_command(best, mmproj, question)}
```

llama.cpp server (OpenAI-compatible; send the image as an `image_url` content part before the text):

```bash
{server_command(best, mmproj)}
```
{hub_line}
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
  on quantized files: the commands above carry `--no-repack` for that reason.
{"- A tiny model trained on a CPU: a demonstration of the pipeline, not a useful counter." if tiny else ""}
"""
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}").content


def hub_card(kind: str, run_dir: Path, ids: dict[str, str], profile: str, base_model: str | None,
             relation: str | None) -> str:
    """The card of one published repo (vgrpo.publish): the run's full card for the GGUF repo (its files at
    the root, the `llama-server -hf` line), a short one for the merged model and for the adapter."""
    paths = (run_dir / "models/base", run_dir / "models/adapter", run_dir / "models/gguf", run_dir / "data/shapes",
             run_dir / "reports/eval/metrics.json", run_dir / "reports/smoke/metrics.json")
    if kind == "gguf":
        return model_card(*paths, profile=profile, files_prefix="", gguf_repo=ids["gguf"], base_model=base_model,
                          relation=relation)
    evaluation = read_metrics(paths[4], "evaluate")
    source = base.read_source(paths[0])
    tiny = source["kind"] == "tiny"
    name = ids[kind].split("/", 1)[1]
    metadata = card_metadata(evaluation, name, tiny, base_model, relation,
                             library="transformers" if kind == "merged" else "peft")
    origin = f"`{base_model}`" if base_model else f"{base.describe(source)} (not on the Hub)"
    if kind == "merged":
        what = "The LoRA adapter merged into the base: a transformers model (safetensors, processor, chat template)."
        load = f"""```python
from transformers import AutoModelForImageTextToText, AutoProcessor

model = AutoModelForImageTextToText.from_pretrained("{ids['merged']}")
processor = AutoProcessor.from_pretrained("{ids['merged']}")
```"""
    else:
        what = "The LoRA adapter alone (PEFT, safetensors), to load on the base model."
        base_id = base_model or "<the base model>"
        load = f"""```python
from peft import PeftModel
from transformers import AutoModelForImageTextToText

model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained("{base_id}"), "{ids['adapter']}")
```"""
    body = f"""# {name}: {what_it_is(tiny)}

{what} Base model: {origin}. Made by the vgrpo pipeline, profile `{profile}`; the GGUF files for llama.cpp are
in [{ids['gguf']}](/{ids['gguf']}), the merged model in [{ids['merged']}](/{ids['merged']}), the adapter
in [{ids['adapter']}](/{ids['adapter']}). The GGUF repo's card has the full evaluation, the data and what
llama.cpp measured.

## Evaluation (transformers, {decoding(evaluation)}, base vs trained on the same images and prompt)

{evaluation_table(evaluation)}

## Load it

{load}

Prompt: the image first, then `{prompt_text(question_for("circles"))}`; the answer is
`<REASONING>...</REASONING><SOLUTION>n</SOLUTION>`.
"""
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}").content
