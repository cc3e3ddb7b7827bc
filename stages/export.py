"""Stage 5: merge the LoRA adapter into the base model (models/merged, safetensors + processor) and check
that the merge is the model evaluate scored (every LoRA module in the saved weights; base + adapter's
log-probs kept), convert it with llama.cpp's converter to GGUF (text model BF16/F16 + mmproj-*.gguf
vision projector), and quantize (export.quantizations). Both outputs are swapped in only when everything
succeeded.

    python stages/export.py                          # params.yaml: models/adapter -> models/merged, models/gguf
    dvc exp run -S profile=tiny export               # the tiny model, on a CPU
"""

from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--base", "base_dir", default="models/base", show_default=True, help="Base model from `base`.")
@click.option("--adapter", "adapter_dir", default="models/adapter", show_default=True, help="LoRA adapter in.")
@click.option("--data", "data_dir", default="data/shapes", show_default=True,
              help="Dataset: test images for the merge check.")
@click.option("--merged", "merged_dir", default="models/merged", show_default=True, help="Merged model out.")
@click.option("--gguf", "gguf_dir", default="models/gguf", show_default=True, help="GGUF files out.")
def main(params_path, base_dir, adapter_dir, data_dir, merged_dir, gguf_dir) -> None:
    """Merge, convert to GGUF, quantize."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from vgrpo.export import run_export

        summary = run_export(config, Path(base_dir), Path(adapter_dir), Path(data_dir), Path(merged_dir),
                             Path(gguf_dir))
        for name, info in summary["files"].items():
            share = "" if info["k_quant_share"] is None else f", K-quant share {info['k_quant_share']:.0%}"
            click.echo(f"export: {gguf_dir}/{name} ({info['file_type']}, {info['bytes'] / 2**20:.1f} MiB{share})")
        merge = summary["merge"]
        click.echo(f"export: merged model in {merged_dir} (its {merge['lora_modules']} LoRA modules checked; "
                   f"log-probs within {merge['merge_logprob_diff']:.3g} nats of base + adapter), GGUF in {gguf_dir} "
                   f"({summary['seconds']} s)")


if __name__ == "__main__":
    main()
