import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_error
from incontext.ops import FavorFeatures, apply_feature_map, rope_cos_sin
from incontext.ops.linear_attention import (
    linear_attention_chunked,
    linear_attention_parallel,
    linear_attention_recurrent,
)


def make_inputs(seed, b, h, t, d, feature_map, with_state, n_features=None):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(b, h, t, d + 1, generator=g, dtype=torch.float64)
    favor = FavorFeatures(d, n_features or d, seed=seed).double() if feature_map == "favor" else None
    phi_q, phi_k = (apply_feature_map(x * d**-0.25, feature_map, favor) for x in (q, k))
    state = None
    if with_state:
        f = phi_q.shape[-1]
        # a state built from earlier (positive) keys keeps the kernel normalizer away from zero
        earlier = apply_feature_map(torch.randn(b, h, 5, d, generator=g, dtype=torch.float64) * d**-0.25, feature_map, favor)
        state = (torch.randn(b, h, f, d + 1, generator=g, dtype=torch.float64), earlier.sum(-2))
    return phi_q, phi_k, v, state


@given(
    seed=st.integers(0, 10_000),
    t=st.integers(1, 40),
    d=st.sampled_from([2, 4, 8]),
    heads=st.integers(1, 3),
    feature_map=st.sampled_from(["identity", "elu", "taylor", "favor"]),
    normalize=st.booleans(),
    use_rope=st.booleans(),
    with_state=st.booleans(),
    chunk=st.integers(1, 16),
    offset=st.integers(-8, 30),
)
def test_parallel_recurrent_chunked_agree_float64(seed, t, d, heads, feature_map, normalize, use_rope, with_state, chunk, offset):
    # identity features can make the kernel normalizer cross zero; the forms still agree algebraically,
    # but the relative error of a near-zero division is meaningless, so normalize only positive features
    normalize = normalize and feature_map != "identity"
    phi_q, phi_k, v, state = make_inputs(seed, 2, heads, t, d, feature_map, with_state)
    rope = rope_cos_sin(torch.arange(offset, offset + t), phi_q.shape[-1], 10000.0, torch.float64) if use_rope else None
    kwargs = dict(rope=rope, normalize=normalize, state=state)
    ref, (S_ref, z_ref) = linear_attention_recurrent(phi_q, phi_k, v, **kwargs)
    for out, (S, z) in (
        linear_attention_parallel(phi_q, phi_k, v, **kwargs),
        linear_attention_chunked(phi_q, phi_k, v, chunk_size=chunk, **kwargs),
    ):
        assert rel_error(out, ref) < 1e-10
        assert rel_error(S, S_ref) < 1e-10 and rel_error(z, z_ref) < 1e-10


@pytest.mark.parametrize("impl", [linear_attention_parallel, linear_attention_chunked])
def test_identity_kernel_normalized_agrees(impl):
    """Identity features with normalization: well-posed when queries/keys are positive."""
    g = torch.Generator().manual_seed(3)
    phi_q, phi_k = (torch.rand(1, 2, 12, 4, generator=g, dtype=torch.float64) + 0.1 for _ in range(2))
    v = torch.randn(1, 2, 12, 3, generator=g, dtype=torch.float64)
    ref, _ = linear_attention_recurrent(phi_q, phi_k, v, normalize=True)
    out, _ = impl(phi_q, phi_k, v, normalize=True)
    assert rel_error(out, ref) < 1e-12


def test_splitting_a_sequence_through_the_state_is_exact():
    """Running [a; b] equals running a, then b from a's final state (the recurrent view / a cache)."""
    phi_q, phi_k, v, _ = make_inputs(7, 1, 2, 20, 4, "elu", False)
    rope = rope_cos_sin(torch.arange(20), 4, 10000.0, torch.float64)
    full, _ = linear_attention_chunked(phi_q, phi_k, v, rope=rope, chunk_size=6)
    first, state = linear_attention_chunked(phi_q[:, :, :13], phi_k[:, :, :13], v[:, :, :13], rope=tuple(r[:13] for r in rope))
    second, _ = linear_attention_parallel(phi_q[:, :, 13:], phi_k[:, :, 13:], v[:, :, 13:], rope=tuple(r[13:] for r in rope), state=state)
    assert rel_error(torch.cat([first, second], dim=2), full) < 1e-12


