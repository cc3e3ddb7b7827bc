"""The figures behind smoke's and export's bounds (vgrpo/smoke.py TOLERANCES, vgrpo/export.py MERGE_TOLERANCE):
what a faithful export measures against its merged model loaded in each precision a CPU runs (float32,
bfloat16, 4-bit NF4), and what another training run's files measure against it (they must fail).

    .venv/bin/python bench/gate_figures.py --repo <a repo where the tiny or cpu pipeline ran>
    .venv/bin/python bench/gate_figures.py --repo <run A> --other <run B>   # B's files judged as A's

For each precision: evaluate's answers (base + adapter loaded in it, on smoke's images), the merged model
loaded in it (the reference), then every GGUF of the run in llama.cpp, teacher-forced along that reference;
one line per file with every measure the gate reads. With --other, run B's GGUF files against run A's
float32 reference and evaluate's answers. Then the merge check in float32 and bfloat16 (export's log-prob
difference between base + adapter and the merged model), and the bfloat16 merge as a BF16 file against
the float32 reference.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRECISIONS = {"float32": ("float32", False), "bfloat16": ("bfloat16", False), "4bit": ("float32", True)}
MEASURES = ("count_agreement", "count_tv", "answer_agreement", "trained_agreement", "first_token_logprob_diff",
            "projector_error")


def config_in(config, dtype: str, four_bit: bool, images: int):
    """The run's config with the model loaded in `dtype` (4-bit or not), evaluate on smoke's images only."""
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, dtype=dtype),
        train=dataclasses.replace(config.train, load_in_4bit=four_bit),
        evaluate=dataclasses.replace(config.evaluate, splits=["test"], max_samples={"test": images},
                                     attention_samples=0),
        smoke=dataclasses.replace(config.smoke, num_images=images))


def file_figures(config, dtype: str, repo: Path, gguf_dir: Path, predictions: Path, images: int) -> tuple[dict, dict]:
    """The merged model's figures (loaded as `config` says) and each GGUF's, as smoke measures them."""
    from vgrpo.gguf_files import find_gguf_files
    from vgrpo.hf_reference import run_hf
    from vgrpo.llama_runtime import run_llama
    from vgrpo.smoke import evaluated_answers, evaluated_share, parity, scores, smoke_samples, trained_agreement

    samples = smoke_samples(repo / "data/shapes", images)
    evaluated = evaluated_answers(predictions)
    texts, projector = find_gguf_files(gguf_dir)
    reference, _ = run_hf(repo / "models/merged", config, dtype, samples)
    hf = {"evaluated_agreement": evaluated_share(reference, samples, evaluated)[0],
          "trained_agreement": trained_agreement(reference, samples, evaluated), **scores(reference, samples)}
    files = {}
    for text in texts:
        run = run_llama(text, projector, samples, config.smoke, reference)
        files[text.path.name] = {**parity(run, reference), **scores(run, samples),
                                 "trained_agreement": trained_agreement(run, samples, evaluated)}
    return hf, files


def show(label: str, hf: dict, files: dict) -> None:
    click.echo(f"{label}: merged model evaluated_agreement {hf['evaluated_agreement']}, trained_agreement "
               f"{hf['trained_agreement']}, accuracy {hf['accuracy']}")
    for name, m in files.items():
        figures = ", ".join(f"{key.removeprefix('first_token_')} {m[key]}" for key in MEASURES)
        click.echo(f"  {name}: {figures}, accuracy {m['accuracy']}")


@click.command()
@click.option("--repo", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A repo where the pipeline ran: params.yaml, data/shapes, models/{base,adapter,merged,gguf}.")
@click.option("--other", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Another run of the same data and base (another train.seed): its models/gguf, judged as --repo's.")
@click.option("--images", type=int, default=None, help="Smoke images (default: the run's smoke.num_images).")
@click.option("--threads", type=int, default=2, show_default=True)
def main(repo: Path, other: Path | None, images: int | None, threads: int) -> None:
    import torch

    from vgrpo.cli import quiet_libraries
    from vgrpo.config import load_config
    from vgrpo.evaluation import run_evaluation
    from vgrpo.export import convert, gguf_name, gguf_stem, merge_adapter

    quiet_libraries()
    torch.set_num_threads(threads)
    config = load_config(repo / "params.yaml")
    images = images or config.smoke.num_images
    config = dataclasses.replace(config, smoke=dataclasses.replace(config.smoke, n_threads=threads))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for precision, (dtype, four_bit) in PRECISIONS.items():
            variant = config_in(config, dtype, four_bit, images)
            run_evaluation(variant, dtype, repo / "data/shapes", repo / "models/base", repo / "models/adapter",
                           tmp / precision)
            hf, files = file_figures(variant, dtype, repo, repo / "models/gguf", tmp / precision / "predictions.jsonl",
                                     images)
            show(f"reference {precision}", hf, files)
        if other is not None:
            hf, files = file_figures(config_in(config, "float32", False, images), "float32", repo,
                                     other / "models/gguf", tmp / "float32" / "predictions.jsonl", images)
            show(f"another run's files ({other}) against this run's float32 reference", hf, files)
        for merged_dtype in ("float32", "bfloat16"):
            variant = dataclasses.replace(config, export=dataclasses.replace(config.export, merged_dtype=merged_dtype))
            merge = merge_adapter(variant, repo / "models/base", repo / "models/adapter", repo / "data/shapes",
                                  tmp / f"merged-{merged_dtype}")
            click.echo(f"merge in {merged_dtype}: log-prob difference to base + adapter {merge['merge_logprob_diff']} "
                       f"nats ({merge['lora_modules']} LoRA modules)")
        # a BF16 file (the 8B's, from a bfloat16 merge) against the float32 reference, with the run's projector
        bf16 = tmp / "gguf-bf16"
        bf16.mkdir()
        stem = gguf_stem(config.model)
        convert(tmp / "merged-bfloat16", bf16 / gguf_name(stem, "bf16"), stem, "bf16")
        shutil.copy(repo / "models/gguf" / gguf_name(stem, "f16", projector=True), bf16)
        hf, files = file_figures(config_in(config, "float32", False, images), "float32", repo, bf16,
                                 tmp / "float32" / "predictions.jsonl", images)
        show("a BF16 file from a bfloat16 merge against the float32 reference", hf, files)


if __name__ == "__main__":
    main()
