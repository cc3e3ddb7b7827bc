"""Benchmark the `generate` stage: images per second end to end (render + verify + encode + write),
next to a naive generator that places shapes at random with no checks (the seed's approach), and how
often the naive labels are wrong.

    .venv/bin/python bench/generate.py --images 5000
"""

import dataclasses
import io
import tempfile
import time
from pathlib import Path

import click
import numpy as np
from PIL import Image, ImageDraw

from vgrpo import shapes
from vgrpo.config import COLOURS, SHAPES, load_config


def naive_sample(params, rng):
    """Random positions and sizes, overlaps allowed, no verification."""
    image = Image.new("RGB", (params.image_size, params.image_size), "white")
    draw = ImageDraw.Draw(image)
    colours = dataclasses.asdict(params.colours)
    counts = {s: int(rng.integers(params.min_count, params.max_count + 1)) for s in SHAPES}
    for shape in SHAPES:
        for _ in range(counts[shape]):
            side = int(rng.integers(params.min_shape_size, params.max_shape_size + 1))
            x, y = (int(v) for v in rng.integers(-side // 2, params.image_size - side // 2, size=2))
            box, fill = (x, y, x + side, y + side), COLOURS[colours[shape]]
            if shape == "circles":
                draw.ellipse(box, fill=fill)
            elif shape == "squares":
                draw.rectangle(box, fill=fill)
            else:
                draw.polygon([(x + side / 2, y), (x, y + side), (x + side, y + side)], fill=fill)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return shapes.Sample(buffer.getvalue(), counts, SHAPES[int(rng.integers(3))])


@click.command()
@click.option("--images", default=5000, show_default=True)
@click.option("--params", "params_path", default="params.yaml", show_default=True)
def main(images: int, params_path: str) -> None:
    base = load_config(params_path).generate
    per_split = images // 4
    params = dataclasses.replace(base, train_size=images - 3 * per_split, val_size=per_split,
                                 test_size=per_split, ood_size=per_split)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        samples = shapes.generate_samples(params)
        shapes.write_dataset(samples, params, Path(tmp) / "shapes")
        verified = images / (time.perf_counter() - start)

        rng = np.random.default_rng(0)
        start = time.perf_counter()
        naive = {"train": [naive_sample(params, rng) for _ in range(images)]}
        shapes.to_dataset_dict(naive, params).save_to_disk(str(Path(tmp) / "naive"))
        unverified = images / (time.perf_counter() - start)

    wrong = sum(shapes.count_shapes(np.asarray(Image.open(io.BytesIO(s.image_png)).convert("RGB")), params)
                != s.counts for s in naive["train"])
    print(f"verified generate : {verified:7.1f} images/s ({images} images, 0 label errors by construction)")
    print(f"naive generator   : {unverified:7.1f} images/s (no checks)")
    print(f"naive label errors: {wrong / images:7.1%} of images have visible counts != labels")


if __name__ == "__main__":
    main()
