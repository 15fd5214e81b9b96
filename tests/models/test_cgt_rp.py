"""R_P, the distribution-matching regulariser of CGT App. A.2 (models/cgt_losses.py): the formula against a plain loop
in float64, zero only for statistics that match the prior, and wired into the objective with its weight."""

import pytest
import torch

from incontext.experiments.cgt_table1 import Table1Config, variant_settings
from incontext.models.cgt_losses import CGTLossConfig, distribution_matching_penalty, prior_kernel


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_r_p_equals_its_formula(seed):
    g = torch.Generator().manual_seed(seed)
    b, n, d = 5, 6, 3
    y = torch.randn(b, n, d, generator=g, dtype=torch.float64)
    kernel = prior_kernel(n, "rbf", nugget=0.1, length_scale=0.3)
    mean = [[sum(y[k, s, i] for k in range(b)) / b for i in range(d)] for s in range(n)]
    first = sum(mean[s][i] ** 2 for s in range(n) for i in range(d)) / n
    second = 0.0
    for s in range(n):
        for t in range(n):
            for i in range(d):
                for j in range(d):
                    cov = sum((y[k, s, i] - mean[s][i]) * (y[k, t, j] - mean[t][j]) for k in range(b)) / b
                    second += (cov - kernel[s, t] * (i == j)) ** 2
    assert torch.allclose(distribution_matching_penalty(y, kernel), first + second / n**2, rtol=1e-12, atol=0)


def test_r_p_is_small_for_draws_of_the_prior_and_large_for_white_noise():
    n, d = 8, 2
    kernel = prior_kernel(n, "rbf", nugget=0.03, length_scale=0.25)
    g = torch.Generator().manual_seed(0)
    chol = torch.linalg.cholesky(kernel)
    draws = torch.einsum("st,btd->bsd", chol, torch.randn(20000, n, d, generator=g, dtype=torch.float64))
    noise = torch.randn(20000, n, d, generator=g, dtype=torch.float64)
    assert distribution_matching_penalty(draws, kernel) < 0.01 < distribution_matching_penalty(noise, kernel)


def test_the_rp_variant_trains_with_r_p_and_a_negative_weight_is_refused():
    settings = variant_settings(Table1Config(variants=["cgt_aux_rp"], w_p=0.5), "cgt_aux_rp", 0)
    assert settings["loss"]["w_p"] == 0.5 and "w_c" not in settings["loss"]
    with pytest.raises(ValueError, match="w_p must be >= 0"):
        CGTLossConfig(w_p=-1.0)
