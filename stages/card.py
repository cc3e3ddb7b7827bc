"""Stage 7: the model card (models/README.md), written after `smoke` from what the pipeline measured:
the base model's origin, the data, base vs trained with the paired interval and McNemar's p, and each
GGUF file's agreement and accuracy in llama.cpp. Cheap: a new evaluation refreshes it without an export.

    python stages/card.py                            # -> models/README.md
    dvc repro card                                   # after a change to evaluate: evaluate, then the card
"""

from pathlib import Path

import click

from vgrpo.cli import user_errors


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file (the profile).")
@click.option("--base", "base_dir", default="models/base", show_default=True, help="Base model (source.json).")
@click.option("--adapter", "adapter_dir", default="models/adapter", show_default=True, help="LoRA adapter (config).")
@click.option("--gguf", "gguf_dir", default="models/gguf", show_default=True, help="GGUF files (headers).")
@click.option("--data", "data_dir", default="data/shapes", show_default=True, help="Dataset (stats.json).")
@click.option("--eval-metrics", default="reports/eval/metrics.json", show_default=True, help="From `evaluate`.")
@click.option("--smoke-metrics", default="reports/smoke/metrics.json", show_default=True, help="From `smoke`.")
@click.option("--out", "out_path", default="models/README.md", show_default=True, help="The model card.")
def main(params_path, base_dir, adapter_dir, gguf_dir, data_dir, eval_metrics, smoke_metrics, out_path) -> None:
    """Write the model card from what the other stages measured."""
    with user_errors():
        from vgrpo.card import model_card
        from vgrpo.config import load_config
        from vgrpo.files import write_text

        profile = load_config(params_path).profile
        card = model_card(Path(base_dir), Path(adapter_dir), Path(gguf_dir), Path(data_dir), Path(eval_metrics),
                          Path(smoke_metrics), profile)
        write_text(Path(out_path), card)
        click.echo(f"card: {out_path}")


if __name__ == "__main__":
    main()
