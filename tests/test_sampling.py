"""The inverse-CDF sampler draws from the distribution it is given, and `inverse_cdf_sampling` routes only
the calls it can serve, restoring torch afterwards."""

from __future__ import annotations

import pytest
import torch

from vgrpo.sampling import inverse_cdf_multinomial, inverse_cdf_sampling


def test_frequencies_match_the_probabilities():
    weights = torch.tensor([0.5, 0.0, 0.3, 0.2, 0.0])
    generator = torch.Generator().manual_seed(0)
    draws = inverse_cdf_multinomial(weights.repeat(40_000, 1), generator).squeeze(1)
    frequencies = torch.bincount(draws, minlength=5).double() / draws.numel()
    assert frequencies[1] == 0 and frequencies[4] == 0  # zero weight: never drawn, not even at the edges
    assert torch.allclose(frequencies, weights.double(), atol=0.01), frequencies


@pytest.mark.slow
def test_unnormalised_rows_and_a_vocabulary_sized_row():
    row = torch.zeros(151_936)
    row[[7, 151_935]] = torch.tensor([3.0, 1.0])  # weights 3:1, the last entry included
    draws = inverse_cdf_multinomial(row.repeat(4_000, 1), torch.Generator().manual_seed(1)).squeeze(1)
    assert set(draws.tolist()) == {7, 151_935}
    assert abs((draws == 7).double().mean().item() - 0.75) < 0.03


def test_same_generator_seed_same_draws():
    probs = torch.softmax(torch.randn(8, 1000, generator=torch.Generator().manual_seed(2)), dim=-1)
    first = inverse_cdf_multinomial(probs, torch.Generator().manual_seed(3))
    again = inverse_cdf_multinomial(probs, torch.Generator().manual_seed(3))
    assert first.shape == (8, 1) and torch.equal(first, again)


def test_the_context_routes_single_draws_and_restores_torch():
    torch_multinomial = torch.multinomial
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    with inverse_cdf_sampling() as calls:
        assert torch.multinomial is not torch_multinomial
        assert torch.multinomial(probs, 1).tolist() == [[1], [2]]
        assert torch.multinomial(torch.tensor([0.2, 0.8]), 2).sort().values.tolist() == [0, 1]  # 1-D: torch's
        with pytest.raises(RuntimeError):
            torch.multinomial(torch.tensor([[0.0, 0.0]]), 1)  # no weight at all: torch's own error
    assert calls == {"inverse_cdf": 1, "torch": 2}
    assert torch.multinomial is torch_multinomial


def test_generate_samples_through_the_context(tiny_model_dir, monkeypatch):
    """`transformers`' sampling loop calls `torch.multinomial`; inside the context that reaches the inverse CDF.
    If a `transformers` upgrade stopped calling it, the speed-up would vanish silently: this fails instead."""
    from transformers import AutoModelForImageTextToText

    import vgrpo.sampling

    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    rows = []

    def counting(probs, generator=None):
        rows.append(probs.shape)
        return inverse_cdf_multinomial(probs, generator)

    monkeypatch.setattr(vgrpo.sampling, "inverse_cdf_multinomial", counting)
    with inverse_cdf_sampling():
        out = model.generate(input_ids=torch.tensor([[1, 2, 3]] * 2), do_sample=True, max_new_tokens=4,
                             min_new_tokens=4, pad_token_id=0)
    assert out.shape == (2, 7)
    assert rows == [(2, model.config.text_config.vocab_size)] * 4
