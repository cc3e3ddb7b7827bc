"""How the precision of smoke's reference moves its log-prob comparison: the merged model in float32 and
in bfloat16 (the 8B's dtype on a GPU; on a CPU a fair proxy) against the same unquantized GGUF in
llama.cpp, log-probs compared over the reference's 10 likeliest tokens (what smoke compared until
2026-12) and over the tokens the reference gives p > 1e-3 (what it compares now: the tail is where a
16-bit reference differs most), at two places: the answer's first token, and its first count (llama.cpp
teacher-forced along the float32 reference's answer).

    .venv/bin/python bench/smoke_reference.py --repo <a repo where the tiny pipeline ran> [--images 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vgrpo import gguf_runtime as rt  # noqa: E402
from vgrpo import models  # noqa: E402
from vgrpo.config import load_config  # noqa: E402


def top10_diff(logprobs: np.ndarray, reference: np.ndarray) -> float:
    top = np.argsort(-reference)[:10]
    return float(np.abs(logprobs[top] - reference[top]).max())


@click.command()
@click.option("--repo", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A repo where `dvc exp run -S profile=tiny` ran: models/merged, models/gguf, data/shapes.")
@click.option("--images", default=8, show_default=True)
def main(repo: Path, images: int) -> None:
    config = load_config(repo / "params.yaml")
    samples = rt.smoke_samples(repo / "data/shapes", images)
    texts, projector = rt.find_gguf_files(repo / "models/gguf")
    unquantized = next(t for t in texts if t.file_type in rt.UNQUANTIZED)
    processor = models.load_processor(str(repo / "models/merged"), config.model)
    references = {}
    for dtype in ("float32", "bfloat16"):
        model = models.load_model(str(repo / "models/merged"), dtype).eval()
        references[dtype] = [rt.hf_answer(model, processor, s["question"], s["image"], config.smoke.max_new_tokens)
                             for s in samples]
        del model
    answers = references["float32"]
    with rt.open_llama(unquantized, projector, config.smoke) as (llama, _):
        first = [rt.llama_answer(llama, s["question"], s["image"], 1).first_logprobs for s in samples]
        counts = [rt.llama_forced(llama, s["question"], s["image"], a.token_ids,
                                  rt.count_position(a.token_ids, processor.tokenizer)).count_logprobs
                  for s, a in zip(samples, answers, strict=True)]
    for dtype, reference in references.items():
        for where, gguf, ref in (("first token", first, [a.first_logprobs for a in reference]),
                                 ("first count", counts, [a.count_logprobs for a in reference])):
            pairs = [(g, r) for g, r in zip(gguf, ref, strict=True) if g is not None and r is not None]
            top10 = max(top10_diff(g, r) for g, r in pairs)
            likely = max(rt.logprob_diff(g, r) for g, r in pairs)
            tokens = np.mean([rt.likely_tokens(r).size for _, r in pairs])
            click.echo(f"reference {dtype:<8} vs {unquantized.path.name}, {where}: log-prob diff, max over "
                       f"{len(pairs)} images: over the 10 likeliest tokens {top10:.3g}, over the tokens with p > 1e-3 "
                       f"({tokens:.1f} a image) {likely:.3g}")


if __name__ == "__main__":
    main()
