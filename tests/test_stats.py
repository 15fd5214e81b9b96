"""Summary statistics against plain computations written here."""

import math
import random

import pytest
from scipy import stats as scipy_stats

from incontext.stats import accuracy_interval95, mean_3se, mean_std, pairwise_t_tests, t_interval95


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_std_and_mean_3se(seed):
    values = [random.Random(seed).uniform(-5, 5) for _ in range(2 + seed)]
    mean = sum(values) / len(values)
    population = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    sample = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert mean_std(values) == pytest.approx((mean, population), rel=1e-12)
    assert mean_3se(values) == pytest.approx((mean, 3 * sample / math.sqrt(len(values))), rel=1e-12)
    assert mean_3se([values[0]]) == (values[0], 0.0)


def test_t_interval95():
    row = t_interval95([0.0, 1.0, 0.0, 1.0])
    assert row["mean"] == 0.5 and row["n"] == 4
    half = scipy_stats.t.ppf(0.975, 3) * math.sqrt(1 / 3) / 2
    assert math.isclose(row["high"] - row["mean"], half, rel_tol=1e-12)
    assert math.isclose(row["mean"] - row["low"], half, rel_tol=1e-12)
    assert math.isnan(t_interval95([1.0])["low"])


def test_accuracy_interval95():
    assert accuracy_interval95(50, 100) == pytest.approx(100 * 1.96 * 0.05)
    with_seeds = accuracy_interval95(40, 400, seed_std=3.0, seeds=3)
    assert with_seeds == pytest.approx(100 * 1.96 * (0.24 / 400 + 0.03 ** 2 / 3) ** 0.5)
    assert with_seeds > accuracy_interval95(40, 400)


def test_pairwise_t_tests():
    groups = {"a": [1.0, 2.0, 3.0], "b": [2.0, 4.0, 7.0], "c": [1.0, math.inf, 2.0], "d": [5.0, 5.0, 5.0]}
    tests = pairwise_t_tests(groups)
    # c has a run that never crossed (inf); a pair without spread (d vs d) would be undefined
    assert set(tests) == {"a vs b", "a vs d", "b vs d"}
    t, p = scipy_stats.ttest_ind(groups["a"], groups["b"])
    assert tests["a vs b"] == pytest.approx({"t": t, "p": p}, rel=1e-12)
    assert pairwise_t_tests({"a": [1.0], "b": [2.0]}) == {}


def test_t_quantile_without_scipy_matches_scipy(monkeypatch):
    """Machines with only torch (the device check) use the table and the Cornish-Fisher series."""
    import builtins

    from scipy import stats as scipy_stats

    from incontext.stats import t_quantile975

    expected = {df: float(scipy_stats.t.ppf(0.975, df)) for df in (1, 2, 7, 30, 31, 45, 200, 5000)}
    real = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    for df, value in expected.items():
        assert abs(t_quantile975(df) - value) < 2e-6, df


def test_bootstrap_interval_stays_within_the_shares():
    from incontext.stats import bootstrap_interval95, t_interval95

    values = [0.0, 0.0, 0.0, 1 / 7, 0.0, 2 / 7]  # few episodes, mostly wrong: the t-interval goes below 0
    assert t_interval95(values)["low"] < 0
    interval = bootstrap_interval95(values)
    assert 0.0 <= interval["low"] <= interval["mean"] <= interval["high"] <= 2 / 7
    assert interval == bootstrap_interval95(values)  # seeded: the same interval every time


def test_paired_share_interval():
    from incontext.stats import paired_share_interval95

    reference, method = [0.5, 0.75, 1.0, 0.25], [0.25, 0.75, 0.5, 0.25]
    out = paired_share_interval95(method, reference)
    assert abs(out["share"] - 1.75 / 2.5) < 1e-12 and out["low"] <= out["share"] <= out["high"] <= 1.0
    same = paired_share_interval95(reference, reference)
    assert same["share"] == same["low"] == same["high"] == 1.0  # paired: no spread against itself
