"""Benchmark the export: tokens per second of the quantized GGUF in llama.cpp against the merged model
in transformers at full precision (float32), on the same test images, with the same prompt, greedy,
the same new-token budget and the same CPU threads. Goal: the GGUF at least 2x faster.

    dvc exp run -S profile=tiny                         # models/merged, models/gguf, data/shapes; profile: tiny
    .venv/bin/python bench/gguf_vs_hf.py --images 8     # here: 4.2x (354 vs 84 tokens/s, 2 threads)

A request is timed whole (image encoding, prompt, generation); one untimed request per side warms up
first. Tokens per second = generated tokens / request seconds, the same measure on both sides.
"""

import dataclasses
from pathlib import Path

import click

from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True)
@click.option("--merged", "merged_dir", default="models/merged", show_default=True)
@click.option("--gguf", "gguf_dir", default="models/gguf", show_default=True)
@click.option("--data", "data_dir", default="data/shapes", show_default=True)
@click.option("--quantization", default="q4_k_m", show_default=True)
@click.option("--images", default=8, show_default=True, help="Test images, answered by each side.")
@click.option("--max-new-tokens", default=64, show_default=True)
@click.option("--threads", type=int, default=None, help="CPU threads for both sides [default: smoke.n_threads].")
def main(params_path, merged_dir, gguf_dir, data_dir, quantization, images, max_new_tokens, threads) -> None:
    config = load_config(params_path)
    from vgrpo.cli import quiet_libraries

    quiet_libraries()
    import torch

    from vgrpo import models
    from vgrpo.answers import tokens_per_second
    from vgrpo.gguf_files import find_gguf_files
    from vgrpo.hf_reference import hf_answer
    from vgrpo.llama_runtime import llama_answer, open_llama
    from vgrpo.smoke import smoke_samples

    threads = threads or config.smoke.n_threads
    smoke = dataclasses.replace(config.smoke, n_threads=threads)
    torch.set_num_threads(threads)
    samples = smoke_samples(Path(data_dir), images)
    texts, projector = find_gguf_files(Path(gguf_dir))
    text = next((t for t in texts if t.file_type == quantization), None)
    if text is None:
        found = ", ".join(t.file_type for t in texts)
        raise click.ClickException(f"{gguf_dir}: no {quantization} GGUF (found {found})")

    processor = models.load_processor(merged_dir, config.model)
    model = models.load_model(merged_dir, "float32").eval()
    hf_answer(model, processor, samples[0]["question"], samples[0]["image"], max_new_tokens)
    hf = [hf_answer(model, processor, s["question"], s["image"], max_new_tokens) for s in samples]
    del model

    with open_llama(text, projector, smoke) as (llama, _):
        llama_answer(llama, samples[0]["question"], samples[0]["image"], max_new_tokens)
        gguf = [llama_answer(llama, s["question"], s["image"], max_new_tokens) for s in samples]

    click.echo(f"{len(samples)} images, up to {max_new_tokens} new tokens each, {threads} CPU threads")
    for name, answers in (("transformers float32", hf), (f"llama.cpp {text.path.name}", gguf)):
        tokens, seconds = sum(len(a.token_ids) for a in answers), sum(a.seconds for a in answers)
        click.echo(f"{name}: {tokens_per_second(answers):.1f} tokens/s ({tokens} tokens in {seconds:.2f} s)")
    ratio = tokens_per_second(gguf) / tokens_per_second(hf)
    click.echo(f"speed-up: {ratio:.2f}x ({'meets' if ratio >= 2 else 'misses'} the 2x goal)")


if __name__ == "__main__":
    main()
