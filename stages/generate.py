"""Stage 1: the shape-counting dataset (train/val/test/ood), with labels verified by an
independent counter, plus `preview.png` and `stats.json`.

    python stages/generate.py                        # params.yaml -> data/shapes
    python stages/generate.py --out /tmp/shapes      # elsewhere
"""

import click

from vgrpo.cli import quiet_libraries, user_errors
from vgrpo.config import load_config


@click.command()
@click.option("--params", "params_path", default="params.yaml", show_default=True, help="Params file.")
@click.option("--out", "out_dir", default="data/shapes", show_default=True, help="Dataset directory.")
def main(params_path: str, out_dir: str) -> None:
    """Render, verify and write the dataset."""
    with user_errors():
        config = load_config(params_path)
        quiet_libraries()
        from tqdm import tqdm

        from vgrpo import shapes

        total = sum(shapes.split_sizes(config.generate).values())
        with tqdm(total=total, desc="generate", unit="img") as progress:
            samples = shapes.generate_samples(config.generate, progress=progress)
        summary = shapes.write_dataset(samples, config.generate, out_dir)
        click.echo(f"wrote {out_dir}: {summary['images']} images, {summary['label_errors']} label errors, "
                   f"fingerprint {summary['fingerprint'][:16]}")


if __name__ == "__main__":
    main()
