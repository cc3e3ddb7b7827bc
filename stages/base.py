"""Stage 2: the model GRPO starts from. A hub id is downloaded at `model.revision` into the Hugging
Face cache and pinned in models/base/source.json (repo, resolved commit, weight files and hashes);
`model.name: tiny` builds the tiny Qwen3-VL into models/base/ and warm-starts it by supervised
fine-tuning on the `warmup` split (`base.sft_steps`; curves and held-out accuracy in reports/base).

    python stages/base.py                            # params.yaml -> models/base, reports/base
    dvc exp run -S model.revision=<commit sha>        # another revision of the same repo
"""

from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--data", "data_dir", default="data/shapes", show_default=True, help="Dataset (the warmup split).")
@click.option("--out", "base_dir", default="models/base", show_default=True, help="Base model directory.")
@click.option("--reports", "reports_dir", default="reports/base", show_default=True,
              help="Warm-start curves and held-out accuracy.")
def main(params_path: str, data_dir: str, base_dir: str, reports_dir: str) -> None:
    """Download (hub id) or build (tiny) the base model and record where it comes from."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from vgrpo import base

        click.echo(f"base: {config.model.name}" + ("" if config.model.name == "tiny" else
                                                    f" at revision {config.model.revision}"))
        if config.base.sft_steps:
            from vgrpo.config import WARMUP
            from vgrpo.shapes import load_dataset

            load_dataset(data_dir, splits=(WARMUP, "val"))  # a missing split fails before any model builds
        source = base.prepare_base(config, Path(base_dir), Path(data_dir), Path(reports_dir), log=click.echo)
        sizes = sum(f["size"] for f in source["files"]) / 2**30
        click.echo(f"base: {base.describe(source)} ({len(source['files'])} weight files, {sizes:.2f} GiB), "
                   f"recorded in {base_dir}/{base.SOURCE_FILE}")


if __name__ == "__main__":
    main()
