"""How sure an accuracy or a difference of accuracies is: percentile bootstrap intervals (paired when two
models answered the same images, and over seeds' images), a Student-t interval with the seed as the unit, and
McNemar's exact test. Numpy and scipy only, so a report script imports it without loading torch."""

from __future__ import annotations

import numpy as np


def bootstrap_ci(scores: list[float], samples: int, seed: int) -> list[float]:
    """95% percentile bootstrap interval for the mean of per-image scores (right or not: the accuracy)."""
    values = np.asarray(scores, dtype=float)
    if values.size == 0:
        return [0.0, 0.0]
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(samples, values.size))].mean(axis=1)
    return [round(float(np.percentile(means, 2.5)), 4), round(float(np.percentile(means, 97.5)), 4)]


def paired_bootstrap_ci(base: list[bool], trained: list[bool], samples: int, seed: int) -> list[float]:
    """95% percentile bootstrap interval for accuracy(trained) - accuracy(base). Each resample draws the
    same images for both models: the two answered the same images, and pairing removes the variance
    that the images' difficulty puts into both accuracies alike."""
    return [round(bound, 4) for bound in mean_paired_bootstrap_ci([(base, trained)], samples, seed)]


def mean_paired_bootstrap_ci(pairs: list[tuple[list[float], list[float]]], samples: int, seed: int) -> list[float]:
    """95% percentile bootstrap interval for the mean over `pairs` (one (base, trained) per seed) of
    mean(trained) - mean(base), per-image scores (right or not, or a pass@k): each resample draws every seed's
    images anew, paired as above.
    Not rounded: a report rounds it once (bench/cpu_seeds.py prints tenths of a point)."""
    rng = np.random.default_rng(seed)
    gains, used = np.zeros(samples), 0
    for base, trained in pairs:
        diff = np.asarray(trained, dtype=float) - np.asarray(base, dtype=float)
        if diff.size:
            gains += diff[rng.integers(0, diff.size, size=(samples, diff.size))].mean(axis=1)
            used += 1
    if not used:
        return [0.0, 0.0]
    gains /= used
    return [float(np.percentile(gains, 2.5)), float(np.percentile(gains, 97.5))]


def over_seeds_ci(per_seed: list[float]) -> list[float] | None:
    """95% Student-t interval for the mean of per-seed differences, the seed the unit: it counts how much a
    result moves from one training run to the next, which resampling a fixed set of seeds' images does not.
    None for fewer than two seeds."""
    from scipy.stats import t

    values = np.asarray(per_seed, dtype=float)
    if values.size < 2:
        return None
    half = t.ppf(0.975, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return [float(values.mean() - half), float(values.mean() + half)]


def mcnemar_p(base: list[bool], trained: list[bool]) -> float:
    """Exact two-sided McNemar test: are the images only the trained model gets right more (or fewer)
    than those only the base gets right, beyond chance? 1.0 when the two never disagree."""
    from scipy.stats import binomtest

    trained_only = sum(t and not b for b, t in zip(base, trained, strict=True))
    base_only = sum(b and not t for b, t in zip(base, trained, strict=True))
    if trained_only + base_only == 0:
        return 1.0
    return float(f"{binomtest(trained_only, trained_only + base_only, 0.5).pvalue:.4g}")  # 4 significant digits
