"""Stage 2: the model GRPO starts from. A hub id is downloaded at `model.revision` into the Hugging
Face cache and pinned in models/base/source.json (repo, resolved commit, weight files and hashes);
`model.name: tiny` builds the tiny Qwen3-VL into models/base/.

    python stages/base.py                            # params.yaml -> models/base
    dvc exp run -S model.revision=<commit sha>        # another revision of the same repo
"""

from pathlib import Path

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--out", "base_dir", default="models/base", show_default=True, help="Base model directory.")
def main(params_path: str, base_dir: str) -> None:
    """Download (hub id) or build (tiny) the base model and record where it comes from."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from vgrpo import base

        click.echo(f"base: {config.model.name}" + ("" if config.model.name == "tiny" else
                                                    f" at revision {config.model.revision}"))
        source = base.prepare_base(config.model, Path(base_dir))
        sizes = sum(f["size"] for f in source["files"]) / 2**30
        click.echo(f"base: {base.describe(source)} ({len(source['files'])} weight files, {sizes:.2f} GiB), "
                   f"recorded in {base_dir}/{base.SOURCE_FILE}")


if __name__ == "__main__":
    main()
