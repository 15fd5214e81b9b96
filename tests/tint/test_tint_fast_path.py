"""The fast path of the Linear Forward / Backward / Descent layers (one matmul with the rows read from the
prefixes, TintConfig.fast=True) against the attention layers as written (fast=False), in float64: module by
module on random prefixes and tokens, and the whole simulator (logits, updated prefixes, losses)."""

import dataclasses

import pytest
import torch
from conftest import rel_error
from hypothesis import given
from hypothesis import strategies as st

from incontext.models import Transformer, TransformerConfig
from incontext.tint import TinT, TintConfig
from incontext.tint.modules import Layout, LinearBackward, LinearDescent, LinearForward

DT = torch.float64
LAYOUTS = [(12, 3, 3, True), (12, 4, 3, True), (16, 5, 4, True), (12, 4, 4, False), (18, 4, 3, True)]


def both_layouts(spec):
    d, S, shards, bias_slot = spec
    return [Layout(d, TintConfig(rows_per_prefix=S, shards=shards, bias_slot=bias_slot, fast=fast)) for fast in (True, False)]


@given(spec=st.sampled_from(LAYOUTS), seed=st.integers(0, 10_000), T=st.integers(1, 7), src=st.integers(0, 3),
       dst=st.integers(0, 3), flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_linear_modules_fast_equals_attention(spec, seed, T, src, dst, flags):
    fast, plain = both_layouts(spec)
    use_bias, update_weight, update_bias = flags
    g = torch.Generator().manual_seed(seed)
    # arbitrary prefixes (not only what pack writes: the padding rows and slots hold values too)
    prefix = torch.randn(fast.K, fast.d_sim, generator=g, dtype=DT)
    tokens = torch.randn(T, fast.d_sim, generator=g, dtype=DT)
    train = torch.rand(T, generator=g) < 0.7
    for module in (LinearForward, LinearBackward):
        options = {"use_bias": use_bias} if module is LinearForward else {}
        a = module(fast)(prefix, tokens, src, dst, accumulate=True, **options)
        b = module(plain)(prefix, tokens, src, dst, accumulate=True, **options)
        assert rel_error(a, b) < 1e-10, module.__name__
    a = LinearDescent(fast)(prefix, tokens, src, dst, train, 0.3, update_weight, update_bias)
    b = LinearDescent(plain)(prefix, tokens, src, dst, train, 0.3, update_weight, update_bias)
    assert (a - b).abs().max() <= 1e-10 * prefix.abs().max()


def auxiliary(seed, **options) -> Transformer:
    torch.manual_seed(seed)
    settings = {"n_layer": 3, "n_head": 4, "d_model": 24, "vocab_size": 40, "max_seq_len": 32, **options}
    model = Transformer(TransformerConfig(**settings)).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


LLAMA = {"norm": "rmsnorm", "positions": "rope", "bias": False, "mlp": "swiglu", "d_mlp": 40, "n_kv_head": 2}
CASES = [
    ({"mlp": "gelu_tanh"}, {"n_steps": 2}),
    ({"d_mlp": 60}, {"n_simulation_layers": 2, "released_mlp_out_bias": True}),
    (LLAMA, {"rows_per_prefix": 4, "shards": 4, "n_simulation_layers": 2}),
]


@pytest.mark.parametrize("options,tint_options", CASES)
def test_simulator_fast_equals_attention(options, tint_options):
    model = auxiliary(0, **options)
    ids = torch.randint(0, 40, (14,), generator=torch.Generator().manual_seed(1))
    config = TintConfig(learning_rate=0.05, **tint_options)
    fast = TinT(model, config).simulate(ids, 9)
    plain = TinT(model, dataclasses.replace(config, fast=False)).simulate(ids, 9)
    assert rel_error(fast[0], plain[0]) < 1e-10
    for name in plain[1]:
        assert rel_error(fast[1][name], plain[1][name]) < 1e-10, name
    assert rel_error(torch.stack(fast[2]), torch.stack(plain[2])) < 1e-10
