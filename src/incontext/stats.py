"""Summary statistics over seeds, episodes and queries, shared by the harness and the experiments: means with
their spread, 95% intervals and t-tests. scipy (a dependency of the package) supplies the t distribution."""

from __future__ import annotations

import math
import statistics

import numpy as np


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation (over seeds, as the papers report them)."""
    return float(np.mean(values)), float(np.std(values))


def mean_3se(values: list[float]) -> tuple[float, float]:
    """Mean and 3 standard errors (sample std / sqrt(n); 0 for a single value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, 3 * std / math.sqrt(n)


# Student t 0.975 quantiles for 1..30 degrees of freedom (standard tables, to 1e-6)
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
         2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
         2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272)


def t_quantile975(df: int) -> float:
    """The 0.975 quantile of Student's t: scipy's where it is installed; else the table (df <= 30) or the
    Cornish-Fisher series around the normal quantile (df > 30, error < 1e-6), for machines with only torch."""
    try:
        from scipy import stats
    except ImportError:
        if df <= len(_T975):
            return _T975[df - 1]
        z = 1.959963984540054
        return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
                + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))
    return float(stats.t.ppf(0.975, df))


def t_interval95(values: list[float]) -> dict[str, float]:
    """Mean and 95% t-interval of the mean (half-width NaN for fewer than 2 values)."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    if n < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": n}
    half = t_quantile975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def accuracy_interval95(accuracy_percent: float, n_queries: int, seed_std: float = 0.0, seeds: int = 1) -> float:
    """Half-width (points) of a 95% normal interval of an accuracy on n test queries; with demonstration draws,
    their spread (std in points) enters as the error of a mean over `seeds` draws."""
    p = accuracy_percent / 100
    return 100 * 1.96 * math.sqrt(p * (1 - p) / n_queries + (seed_std / 100) ** 2 / seeds)


def pairwise_t_tests(groups: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Two-sample t-tests between every pair of groups ("a vs b", in the groups' order), for pairs whose values
    are all finite, with at least two values and some spread (else the test is undefined and left out)."""
    from scipy import stats

    names, tests = list(groups), {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = np.array(groups[a]), np.array(groups[b])
            if np.isfinite(x).all() and np.isfinite(y).all() and len(x) > 1 and (x.std() + y.std()) > 0:
                t, p = stats.ttest_ind(x, y)
                tests[f"{a} vs {b}"] = {"t": float(t), "p": float(p)}
    return tests


def bootstrap_interval95(values: list[float], resamples: int = 4000, seed: int = 0) -> dict[str, float]:
    """Mean and 95% percentile-bootstrap interval of the mean over `values` (episodes resampled with replacement, a
    fixed seed): it stays within the values' range (an exact-match share in [0, 1] keeps its interval in [0, 1],
    where a t-interval of few episodes goes below 0). NaN bounds for fewer than 2 values."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    if n < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": n, "interval": "bootstrap"}
    rng = np.random.default_rng(seed)
    means = np.asarray(values, dtype=np.float64)[rng.integers(0, n, size=(resamples, n))].mean(1)
    low, high = np.quantile(means, [0.025, 0.975])
    return {"mean": mean, "low": float(low), "high": float(high), "n": n, "interval": "bootstrap"}


def paired_share_interval95(method: list[float], reference: list[float], resamples: int = 4000,
                            seed: int = 0) -> dict[str, float]:
    """The share sum(method) / sum(reference) (e.g. a method's exact-match answers as a share of keep-prompt's) with a
    95% paired percentile-bootstrap interval: episodes resampled together for both (their difficulty shared)."""
    if len(method) != len(reference) or not method:
        raise ValueError(f"paired scores need the same episodes, got {len(method)} and {len(reference)}")
    m, r = np.asarray(method, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    share = float(m.sum() / r.sum()) if r.sum() else float("nan")
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(m), size=(resamples, len(m)))
    top, bottom = m[index].sum(1), r[index].sum(1)
    shares = top[bottom > 0] / bottom[bottom > 0]
    if len(shares) < 2:
        return {"share": share, "low": float("nan"), "high": float("nan"), "n": len(m)}
    low, high = np.quantile(shares, [0.025, 0.975])
    return {"share": share, "low": float(low), "high": float(high), "n": len(m)}
