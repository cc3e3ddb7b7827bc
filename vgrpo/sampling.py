"""Token sampling for `generate` on a CPU, by inverse CDF instead of torch's `multinomial`.

To draw one token, torch's CPU `multinomial` draws an exponential random number for every
vocabulary entry (the exponential-race trick). Over Qwen3-VL's 151,936 tokens and a batch of 16
rows that is 79 ms per generated token on this 2-core VM; inverse-CDF sampling (a cumulative sum,
one uniform number per row, a binary search) draws from the same distribution in 16.6 ms
(`bench/sampling.py`). GRPO's rollouts on a CPU sample through
`transformers`' `generate`, which calls `torch.multinomial(probs, num_samples=1)`;
`inverse_cdf_sampling()` routes exactly those calls to `inverse_cdf_multinomial` while it is active,
and counts the calls each sampler served (the train stage's metrics show them, so a `transformers`
that stopped calling `torch.multinomial` would show as 0 inverse-CDF calls, not as a silent slow-down).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import torch


def inverse_cdf_multinomial(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `probs` (rows of non-negative weights, not necessarily normalised), shape (rows, 1)."""
    cdf = probs.cumsum(-1, dtype=torch.float64)  # float64: a float32 sum over 151,936 entries drifts
    uniform = torch.rand(probs.size(0), 1, dtype=cdf.dtype, device=probs.device, generator=generator)
    # right=True: the first index whose cumulative weight exceeds u, so a zero-weight entry is never drawn
    return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).clamp_(max=probs.size(-1) - 1)


@contextmanager
def inverse_cdf_sampling():
    """While active, `torch.multinomial` draws single samples from 2-D CPU rows by inverse CDF. Yields the
    count of calls served: {"inverse_cdf": n, "torch": m}."""
    torch_multinomial = torch.multinomial
    calls = Counter(inverse_cdf=0, torch=0)

    def multinomial(probs, num_samples, replacement=False, *, generator=None, out=None):
        plain = (num_samples == 1 and out is None and probs.dim() == 2 and probs.device.type == "cpu"
                 and probs.is_floating_point())
        if plain:
            totals = probs.sum(-1)
            # invalid rows (NaN, inf, negative, all zero) go to torch, which raises its usual error
            plain = bool(torch.isfinite(totals).all() and (totals > 0).all() and probs.min() >= 0)
        if not plain:
            calls["torch"] += 1
            return torch_multinomial(probs, num_samples, replacement, generator=generator, out=out)
        calls["inverse_cdf"] += 1
        return inverse_cdf_multinomial(probs, generator)

    torch.multinomial = multinomial
    try:
        yield calls
    finally:
        torch.multinomial = torch_multinomial
