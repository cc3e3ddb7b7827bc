"""Benchmark batched evaluation against one sample at a time, on the tiny model (goal: >= 4x).

    .venv/bin/python bench/evaluate_speed.py --samples 32 --batch-size 16
"""

import dataclasses
import tempfile
import time
from pathlib import Path

import click
import torch

from vgrpo import models, shapes
from vgrpo.config import compose, config_from_dict
from vgrpo.generation import generate


def throughput(model, processor, rows, params) -> float:
    start = time.perf_counter()
    for begin in range(0, len(rows), params.batch_size):
        generate(model, processor, rows[begin:begin + params.batch_size], params.max_new_tokens)
    return len(rows) / (time.perf_counter() - start)


@click.command()
@click.option("--samples", default=32, show_default=True)
@click.option("--batch-size", default=16, show_default=True)
@click.option("--max-new-tokens", default=24, show_default=True)
def main(samples: int, batch_size: int, max_new_tokens: int) -> None:
    config = config_from_dict(compose("tiny"))
    generate_params = dataclasses.replace(config.generate, train_size=1, val_size=samples, test_size=1, ood_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        shapes.write_dataset(shapes.generate_samples(generate_params), generate_params, Path(tmp) / "shapes")
        dataset = shapes.load_dataset(Path(tmp) / "shapes")
        rows = [dataset["val"][i] for i in range(samples)]
    from vgrpo.tiny import tiny_model_dir

    path = str(tiny_model_dir(config.model.tiny_seed, config.model.min_pixels, config.model.max_pixels))
    model, processor = models.load_model(path, "float32").eval(), models.load_processor(path, config.model)
    torch.set_num_threads(torch.get_num_threads())
    base = dataclasses.replace(config.evaluate, max_new_tokens=max_new_tokens)
    generate(model, processor, rows[:2], max_new_tokens)  # warm-up
    sequential = throughput(model, processor, rows, dataclasses.replace(base, batch_size=1))
    batched = throughput(model, processor, rows, dataclasses.replace(base, batch_size=batch_size))
    print(f"sequential (batch 1)  : {sequential:6.2f} samples/s")
    print(f"batched (batch {batch_size:<3d})   : {batched:6.2f} samples/s")
    print(f"speed-up              : {batched / sequential:6.2f}x ({samples} samples, {max_new_tokens} new tokens)")


if __name__ == "__main__":
    main()
