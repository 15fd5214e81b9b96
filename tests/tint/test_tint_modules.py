"""Each TinT module against a plain-PyTorch reference in float64: exact ones to 1e-10, first-order
(finite-difference) ones O(eps) with the error slope checked over eps."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_error
from hypothesis import given
from hypothesis import strategies as st

from incontext.tint.counting import module_rows, paper_sizes
from incontext.tint.hsplit import (
    DimensionWise,
    HSplitLinear,
    SplitWise,
    build_parameter_tree,
    count_weights,
    module_parameters,
    output_map_linear_forward,
    query_map_linear_backward,
)
from incontext.tint.modules import (
    ActivationBackward,
    ActivationForward,
    AuxAttentionForward,
    AuxAttentionValueBackward,
    Layout,
    LinearBackward,
    LinearDescent,
    LinearForward,
    LMHeadGradient,
    NormBackward,
    NormForward,
    TintConfig,
    group_norm,
)

DT = torch.float64
# (D_aux, rows per prefix S, shards S', bias slot)
LAYOUTS = [(12, 3, 3, True), (12, 4, 3, True), (16, 5, 4, True), (12, 4, 4, False), (18, 4, 3, True)]
layouts = st.sampled_from(LAYOUTS)


def make_layout(spec):
    d, S, shards, bias_slot = spec
    return Layout(d, TintConfig(rows_per_prefix=S, shards=shards, bias_slot=bias_slot))


def random_tokens(layout, T, g):
    return torch.randn(T, layout.d_sim, generator=g, dtype=DT)


@given(spec=layouts, seed=st.integers(0, 10_000))
def test_pack_read_roundtrip(spec, seed):
    L = make_layout(spec)
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(L.d_aux, L.d_aux, generator=g, dtype=DT)
    b = torch.randn(L.d_aux, generator=g, dtype=DT) if L.bias_slot else None
    prefix = L.pack(W, b)
    assert prefix.shape == (L.K, L.d_sim)
    W2, b2 = L.read(prefix)
    assert torch.equal(W2, W)
    if L.bias_slot:
        assert torch.equal(b2, b)


def test_layout_errors():
    with pytest.raises(ValueError, match="not divisible by shards"):
        Layout(10, TintConfig(shards=3))
    with pytest.raises(ValueError, match="shards <= rows_per_prefix"):
        Layout(24, TintConfig(rows_per_prefix=3, shards=6))
    with pytest.raises(ValueError, match=">= 4 slots"):
        Layout(12, TintConfig(rows_per_prefix=2, shards=2))
    L = Layout(12, TintConfig(rows_per_prefix=4, shards=4, bias_slot=False))
    with pytest.raises(ValueError, match="needs bias_slot=True"):
        L.pack(torch.zeros(12, 12), torch.ones(12))


@given(spec=layouts, seed=st.integers(0, 10_000), T=st.integers(1, 6), src=st.integers(0, 3), dst=st.integers(0, 3),
       accumulate=st.booleans())
def test_linear_forward_exact(spec, seed, T, src, dst, accumulate):
    L = make_layout(spec)
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(L.d_aux, L.d_aux, generator=g, dtype=DT)
    b = torch.randn(L.d_aux, generator=g, dtype=DT) if L.bias_slot else None
    tokens = random_tokens(L, T, g)
    out = LinearForward(L)(L.pack(W, b), tokens, src, dst, accumulate=accumulate)
    expected = L.slot(tokens, src) @ W.T + (b if b is not None else 0) + (L.slot(tokens, dst) if accumulate else 0)
    assert rel_error(L.slot(out, dst), expected) < 1e-12
    for other in range(L.n_slots):  # the residual keeps every other slot
        if other != dst:
            assert torch.equal(L.slot(out, other), L.slot(tokens, other))


@given(spec=layouts, seed=st.integers(0, 10_000), T=st.integers(1, 6))
def test_linear_backward_exact(spec, seed, T):
    L = make_layout(spec)
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(L.d_aux, L.d_aux, generator=g, dtype=DT)
    tokens = random_tokens(L, T, g)
    out = LinearBackward(L)(L.pack(W), tokens, 0, 2)
    assert rel_error(L.slot(out, 2), L.slot(tokens, 0) @ W) < 1e-12


@given(spec=layouts, seed=st.integers(0, 10_000), T=st.integers(2, 7), update_weight=st.booleans(), update_bias=st.booleans())
def test_linear_descent_exact(spec, seed, T, update_weight, update_bias):
    L = make_layout(spec)
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(L.d_aux, L.d_aux, generator=g, dtype=DT)
    b = torch.randn(L.d_aux, generator=g, dtype=DT) if L.bias_slot else None
    tokens = random_tokens(L, T, g)
    train = torch.zeros(T, dtype=torch.bool)
    train[: T - 1] = True  # the last token is not a training token
    eta = 0.37
    new_W, new_b = L.read(LinearDescent(L)(L.pack(W, b), tokens, 3, 1, train, eta, update_weight, update_bias))
    x, dy = L.slot(tokens, 3)[train], L.slot(tokens, 1)[train]
    expected_W = W - eta * dy.T @ x if update_weight else W
    assert rel_error(new_W, expected_W) < 1e-12
    if L.bias_slot:
        expected_b = b - eta * dy.sum(0) if update_bias else b
        assert rel_error(new_b, expected_b) < 1e-12


# ----------------------------------------------------------------------------- H_sim-split operations


def test_hsplit_definitions_and_counts():
    g = torch.Generator().manual_seed(0)
    H, d = 4, 3
    split, dim = SplitWise(H, d, dtype=DT), DimensionWise(H, d, dtype=DT)
    with torch.no_grad():
        split.weight.copy_(torch.randn(H, d, d, generator=g, dtype=DT))
        dim.weight.copy_(torch.randn(d, H, H, generator=g, dtype=DT))
    e = torch.randn(5, H * d, generator=g, dtype=DT)
    heads = e.view(5, H, d)
    expected_split = torch.stack([heads[:, h] @ split.weight[h].T for h in range(H)], 1).reshape(5, H * d)
    assert rel_error(split(e), expected_split) < 1e-14
    expected_dim = torch.stack([heads[:, :, c] @ dim.weight[c].T for c in range(d)], 2).reshape(5, H * d)
    assert rel_error(dim(e), expected_dim) < 1e-14
    D = H * d
    assert HSplitLinear(H, d).num_weights() == D**2 // H + D * H  # Q_split


@pytest.mark.parametrize("spec", LAYOUTS)
def test_linear_forward_output_map_as_hsplit_weights(spec):
    """The index map the simulator applies equals one split-wise + one dimension-wise map with weights."""
    L = make_layout(spec)
    g = torch.Generator().manual_seed(1)
    W = torch.randn(L.d_aux, L.d_aux, generator=g, dtype=DT)
    b = torch.randn(L.d_aux, generator=g, dtype=DT) if L.bias_slot else None
    prefix, tokens = L.pack(W, b), random_tokens(L, 4, g)
    module = LinearForward(L)
    out = module.attention(prefix, tokens, 0)  # (H, T_sim, d)
    functional = module.output_map(out, L.K)
    dst = 2
    materialized = output_map_linear_forward(L, dst)(out.permute(1, 0, 2).reshape(-1, L.d_sim))
    assert rel_error(L.slot(materialized, dst), functional) < 1e-13
    others = [i for i in range(L.n_slots) if i != dst]
    assert all(float(L.slot(materialized, i).abs().max()) == 0 for i in others)


@pytest.mark.parametrize("spec", LAYOUTS)
def test_linear_backward_query_map_as_hsplit_weights(spec):
    from incontext.tint.modules import _rows_as_heads

    L = make_layout(spec)
    tokens = random_tokens(L, 3, torch.Generator().manual_seed(2))
    src = 1
    materialized = query_map_linear_backward(L, src)(tokens).view(3, L.n_heads, L.d_head)[:, : L.n_weight_heads]
    assert rel_error(materialized, _rows_as_heads(L, L.slot(tokens, src))) < 1e-14


# ----------------------------------------------------------------------------- LayerNorm


def ln_autograd_backward(x, gamma, dy, eps):
    x = x.clone().requires_grad_(True)
    y = F.layer_norm(x, x.shape[-1:], gamma, None, eps)
    (dx,) = torch.autograd.grad(y, x, dy)
    return dx


def test_layernorm_forward_exact_and_erratum_formula():
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(3)
    gamma, beta = 1 + 0.3 * torch.randn(12, generator=g, dtype=DT), torch.randn(12, generator=g, dtype=DT)
    tokens = random_tokens(L, 5, g)
    out = NormForward(L, "layernorm", 1e-5)(L.pack(torch.diag(gamma), beta), tokens, 1, 0)
    assert rel_error(L.slot(out, 0), F.layer_norm(L.slot(tokens, 1), (12,), gamma, beta, 1e-5)) < 1e-12
    # erratum (Def. A.2 misses 1/D): dx = (dz - mean(dz) - <dz, z> z / D) / sigma with dz = gamma * dy
    x, dy = L.slot(tokens, 1), torch.randn(5, 12, generator=g, dtype=DT)
    sigma = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    z, dz = group_norm(x, 1e-5), gamma * dy
    formula = (dz - dz.mean(-1, keepdim=True) - (dz * z).sum(-1, keepdim=True) * z / 12) / sigma
    assert rel_error(formula, ln_autograd_backward(x, gamma, dy, 1e-5)) < 1e-12


def test_layernorm_backward_first_order_slope():
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(4)
    gamma = 1 + 0.3 * torch.randn(12, generator=g, dtype=DT)
    tokens = random_tokens(L, 6, g)
    x = torch.randn(6, 12, generator=g, dtype=DT)
    exact = ln_autograd_backward(x, gamma, L.slot(tokens, 0), 1e-5)
    errors = []
    for eps in (1e-2, 1e-3, 1e-4):
        module = NormBackward(L, lambda v: group_norm(v, 1e-5), eps)
        out = module(L.pack(torch.diag(gamma), torch.zeros(12, dtype=DT)), tokens, 0, x, 2, scratch=(1, 3))
        errors.append(rel_error(L.slot(out, 2), exact))
    slopes = [math.log10(errors[i] / errors[i + 1]) for i in range(2)]
    assert errors[-1] < 1e-3
    assert all(0.8 < s < 1.2 for s in slopes), (errors, slopes)


# ----------------------------------------------------------------------------- activation


@pytest.mark.parametrize("name", ["gelu", "relu", "gelu_tanh"])
def test_activation_forward_exact(name):
    L = make_layout(LAYOUTS[0])
    tokens = random_tokens(L, 4, torch.Generator().manual_seed(5))
    out = ActivationForward(L, name)(tokens, 1, 2)
    act = {"gelu": F.gelu, "relu": F.relu, "gelu_tanh": lambda v: F.gelu(v, approximate="tanh")}[name]
    assert rel_error(L.slot(out, 2), act(L.slot(tokens, 1))) < 1e-14


def test_gelu_backward_first_order_slope():
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(6)
    tokens = random_tokens(L, 6, g)
    x = torch.randn(6, 12, generator=g, dtype=DT).requires_grad_(True)
    (exact,) = torch.autograd.grad(F.gelu(x), x, L.slot(tokens, 0))
    errors = [rel_error(L.slot(ActivationBackward(L, "gelu", eps)(tokens, 0, x.detach(), 2), 2), exact) for eps in (1e-2, 1e-3, 1e-4)]
    slopes = [math.log10(errors[i] / errors[i + 1]) for i in range(2)]
    assert errors[-1] < 1e-3
    assert all(0.8 < s < 1.2 for s in slopes), (errors, slopes)


def test_relu_backward_exact_when_aligned():
    """ReLU: the finite difference is exact wherever x and x + eps*dy have the same sign (Def. G.5)."""
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(7)
    tokens = random_tokens(L, 6, g)
    x = torch.randn(6, 12, generator=g, dtype=DT)
    x = x + 0.1 * x.sign()  # |x| > eps |dy|
    dx = L.slot(ActivationBackward(L, "relu", 1e-3)(tokens, 0, x, 2), 2)
    assert rel_error(dx, (x > 0) * L.slot(tokens, 0)) < 1e-10


def test_lemma_c4_gelu_multiplication_corrected():
    """sqrt(pi/2) (GeLU(x+y) - GeLU(x) - GeLU(y)) ~ xy (the printed form drops -GeLU(x))."""
    g = torch.Generator().manual_seed(8)
    x, y = torch.randn(100, generator=g, dtype=DT), torch.randn(100, generator=g, dtype=DT)
    errs = []
    for scale in (1e-1, 1e-2):
        a, b = scale * x, scale * y
        approx = math.sqrt(math.pi / 2) * (F.gelu(a + b) - F.gelu(a) - F.gelu(b))
        errs.append(rel_error(approx, a * b))
    assert errs[1] < errs[0] / 50  # error relative to xy shrinks like scale^2
    printed = math.sqrt(math.pi / 2) * (F.gelu(a + b) - F.gelu(b))
    assert rel_error(printed, a * b) > 1  # the printed form is off


# ----------------------------------------------------------------------------- self-attention


def attention_reference(q, k, v, n_head):
    T, D = q.shape
    dh = D // n_head
    qh, kh, vh = (t.view(T, n_head, dh).transpose(0, 1) for t in (q, k, v))
    return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True).transpose(0, 1).reshape(T, D)


@given(seed=st.integers(0, 10_000), T=st.integers(1, 7))
def test_self_attention_forward_exact(seed, T):
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(seed)
    tokens = random_tokens(L, T, g)
    out = AuxAttentionForward(L, 3, scale=True)(tokens, 1, 2, 3, 0)
    expected = attention_reference(L.slot(tokens, 1), L.slot(tokens, 2), L.slot(tokens, 3), 3)
    assert rel_error(L.slot(out, 0), expected) < 1e-12


@given(seed=st.integers(0, 10_000), T=st.integers(1, 7))
def test_self_attention_value_backward_exact(seed, T):
    """dv_t = sum_j a_{j,t} dy_j: autograd with the scores detached (Def. E.6)."""
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(seed)
    tokens = random_tokens(L, T, g)
    q, k = torch.randn(T, 12, generator=g, dtype=DT), torch.randn(T, 12, generator=g, dtype=DT)
    v = torch.randn(T, 12, generator=g, dtype=DT).requires_grad_(True)
    (dv,) = torch.autograd.grad(attention_reference(q, k, v, 3), v, L.slot(tokens, 0))
    forward = AuxAttentionForward(L, 3, scale=True)
    out = AuxAttentionValueBackward(forward)(tokens, 0, q, k, 1)
    assert rel_error(L.slot(out, 1), dv) < 1e-12


def test_value_path_backward_approaches_exact_for_hard_attention():
    """Theorem E.4: with (near-)hard attention the value-only backward approaches the full one."""
    g = torch.Generator().manual_seed(9)
    T, D, H = 6, 12, 3
    x = torch.randn(T, D, generator=g, dtype=DT)
    Wq, Wk, Wv = (torch.randn(D, D, generator=g, dtype=DT) for _ in range(3))
    dy = torch.randn(T, D, generator=g, dtype=DT)
    errors = []
    for temperature in (1.0, 1000.0):  # 1000: every row epsilon-hard
        xx = x.clone().requires_grad_(True)
        y = attention_reference(temperature * xx @ Wq.T, xx @ Wk.T, xx @ Wv.T, H)
        (full,) = torch.autograd.grad(y, xx, dy)
        with torch.no_grad():
            probs = AuxAttentionForward(make_layout(LAYOUTS[0]), H, scale=True).scores(temperature * x @ Wq.T, x @ Wk.T)
            dv = (probs.transpose(-1, -2) @ dy.view(T, H, 4).transpose(0, 1)).transpose(0, 1).reshape(T, D)
        errors.append(rel_error(dv @ Wv, full))
    assert errors[1] < 0.1 * errors[0]


# ----------------------------------------------------------------------------- LM head


@given(seed=st.integers(0, 10_000), T=st.integers(2, 7), data=st.data())
def test_lm_head_gradient_exact(seed, T, data):
    n_train = data.draw(st.integers(2, T))
    L = make_layout(LAYOUTS[0])
    g = torch.Generator().manual_seed(seed)
    E = torch.randn(20, 12, generator=g, dtype=DT)
    ids = torch.randint(0, 20, (T,), generator=g)
    tokens = random_tokens(L, T, g)
    tokens = L.write(tokens, 3, E[ids])
    z = L.slot(tokens, 0).clone().requires_grad_(True)
    loss = F.cross_entropy(z[: n_train - 1] @ E.T, ids[1:n_train], reduction="sum")
    (expected,) = torch.autograd.grad(loss, z)
    out = LMHeadGradient(L, E)(tokens, 0, 3, 1, n_train)
    assert rel_error(L.slot(out, 1), expected) < 1e-12


# ----------------------------------------------------------------------------- parameter counts


@pytest.mark.parametrize("d_aux,h_sim", [(768, 12), (1024, 16)])
def test_built_parameter_tree_matches_table3_module_rows(d_aux, h_sim):
    """Counts of the built (meta-device) simulator per module equal the paper's formulas; layout with
    D_sim = 4 D_aux (S = 3 + bias slot for H_sim = 12; S = 4, no bias slot for H_sim = 16), T_aux = 2048."""
    config = (TintConfig(rows_per_prefix=3, shards=3) if h_sim == 12 else
              TintConfig(rows_per_prefix=4, shards=4, bias_slot=False))
    L = Layout(d_aux, config)
    assert L.d_sim == 4 * d_aux and L.n_heads == h_sim
    rows = module_rows(paper_sizes(d_aux, h_sim, 2048, k=L.K))
    t_sim = L.K + 2048
    for kind in ("linear", "layernorm", "activation"):
        module = module_parameters(L, kind, t_sim)
        for op, key in (("forward", "fwd"), ("backward", "bwd"), ("descent", "descent")):
            built = count_weights(module[key]) if key in module else 0
            assert built == rows[kind][op], (kind, op)
    assert count_weights(module_parameters(L, "self_attention", t_sim)) == rows["self_attention"]["total"]  # 2Q+3Q+Q
    # a whole block: the paper's per-op block row plus the activation forward's Q_split and the
    # self-attention backward/descent split (Q moved from descent to backward)
    block = build_parameter_tree(L, 1, 2048)["0"]
    total = sum(count_weights(m) for m in block.values())
    assert total == rows["transformer_block"]["total"] + rows["activation"]["forward"]


@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["linear", "softmax"]))
def test_block_restricted_attention_equals_dense(seed, kind):
    from incontext.tint.modules import attend, attend_dense

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, 9, 4, generator=g, dtype=DT) for _ in range(3))
    allowed = torch.rand(9, 9, generator=g) < 0.3
    allowed[2] = False  # a row with no allowed key
    assert torch.allclose(attend(q, k, v, allowed, kind), attend_dense(q, k, v, allowed, kind), rtol=1e-13, atol=1e-13)


def test_glu_forward_exact_and_backward_first_order():
    """GLU (Def. J.3, J.5): y = silu(v) * u; d_up exact, d_gate = O(eps) with slope 1."""
    from incontext.tint.modules import GatedBackward, GatedForward

    L = Layout(12, TintConfig(rows_per_prefix=4, shards=4))
    g = torch.Generator().manual_seed(10)
    tokens = random_tokens(L, 5, g)
    out = GatedForward(L)(tokens, 1, 2, 3)
    assert rel_error(L.slot(out, 3), F.silu(L.slot(tokens, 1)) * L.slot(tokens, 2)) < 1e-14
    v = torch.randn(5, 12, generator=g, dtype=DT).requires_grad_(True)
    u = torch.randn(5, 12, generator=g, dtype=DT).requires_grad_(True)
    dy = L.slot(tokens, 0)
    d_v, d_u = torch.autograd.grad(F.silu(v) * u, (v, u), dy)
    errors = []
    for eps in (1e-2, 1e-3, 1e-4):
        out = GatedBackward(L, eps)(tokens, 0, v.detach(), u.detach(), up_dst=2, gate_dst=3)
        assert rel_error(L.slot(out, 2), d_u) < 1e-14
        errors.append(rel_error(L.slot(out, 3), d_v))
    slopes = [math.log10(errors[i] / errors[i + 1]) for i in range(2)]
    assert all(0.8 < s < 1.2 for s in slopes), (errors, slopes)


def test_softmax_attention_emulates_linear_attention():
    """Theorem C.2 / 2.5: the softmax construction approaches the linear attention head as eps -> 0."""
    from incontext.tint.modules import linear_attention_via_softmax

    g = torch.Generator().manual_seed(11)
    q, k, v = (0.5 * torch.randn(2, 6, 4, generator=g, dtype=DT) for _ in range(3))
    exact = (q @ k.transpose(-1, -2)) @ v
    errors = [rel_error(linear_attention_via_softmax(q, k, v, eps), exact) for eps in (1e-2, 1e-3, 1e-4)]
    assert all(errors[i] > 5 * errors[i + 1] for i in range(2)), errors  # O(eps) here (the bound is O(sqrt(eps)))
    assert errors[2] < 2e-3
