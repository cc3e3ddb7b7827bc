"""pass@k's estimate (Chen et al., arXiv 2107.03374): the chance that k answers drawn without replacement from
n sampled ones hold a right one, averaged over the images."""

from __future__ import annotations

from itertools import combinations

import pytest

from vgrpo.pass_at_k import pass_at_k, pass_rates


@pytest.mark.parametrize(("n", "right", "k"), [(4, 1, 1), (4, 1, 2), (4, 2, 2), (5, 2, 3), (6, 0, 3), (6, 6, 1)])
def test_pass_at_k_is_the_share_of_k_subsets_that_hold_a_right_answer(n, right, k):
    answers = [True] * right + [False] * (n - right)
    subsets = list(combinations(answers, k))
    assert pass_at_k(n, right, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_1_is_the_share_right_and_pass_at_n_any_right():
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)
    assert pass_at_k(16, 1, 16) == 1.0 and pass_at_k(16, 0, 16) == 0.0


def test_more_k_than_samples_is_an_error_that_names_both():
    with pytest.raises(ValueError, match=r"pass@8 needs at least 8 samples, got 4"):
        pass_at_k(4, 1, 8)


def test_pass_rates_average_over_images_for_each_k():
    assert pass_rates([4, 0, 2], 4, [1, 4]) == {"pass@1": 0.5, "pass@4": round(2 / 3, 4)}
    assert pass_rates([], 4, [1, 4]) == {}


def test_the_estimate_loads_without_torch():
    """bench/cpu_seeds.py's report computes each image's pass@k from saved counts: it loads no model, so the
    estimate's module must not pull in torch (a few seconds per report)."""
    import subprocess
    import sys

    from conftest import ROOT

    code = "import sys, vgrpo.pass_at_k; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]
