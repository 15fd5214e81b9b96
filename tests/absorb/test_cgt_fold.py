"""CGT folding: a frozen context folded into the weights gives an ordinary Transformer with the same logits."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_error
from incontext.absorb import AdaptedModel, get_absorb_method
from incontext.absorb.methods.cgt_fold import fold, lora_factors, prompt_context
from incontext.models import Transformer
from incontext.models.cgt import CGT, CGTConfig


def random_cgt(seed, dtype=torch.float64, **options) -> CGT:
    torch.manual_seed(seed)
    model = CGT(CGTConfig(**options)).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".left", ".right")):
                p.normal_(0.0, 0.3)
            elif ".mix." in name:  # mixing weights of order one
                p.normal_(0.0, 1.0)
    return model.eval()


@given(n_layer=st.integers(2, 4), split=st.integers(1, 3), heads_x=st.sampled_from([1, 2]), head_dim=st.sampled_from([4, 6]),
       d_y=st.sampled_from([2, 4]), rank=st.integers(1, 3), m=st.integers(1, 4), mixing=st.sampled_from(["tanh", "softmax"]),
       tokens=st.booleans(), vae=st.booleans(), seed=st.integers(0, 10**6))
def test_folded_equals_frozen_context_float64(n_layer, split, heads_x, head_dim, d_y, rank, m, mixing, tokens, vae, seed):
    split = min(split, n_layer - 1)
    io = {"vocab_size": 11} if tokens else {"d_input": 3, "d_output": 2}
    model = random_cgt(seed, n_layer=n_layer, split_layer=split, d_x=heads_x * head_dim, n_head_x=heads_x, d_y=d_y,
                       n_head_y=1, rank=rank, n_templates=m, mixing=mixing, vae=vae, max_seq_len=24, **io)
    g = torch.Generator().manual_seed(seed)
    if tokens:
        prompt, query = torch.randint(0, 11, (1, 9), generator=g), torch.randint(0, 11, (2, 7), generator=g)
    else:
        prompt, query = (torch.randn(b, t, 3, generator=g, dtype=torch.float64) for b, t in ((1, 9), (2, 7)))
    y = prompt_context(model, prompt)
    folded = fold(model, y)
    assert isinstance(folded, Transformer) and folded.config.d_model == model.config.d_x
    frozen = model(query, y=y[None])
    assert rel_error(folded(query), frozen) < 1e-10
    # the fold is not trivial: T(y) changes the logits
    assert rel_error(model.x_only_transformer()(query), frozen) > 1e-8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_folded_equals_frozen_context_float32(seed):
    model = random_cgt(seed, torch.float32, n_layer=4, split_layer=2, d_x=32, n_head_x=4, d_y=16, n_head_y=2,
                       vocab_size=16, max_seq_len=64)
    query = torch.randint(0, 16, (3, 30), generator=torch.Generator().manual_seed(seed))
    y = model.context(query[:1])[0, 20]
    assert rel_error(fold(model, y)(query), model(query, y=y[None])) < 1e-5


def test_fold_is_a_rank_r_update_of_the_x_only_model():
    model = random_cgt(0, n_layer=3, split_layer=1, d_x=12, n_head_x=2, d_y=4, n_head_y=1, rank=2, vocab_size=7)
    y = torch.randn(4, dtype=torch.float64)
    base, folded = model.x_only_transformer().state_dict(), fold(model, y).state_dict()
    factors = lora_factors(model, y)
    assert sorted(factors) == ["blocks.1.attn.qkv", "blocks.1.mlp.fc_in", "blocks.2.attn.qkv", "blocks.2.mlp.fc_in"]
    for name, value in folded.items():
        module = name.rsplit(".", 1)[0]
        if module in factors:
            delta = value - base[name]
            assert torch.linalg.matrix_rank(delta).item() <= 2 if name.endswith("weight") else True
        else:
            assert torch.equal(value, base[name]), name


def test_absorb_protocol_round_trip(tmp_path):
    model = random_cgt(3, torch.float32, n_layer=3, split_layer=2, d_x=16, n_head_x=2, d_y=8, n_head_y=2, vocab_size=16)
    prompt, query = torch.randint(0, 16, (1, 12)), torch.randint(0, 16, (2, 6))
    adapted = get_absorb_method("cgt-fold").absorb(model, prompt)
    expected = model(query, y=model.context(prompt)[:, -1])
    assert rel_error(adapted(query), expected) < 1e-5
    adapted.save(tmp_path / "folded")
    assert torch.equal(AdaptedModel.load(tmp_path / "folded")(query), adapted(query))
    with pytest.raises(ValueError, match="one prompt"):
        prompt_context(model, torch.randint(0, 16, (2, 5)))
    with pytest.raises(ValueError, match="needs a CGT model"):
        get_absorb_method("cgt-fold").absorb(model.x_only_transformer(), prompt)