def test_matches_explicit_formula():
    """o_i = (R_i phi_q_i)^T sum_j R_j phi_k_j v_j^T / (phi_q_i . sum_j phi_k_j), written out."""
    phi_q, phi_k, v, _ = make_inputs(11, 1, 1, 6, 4, "elu", False)
    cos, sin = rope_cos_sin(torch.arange(6), 4, 10000.0, torch.float64)
    out, _ = linear_attention_recurrent(phi_q, phi_k, v, rope=(cos, sin))

    def R(m):  # explicit rotation matrix, rotate-half layout
        c, s = rope_cos_sin(torch.tensor([m]), 4, 10000.0, torch.float64)
        eye = torch.eye(4, dtype=torch.float64)
        return torch.stack([eye[j] * c[0] + torch.cat([-eye[j][2:], eye[j][:2]]) * s[0] for j in range(4)], 1)

    for i in range(6):
        num = sum((R(i) @ phi_q[0, 0, i]) @ (R(j) @ phi_k[0, 0, j])[:, None] * v[0, 0, j][None] for j in range(i + 1))
        den = sum(phi_q[0, 0, i] @ phi_k[0, 0, j] for j in range(i + 1))
        assert torch.allclose(out[0, 0, i], (num / den).squeeze(0), atol=1e-12)


def test_favor_features_estimate_the_softmax_kernel():
    g = torch.Generator().manual_seed(0)
    d = 8
    q, k = (torch.randn(64, d, generator=g, dtype=torch.float64) * 0.25 for _ in range(2))
    exact = torch.exp((q * k).sum(-1))
    errors = {}
    for orthogonal in (False, True):
        favor = FavorFeatures(d, 8192, orthogonal=orthogonal, seed=1).double()
        estimate = (favor(q) * favor(k)).sum(-1)
        errors[orthogonal] = (estimate / exact - 1).abs().mean()
        assert errors[orthogonal] < 0.03  # theory: relative std ~ sqrt((e^{|q+k|^2} - 1) / m) ~ 1.4%
    assert (favor(q) > 0).all()


def test_taylor_features_give_the_second_order_exp_kernel():
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(10, 6, generator=g, dtype=torch.float64) for _ in range(2))
    dot = (q * k).sum(-1)
    kernel = (apply_feature_map(q, "taylor") * apply_feature_map(k, "taylor")).sum(-1)
    assert torch.allclose(kernel, 1 + dot + dot**2 / 2, atol=1e-12)
    assert apply_feature_map(q, "taylor").shape[-1] % 2 == 0 and (kernel >= 0.5 - 1e-12).all()


def test_orthogonal_favor_rows_are_orthogonal_within_blocks():
    favor = FavorFeatures(6, 12, orthogonal=True, seed=2)
    w = favor.projection[:6].double()  # stored in float32: orthogonal to float32 rounding
    gram = w @ w.T
    assert torch.allclose(gram - torch.diag(gram.diagonal()), torch.zeros(6, 6, dtype=torch.float64), atol=1e-5)
    same_seed = FavorFeatures(6, 12, orthogonal=True, seed=2).double()
    assert torch.equal(favor.projection, same_seed.projection)
    assert not torch.equal(favor.projection, FavorFeatures(6, 12, orthogonal=True, seed=3).double().projection)


def test_gradients_agree_between_forms():
    phi_q, phi_k, v, _ = make_inputs(5, 1, 2, 15, 4, "elu", False)
    grads = []
    for impl, kw in ((linear_attention_recurrent, {}), (linear_attention_chunked, {"chunk_size": 4}), (linear_attention_parallel, {})):
        leaves = [x.clone().requires_grad_() for x in (phi_q, phi_k, v)]
        out, _ = impl(*leaves, **kw)
        out.pow(2).sum().backward()
        grads.append([x.grad for x in leaves])
    for other in grads[1:]:
        for a, b in zip(other, grads[0]):
            assert rel_error(a, b) < 1e-10
    assert math.isfinite(float(grads[0][0].sum()))


@pytest.mark.parametrize("seed,t", [(0, 1), (1, 8), (2, 63), (3, 64)])
def test_short_sequence_takes_the_parallel_form(seed, t):
    """A sequence that fits one chunk (a short query after a converted prompt) runs the parallel form: the
    same numbers bit for bit, no padding to the chunk size; still equal to the recurrent reference."""
    phi_q, phi_k, v, state = make_inputs(seed, 2, 3, t, 8, "elu", with_state=True)
    rope = rope_cos_sin(torch.arange(40, 40 + t), phi_q.shape[-1], 10000.0, torch.float64)
    kwargs = dict(rope=rope, normalize=True, state=state)
    out, (S, z) = linear_attention_chunked(phi_q, phi_k, v, chunk_size=64, **kwargs)
    parallel, (S_p, z_p) = linear_attention_parallel(phi_q, phi_k, v, **kwargs)
    assert torch.equal(out, parallel) and torch.equal(S, S_p) and torch.equal(z, z_p)
    ref, (S_ref, z_ref) = linear_attention_recurrent(phi_q, phi_k, v, **kwargs)
    assert rel_error(out, ref) < 1e-12 and rel_error(S, S_ref) < 1e-12 and rel_error(z, z_ref) < 1e-12
