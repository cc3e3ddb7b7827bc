"""Benchmark one sampling call of `generate` on a CPU: torch's `multinomial` against the inverse-CDF
sampler the train stage uses there (`vgrpo/sampling.py`), for a batch of rows over Qwen3-VL's
151,936-token vocabulary. A cpu-profile GRPO step samples 16 rows x 32-40 tokens.

    .venv/bin/python bench/sampling.py --rows 16 --calls 50
"""

import time

import click
import torch

from vgrpo.sampling import inverse_cdf_multinomial

VOCABULARY = 151_936


def milliseconds_per_call(draw, calls: int) -> float:
    draw()  # warm-up
    start = time.perf_counter()
    for _ in range(calls):
        draw()
    return (time.perf_counter() - start) / calls * 1e3


@click.command()
@click.option("--rows", default=16, show_default=True, help="Rows sampled at once (completions per step).")
@click.option("--calls", default=50, show_default=True, help="Calls timed per sampler.")
def main(rows: int, calls: int) -> None:
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(rows, VOCABULARY) * 5 / 0.7, dim=-1)
    torch_ms = milliseconds_per_call(lambda: torch.multinomial(probs, 1), calls)
    inverse_cdf_ms = milliseconds_per_call(lambda: inverse_cdf_multinomial(probs), calls)
    print(f"rows x vocabulary   : {rows} x {VOCABULARY} ({torch.get_num_threads()} threads)")
    print(f"torch.multinomial   : {torch_ms:.2f} ms/call")
    print(f"inverse CDF         : {inverse_cdf_ms:.2f} ms/call")
    print(f"speed-up            : {torch_ms / inverse_cdf_ms:.1f}x")


if __name__ == "__main__":
    main()
