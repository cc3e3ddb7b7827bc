"""Bootstrap intervals and McNemar's test (vgrpo/intervals.py): seeded, paired, and over seeds."""

from __future__ import annotations

import pytest

from vgrpo import intervals


def test_bootstrap_interval_is_seeded_and_narrows_with_more_data():
    few = [True, False] * 5
    many = [True, False] * 500
    assert intervals.bootstrap_ci(few, 1000, 0) == intervals.bootstrap_ci(few, 1000, 0)
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(intervals.bootstrap_ci(many, 1000, 0)) < width(intervals.bootstrap_ci(few, 1000, 0))
    assert intervals.bootstrap_ci([True] * 20, 500, 1) == [1.0, 1.0]


def test_bootstrap_interval_of_real_valued_scores_brackets_their_mean():
    """bench/kl_to_start.py passes nats per answer, not right-or-wrong: the interval is over their mean."""
    scores = [0.5, 1.5, 0.9, 1.1, 0.2, 1.8, 1.0, 1.0]
    low, high = intervals.bootstrap_ci(scores, 2000, 0)
    assert low < sum(scores) / len(scores) < high and 0.2 < low and high < 1.8
    assert intervals.bootstrap_ci([0.75] * 10, 500, 3) == [0.75, 0.75]


def test_paired_interval_and_mcnemar_on_a_known_difference():
    """100 images: both right on 40, only trained on 30, only base on 5, both wrong on 25. The gain is
    exactly 0.25; the pairing makes the interval far narrower than two independent intervals would."""
    base = [True] * 40 + [False] * 30 + [True] * 5 + [False] * 25
    trained = [True] * 40 + [True] * 30 + [False] * 5 + [False] * 25
    low, high = intervals.paired_bootstrap_ci(base, trained, 2000, 0)
    assert low < 0.25 < high and low > 0.1 and high < 0.4
    from scipy.stats import binom

    assert intervals.mcnemar_p(base, trained) == pytest.approx(2 * binom.cdf(5, 35, 0.5), rel=1e-3)
    assert intervals.mcnemar_p(base, trained) < 1e-4
    unpaired = [a - b for a, b in zip(intervals.bootstrap_ci(trained, 2000, 0)[::-1],
                                      intervals.bootstrap_ci(base, 2000, 0), strict=True)]
    assert high - low < unpaired[0] - unpaired[1]  # narrower than the difference of independent intervals


def test_identical_models_have_a_zero_interval_and_p_one():
    same = [True, False, True, True, False] * 8
    assert intervals.paired_bootstrap_ci(same, same, 1000, 0) == [0.0, 0.0]
    assert intervals.mcnemar_p(same, same) == 1.0


def test_interval_over_seeds_holds_the_mean_gain_and_narrows_with_seeds():
    """Two seeds with gains 0.25 and 0.05 on 100 images each: the interval holds their mean, 0.15, and is
    narrower than one seed's (each resample averages two seeds' draws); one pair gives paired_bootstrap_ci's
    interval, and a seed without images is left out."""
    base = [True] * 40 + [False] * 30 + [True] * 5 + [False] * 25
    trained = [True] * 40 + [True] * 30 + [False] * 5 + [False] * 25
    small_base = [True] * 40 + [False] * 10 + [True] * 5 + [False] * 45
    small_trained = [True] * 40 + [True] * 10 + [False] * 5 + [False] * 45
    low, high = intervals.mean_paired_bootstrap_ci([(base, trained), (small_base, small_trained)], 2000, 0)
    assert low < 0.15 < high
    one_low, one_high = intervals.mean_paired_bootstrap_ci([(base, trained)], 2000, 0)
    assert high - low < one_high - one_low
    assert [round(b, 4) for b in (one_low, one_high)] == intervals.paired_bootstrap_ci(base, trained, 2000, 0)
    assert intervals.mean_paired_bootstrap_ci([(base, trained), ([], [])], 2000, 0) == [one_low, one_high]
    assert intervals.mean_paired_bootstrap_ci([], 2000, 0) == [0.0, 0.0]


def test_interval_with_the_seed_as_the_unit_is_students_t():
    """Per-seed gains 1..5: mean 3, standard error sqrt(2.5/5), t(0.975, 4 df) 2.776, so 3 -+ 1.963. One seed far
    from the rest widens it past 0 where the images' interval would not notice (the OOD case in
    docs/cpu-research.md); one seed gives no interval."""
    low, high = intervals.over_seeds_ci([1, 2, 3, 4, 5])
    assert low == pytest.approx(3 - 1.9632, abs=1e-3) and high == pytest.approx(3 + 1.9632, abs=1e-3)
    assert intervals.over_seeds_ci([0.02, 0.02, 0.02]) == pytest.approx([0.02, 0.02])
    low, _ = intervals.over_seeds_ci([0.158, -0.017, 0.033, -0.025, 0.067])
    assert low < 0
    assert intervals.over_seeds_ci([0.1]) is None and intervals.over_seeds_ci([]) is None
