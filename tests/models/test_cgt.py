"""CGT model and losses: the fast paths against plain references in float64."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_error
from incontext.models.cgt import CGT, CGTConfig, LowRankGenerator
from incontext.models.cgt_losses import (
    CGTLossConfig,
    aux_outputs,
    cgt_loss,
    continuity_penalty,
    decorrelation_penalty,
    gaussian_kl,
    position_profile,
    prior_kernel,
    sample_aux_chunks,
)


def tiny_cgt(seed=0, **overrides) -> CGT:
    options = dict(n_layer=3, split_layer=1, d_x=16, n_head_x=2, d_y=8, n_head_y=2, rank=2, n_templates=3,
                   vocab_size=13, max_seq_len=40)
    options.update(overrides)
    torch.manual_seed(seed)
    model = CGT(CGTConfig(**options)).double()
    with torch.no_grad():  # non-trivial T (the left templates start at zero)
        for name, p in model.named_parameters():
            if name.endswith((".left", ".right")):
                p.normal_(0.0, 0.3)
    return model.eval()


def inputs_for(model: CGT, batch: int, length: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if model.config.tokens:
        return torch.randint(0, model.config.vocab_size, (batch, length), generator=g)
    return torch.randn(batch, length, model.config.d_input, generator=g, dtype=torch.float64)


@given(d_x=st.integers(1, 12), d_y=st.integers(1, 6), rank=st.integers(1, 4), m=st.integers(1, 5),
       mixing=st.sampled_from(["tanh", "softmax"]), seed=st.integers(0, 10**6))
def test_generator_matches_the_dense_operator(d_x, d_y, rank, m, mixing, seed):
    torch.manual_seed(seed)
    gen = LowRankGenerator(d_x, d_y, rank, m, mixing).double()
    with torch.no_grad():
        gen.left.normal_(), gen.right.normal_(), gen.mix.weight.normal_(), gen.mix.bias.normal_()
    h, y = torch.randn(2, 5, d_x, dtype=torch.float64), torch.randn(2, 5, d_y, dtype=torch.float64)
    expected = torch.empty_like(h)
    for b in range(2):
        for t in range(5):  # T = I + L R_x^T (dense d_x x d_x) plus L r_b, per position
            scores = gen.mix.weight @ y[b, t] + gen.mix.bias
            sigma = torch.tanh(scores) if mixing == "tanh" else torch.softmax(scores, -1)
            left = sum(sigma[k] * gen.left[k] for k in range(m))
            right = sum(sigma[k] * gen.right[k] for k in range(m))
            dense = torch.eye(d_x, dtype=torch.float64) + left @ right[:-1].T
            expected[b, t] = dense @ h[b, t] + left @ right[-1]
    assert rel_error(gen(h, y), expected) < 1e-12


def test_generator_starts_as_identity():
    gen = CGT(CGTConfig(n_layer=2, split_layer=1, d_x=8, n_head_x=2, d_y=4, n_head_y=1, vocab_size=5)).blocks[1].t_attn
    h = torch.randn(2, 3, 8)
    assert torch.equal(gen(h, torch.randn(2, 3, 4)), h)


def test_x_stream_never_reads_y():
    model = tiny_cgt(split_layer=2, n_layer=3)
    x = inputs_for(model, 2, 12)
    y = torch.randn(2, 8, dtype=torch.float64)
    before = model(x, y=y)
    with torch.no_grad():  # every y-stream weight of stage 1
        for name, p in model.named_parameters():
            if "_y" in name or "norm_y" in name:
                p.add_(torch.randn_like(p))
    assert torch.equal(model(x, y=y), before)


def test_dynamic_pass_is_causal_and_equals_a_given_per_position_context():
    model = tiny_cgt()
    x = inputs_for(model, 2, 15)
    out = model.run(x)
    assert rel_error(model(x, y=out.y), out.logits) < 1e-12
    changed = x.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % model.config.vocab_size
    assert torch.allclose(model(changed)[:, :9], out.logits[:, :9], atol=0, rtol=1e-12)
    assert not torch.allclose(model(changed)[:, 9:], out.logits[:, 9:])
    assert rel_error(model.context(x), out.y) < 1e-12


@given(cuts=st.integers(1, 5), horizon=st.sampled_from([None, 0, 3]), seed=st.integers(0, 10**6),
       tokens=st.booleans())
def test_aux_pass_equals_separate_truncated_runs(cuts, horizon, seed, tokens):
    model = tiny_cgt(seed % 7) if tokens else tiny_cgt(seed % 7, vocab_size=None, d_input=3, d_output=2)
    x = inputs_for(model, 3, 14, seed)
    y = model.run(x).y
    chunks = sample_aux_chunks(3, 14, cuts, torch.Generator().manual_seed(seed), horizon=horizon)
    got = aux_outputs(model, x, y, chunks)
    for b in range(3):
        starts = [t for t in range(14) if t == 0 or chunks.segments[b, t] != chunks.segments[b, t - 1]]
        assert len(starts) == min(cuts, 12) + 1 and starts[1] >= 2
        for start, end in zip(starts, starts[1:] + [14]):
            if start == 0:  # before the first cut: not scored
                assert not chunks.scored[b, :end].any()
                continue
            alone = model(x[b : b + 1, start:end], y=y[b : b + 1, start - 1])  # positions restart at 0
            assert rel_error(got[b, start:end], alone[0]) < 1e-10
            scored = chunks.scored[b, start:end]
            assert scored.all() if horizon is None else scored.sum() == min(horizon + 1, end - start)


def test_aux_loss_sends_gradients_into_the_context_stream():
    model = tiny_cgt().train()
    x = inputs_for(model, 4, 20)
    config = CGTLossConfig(eta=0.0, aux_cuts=3)

    def task_loss(logits, scored):
        targets = torch.roll(x, -1, 1)
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        return losses[scored].mean() if scored is not None else losses.mean()

    loss, parts = cgt_loss(model, x, task_loss, config, torch.Generator().manual_seed(0))
    loss.backward()
    assert set(parts) == {"loss_task", "loss_aux"} and loss.item() == pytest.approx(parts["loss_aux"])
    assert model.tok_emb_y.weight.grad.abs().sum() > 0  # y~ is not detached
    assert model.blocks[0].attn_y.qkv.weight.grad.abs().sum() > 0


def test_regularisers_match_plain_loops():
    torch.manual_seed(0)
    y = torch.randn(3, 6, 4, dtype=torch.float64)
    n = y / y.norm(dim=-1, keepdim=True)
    for profile in ("constant", "linear", "quadratic"):
        zeta = position_profile(6, profile, dtype=torch.float64)
        assert zeta.mean().item() == pytest.approx(1.0)
        r_c = sum(zeta[s] * (n[b, s] - n[b, s - 1]).square().sum() for b in range(3) for s in range(1, 6)) / 15
        r_d = sum(zeta[s] * (n[a, s] @ n[b, s] - float(a == b)) ** 2 for s in range(6) for a in range(3) for b in range(3)) / 54
        assert continuity_penalty(y, profile).item() == pytest.approx(r_c.item(), rel=1e-12)
        assert decorrelation_penalty(y, profile).item() == pytest.approx(r_d.item(), rel=1e-12)
    assert continuity_penalty(y[:, :1].expand(-1, 6, -1)).item() == 0.0


@pytest.mark.parametrize("kind", ["rbf", "icl"])
def test_gaussian_kl_matches_torch_distributions(kind):
    torch.manual_seed(0)
    kernel = prior_kernel(7, kind, nugget=0.1, length_scale=0.3, eps=0.5)
    assert torch.allclose(kernel, kernel.T) and torch.linalg.eigvalsh(kernel).min() > 0
    mu, logvar = torch.randn(2, 7, 3, dtype=torch.float64), torch.randn(2, 7, 3, dtype=torch.float64)
    prior = torch.distributions.MultivariateNormal(torch.zeros(7, dtype=torch.float64), kernel)
    expected = [sum(torch.distributions.kl_divergence(
        torch.distributions.MultivariateNormal(mu[b, :, i], torch.diag(logvar[b, :, i].exp())), prior) for i in range(3))
        for b in range(2)]
    assert torch.allclose(gaussian_kl(mu, logvar, kernel), torch.stack(expected), rtol=1e-10)
    if kind == "icl":  # eq. (1): K_st = 1 + eps^2 min(s, t) / (s t)
        assert kernel[1, 3].item() == pytest.approx(1 + 0.25 * 2 / 8)


def test_vae_samples_in_training_and_uses_the_mean_in_eval():
    model = tiny_cgt(vae=True)
    x = inputs_for(model, 2, 10)
    out = model.run(x)
    assert torch.equal(out.y, out.mu)
    model.train()
    sampled = model.run(x, generator=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled.y, sampled.mu)
    loss, parts = cgt_loss(model, x, lambda logits, scored: logits.square().mean(),
                           CGTLossConfig(eta=1.0, beta=0.5, w_c=0.1, w_d=0.1), torch.Generator().manual_seed(0))
    assert set(parts) == {"loss_task", "r_c", "r_d", "kl"} and torch.isfinite(loss)


def test_bad_configs_and_inputs_are_reported():
    with pytest.raises(ValueError, match="split_layer"):
        CGTConfig(n_layer=2, split_layer=2, vocab_size=5)
    with pytest.raises(ValueError, match="divisible"):
        CGTConfig(d_x=10, n_head_x=3, vocab_size=5)
    with pytest.raises(ValueError, match="mixing"):
        CGTConfig(mixing="relu", vocab_size=5)
    with pytest.raises(ValueError, match="eta"):
        CGTLossConfig(eta=1.5)
    model = tiny_cgt()
    with pytest.raises(ValueError, match="given context"):
        model(inputs_for(model, 2, 5), y=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="max_seq_len"):
        model(inputs_for(model, 1, 5), position_offset=38)
    with pytest.raises(ValueError, match="VAE"):
        cgt_loss(model, inputs_for(model, 2, 5), lambda o, s: o.sum(), CGTLossConfig(beta=1.0), torch.Generator())
