"""Stage 6: first, the merged model must answer test images as `evaluate` answered them with base +
adapter (else the export is not the evaluated model: exit 2). Then load every GGUF in models/gguf with
its mmproj in llama-cpp-python, answer the same images greedily with the shared prompt, and compare with
the merged transformers model: the counts (teacher-forced digits, the first count's distribution, parsed
answers), whether the image still moves the count (a blank image in its place), the projector's
embeddings, speed. Writes reports/smoke/metrics.json and predictions.jsonl; exits 1 when a `smoke`
threshold is missed, so `dvc repro` stops on a broken export.

    python stages/smoke.py                           # params.yaml: models/gguf vs models/merged
    dvc exp run -S profile=tiny smoke                # the tiny model, on a CPU
"""

import sys
from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--merged", "merged_dir", default="models/merged", show_default=True, help="Merged model (reference).")
@click.option("--gguf", "gguf_dir", default="models/gguf", show_default=True, help="GGUF files from `export`.")
@click.option("--data", "data_dir", default="data/shapes", show_default=True, help="Dataset (test split).")
@click.option("--eval-predictions", "predictions_path", default="reports/eval/predictions.jsonl", show_default=True,
              help="evaluate's answers (base + adapter), which the merged model must repeat.")
@click.option("--reports", "reports_dir", default="reports/smoke", show_default=True, help="Metrics and predictions.")
def main(params_path, merged_dir, gguf_dir, data_dir, predictions_path, reports_dir) -> None:
    """Answer test images with every GGUF and check parity with the merged model."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from vgrpo.devices import load_dtype
        from vgrpo.smoke import run_smoke

        dtype = load_dtype(config.model, config.train)
        metrics, failures = run_smoke(config, dtype, Path(merged_dir), Path(gguf_dir), Path(data_dir),
                                      Path(reports_dir), Path(predictions_path), log=click.echo)
    for failure in failures:
        click.echo(f"error: smoke: {failure}", err=True)
    if failures:
        sys.exit(1)
    click.echo(f"smoke: {len(metrics['files'])} GGUF files pass, metrics in {reports_dir}/metrics.json")


if __name__ == "__main__":
    main()
