"""Stage 5: merge the LoRA adapter into the base model (models/merged, safetensors + processor), convert
it with llama.cpp's converter to GGUF (text model f16 + mmproj-*.gguf vision projector), and quantize
(export.quantizations). Both outputs are swapped in only when everything succeeded.

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
@click.option("--merged", "merged_dir", default="models/merged", show_default=True, help="Merged model out.")
@click.option("--gguf", "gguf_dir", default="models/gguf", show_default=True, help="GGUF files out.")
def main(params_path, base_dir, adapter_dir, merged_dir, gguf_dir) -> None:
    """Merge, convert to GGUF, quantize."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from vgrpo.export import run_export

        summary = run_export(config, Path(base_dir), Path(adapter_dir), Path(merged_dir), Path(gguf_dir))
        for name, info in summary["files"].items():
            share = "" if info["k_quant_share"] is None else f", K-quant share {info['k_quant_share']:.0%}"
            click.echo(f"export: {gguf_dir}/{name} ({info['file_type']}, {info['bytes'] / 2**20:.1f} MiB{share})")
        click.echo(f"export: merged model in {merged_dir}, GGUF in {gguf_dir} ({summary['seconds']} s)")


if __name__ == "__main__":
    main()
