"""Selection or capability: pass@k at GRPO's own sampling settings.

RLVR tends to raise pass@1 by concentrating probability on answers the model could already reach, and
to narrow what it reaches (Yue et al., arXiv 2504.13837): a trained model's pass@1 beside its starting
point's pass@k tells choosing from new ability. Each image gets n = max(k) answers sampled as GRPO's
rollouts are (train.temperature, top_p, top_k; inverse-CDF draws on a CPU), and pass@k is the unbiased
estimate of Chen et al. (arXiv 2107.03374): 1 - C(n - c, k) / C(n, k) for c right answers of n, averaged
over the images.
"""

from __future__ import annotations

from contextlib import nullcontext
from math import comb


def pass_at_k(n: int, right: int, k: int) -> float:
    """The chance that at least one of k answers drawn without replacement from n (`right` of them right)
    is right."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 - comb(n - right, k) / comb(n, k)


def right_answers(model, processor, rows, n: int, max_new_tokens: int, temperature: float, top_p: float,
                  top_k: int, batch_size: int, bad_words_ids=None,
                  answer_temperature: float | None = None) -> list[int]:
    """For each row, how many of n sampled answers are right (the answer's number at `answer_temperature`
    where set). A batch holds copies of one or more rows."""
    # imported here: the estimate above serves reports (bench/cpu_seeds.py) that load no model
    import torch

    from vgrpo.answer_sampling import answer_processors
    from vgrpo.generation import generate
    from vgrpo.prompts import parse_answer
    from vgrpo.sampling import inverse_cdf_sampling

    copies = [row for row in rows for _ in range(n)]
    sampling = {"temperature": temperature, "top_p": top_p, "top_k": top_k,  # top_k 0: no cut, as in TRL
                "logits_processors": answer_processors(processor.tokenizer, temperature, answer_temperature)}
    texts = []
    with torch.no_grad(), nullcontext() if torch.cuda.is_available() else inverse_cdf_sampling():
        for begin in range(0, len(copies), batch_size):
            batch = copies[begin:begin + batch_size]
            ids = generate(model, processor, batch, max_new_tokens, do_sample=True, bad_words_ids=bad_words_ids,
                           **sampling)
            texts += processor.tokenizer.batch_decode(ids, skip_special_tokens=True)
    right = [parse_answer(text) == int(row["answer"]) for text, row in zip(texts, copies, strict=True)]
    return [sum(right[i * n:(i + 1) * n]) for i in range(len(rows))]


def pass_rates(right: list[int], n: int, ks: list[int]) -> dict[str, float]:
    """pass@k for each k, averaged over the images, from each image's count of right answers of n."""
    return {f"pass@{k}": round(sum(pass_at_k(n, c, k) for c in right) / len(right), 4) for k in ks} if right else {}
