import pytest
import torch

from conftest import rel_error
from incontext.absorb import ICLCAApprox, AdaptedModel, SoftmaxFeaturePrefix
from incontext.models import Cache, Transformer, TransformerConfig
from incontext.ops.prefix_attention import FeaturePrefix, prefix_softmax_attention
from incontext.ops.softmax_attention import softmax_attention_reference


def softmax_model(seed=0, **options):
    torch.manual_seed(seed)
    config = {"vocab_size": 52, "n_layer": 2, "d_model": 32, "n_head": 4, "n_kv_head": 2, "positions": "rope", **options}
    return Transformer(TransformerConfig(**config)).double().eval()


def tokens(seed, batch, length):
    return torch.randint(0, 52, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_an_empty_prefix_is_exact_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(3))
    empty = FeaturePrefix(torch.zeros(2, 3, 16, 8, dtype=torch.float64), torch.zeros(2, 3, 16, dtype=torch.float64),
                          torch.zeros(2, 3, 1, dtype=torch.float64), torch.randn(16, 8, generator=g, dtype=torch.float64))
    out = prefix_softmax_attention(q * 3, k * 3, v, scale=0.35, prefix=empty)  # large logits: the log-space shift
    assert rel_error(out, softmax_attention_reference(q * 3, k * 3, v, scale=0.35)) < 1e-12


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_error_falls_with_the_number_of_features(positions):
    model = softmax_model(1, positions=positions)
    with torch.no_grad():  # sharper attention than the init gives
        for block in model.blocks:
            block.attn.qkv.weight.mul_(4.0)
    prompt, query = tokens(1, 4, 40), tokens(2, 4, 12)
    reference = model(torch.cat([prompt, query], 1))[:, 40:]
    without = rel_error(model(query, position_offset=40), reference)
    errors = {m: rel_error(ICLCAApprox(n_features=m, seed=3).absorb(model, prompt)(query), reference) for m in (32, 512, 8192)}
    assert errors[8192] < errors[512] < errors[32] < without
    assert errors[8192] < errors[32] / 4  # Monte Carlo: 1/sqrt(m), 16x fewer -> ~4x smaller
    all_exact = ICLCAApprox(n_features=32, exact_sinks=40).absorb(model, prompt)  # every prompt token exact: no error
    assert rel_error(all_exact(query), reference) < 1e-12


def test_decoding_through_the_absorbed_prompt_matches_one_pass():
    model = softmax_model(2)
    adapted = ICLCAApprox(n_features=64, seed=1).absorb(model, tokens(3, 2, 20))
    query = tokens(4, 2, 11)
    state = adapted.state()
    pieces = [model(query[:, :6], cache=state), model(query[:, 6:7], cache=state), model(query[:, 7:], cache=state)]
    assert rel_error(torch.cat(pieces, 1), adapted(query)) < 1e-12
    generated = adapted.generate(query, 5)
    tokens_so_far = query
    for _ in range(5):
        tokens_so_far = torch.cat([tokens_so_far, adapted(tokens_so_far)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, tokens_so_far)


def test_saves_loads_and_refuses_linear_models(tmp_path):
    model = softmax_model(3)
    adapted = ICLCAApprox(n_features=32, exact_sinks=2).absorb(model, tokens(5, 1, 9))
    adapted.save(tmp_path / "approx")
    loaded = AdaptedModel.load(tmp_path / "approx")
    assert isinstance(loaded, SoftmaxFeaturePrefix)
    query = tokens(6, 1, 5)
    assert torch.equal(loaded(query), adapted(query))
    linear = Transformer(TransformerConfig(vocab_size=52, d_model=16, n_head=2, n_layer=1, attention="linear"))
    with pytest.raises(ValueError, match="converts exactly"):
        ICLCAApprox().absorb(linear, tokens(0, 1, 4))


@pytest.mark.parametrize("layers", ["0", "1", "0-1"])
def test_a_hybrid_with_every_prompt_token_exact_is_the_prompted_model(layers):
    model = softmax_model(4, n_layer=2)
    prompt, query = tokens(7, 2, 13), tokens(8, 2, 6)
    reference = model(torch.cat([prompt, query], 1))[:, 13:]
    adapted = ICLCAApprox(n_features=16, exact_sinks=13, layers=layers).absorb(model, prompt)
    assert rel_error(adapted(query), reference) < 1e-12


def test_unconverted_layers_keep_the_prompts_exact_keys_and_values(tmp_path):
    model = softmax_model(5, n_layer=3)
    prompt, query = tokens(9, 1, 17), tokens(10, 1, 7)
    every = ICLCAApprox(n_features=32, seed=2).absorb(model, prompt).state()
    exact = Cache.empty(3)
    model(prompt, cache=exact)
    mixed = Cache(layers=[exact.layers[0], every.layers[1], exact.layers[2]], position=17)
    hybrid = ICLCAApprox(n_features=32, seed=2, layers="1").absorb(model, prompt)
    assert torch.equal(hybrid(query), model(query, cache=mixed))
    full = ICLCAApprox(n_features=32, seed=2).absorb(model, prompt)(query)
    assert not torch.equal(hybrid(query), full)
    assert ICLCAApprox(n_features=32, seed=2, layers="0-2").absorb(model, prompt)(query).equal(full)
    hybrid.save(tmp_path / "hybrid")
    loaded = AdaptedModel.load(tmp_path / "hybrid")
    assert loaded.converted == [1] and torch.equal(loaded(query), hybrid(query))


@pytest.mark.parametrize("spec", ["", "x", "3-1", "-2", "1,,2", "0.5"])
def test_bad_layer_lists_are_refused_in_one_line(spec):
    with pytest.raises(ValueError, match="layers must be 'all' or a list"):
        ICLCAApprox(layers=spec)


def test_layers_outside_the_model_are_refused():
    with pytest.raises(ValueError, match="layers must name at least one of the model's layers 0-1"):
        ICLCAApprox(layers="1-2").absorb(softmax_model(6), tokens(0, 1, 5))
