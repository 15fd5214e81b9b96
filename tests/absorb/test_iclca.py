import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_error
from incontext.absorb import (
    ICLCA,
    AdaptedModel,
    ConversionError,
    DropPrompt,
    KeepPrompt,
    LinearAttentionBias,
    algorithm_1,
    convert,
    get_absorb_method,
)
from incontext.absorb.methods.iclca import rotate_state
from incontext.models import Cache, Transformer, TransformerConfig


def linear_model(seed=0, dtype=torch.float64, **options) -> Transformer:
    torch.manual_seed(seed)
    config = {"vocab_size": 52, "n_layer": 2, "d_model": 32, "n_head": 4, "attention": "linear", "positions": "rope",
              "feature_map": "elu", "max_seq_len": 256, **options}
    model = Transformer(TransformerConfig(**config)).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-trivial norms and biases, and larger weights than the init, to stress the check
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05)
    return model


def tokens(seed, batch, length):
    return torch.randint(0, 52, (batch, length), generator=torch.Generator().manual_seed(seed))


def prompted_logits(model, prompt, query):
    return model(torch.cat([prompt, query], dim=1))[:, prompt.shape[1]:]


model_options = st.fixed_dictionaries({
    "feature_map": st.sampled_from(["identity", "elu", "taylor", "favor"]),
    "linear_norm": st.sampled_from(["kernel", "none"]),
    "positions": st.sampled_from(["rope", "learned", "none"]),
    "n_layer": st.integers(1, 4),
    "n_head": st.sampled_from([1, 2, 4]),
    "d_model": st.sampled_from([16, 32]),
    "residual_stream": st.sampled_from(["none", "v"]),
    "linear_bias": st.booleans(),  # ICLCA's biased architecture (learned b_KV, b_D): a prompt converts on top, exactly
})


def valid(options):
    # identity features with the kernel normalizer can divide by ~0: a meaningless relative error
    return not (options["feature_map"] == "identity" and options["linear_norm"] == "kernel")


@given(options=model_options, seed=st.integers(0, 10_000), m=st.integers(1, 24), n=st.integers(1, 16),
       pre_existing=st.booleans())
def test_conversion_is_exact_float64(options, seed, m, n, pre_existing):
    if not valid(options):
        options["linear_norm"] = "none"
    model = linear_model(seed, **options)
    prompt, query = tokens(seed, 2, m), tokens(seed + 1, 2, n)
    if pre_existing:  # Theorem 4.5 with an existing bias: a first prompt converted beforehand
        earlier = tokens(seed + 2, 2, 5)
        adapted = ICLCA().absorb(model, earlier).absorb_more(prompt)
        reference = prompted_logits(model, torch.cat([earlier, prompt], 1), query)
    else:
        adapted = ICLCA().absorb(model, prompt)
        reference = prompted_logits(model, prompt, query)
    assert rel_error(adapted(query), reference) < 1e-12


@pytest.mark.parametrize("feature_map", ["elu", "favor"])
@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_conversion_is_exact_float32(feature_map, positions):
    model = linear_model(1, dtype=torch.float32, feature_map=feature_map, positions=positions, n_layer=4)
    for seed in range(5):
        prompt, query = tokens(seed, 3, 40), tokens(seed + 100, 3, 20)
        assert rel_error(ICLCA().absorb(model, prompt)(query), prompted_logits(model, prompt, query)) < 1e-5


def test_algorithm_1_equals_convert_and_printed_step_d_does_not():
    model = linear_model(2, n_layer=3)
    prompt, query = tokens(2, 2, 16), tokens(3, 2, 8)
    reference = prompted_logits(model, prompt, query)
    assert rel_error(LinearAttentionBias(model, algorithm_1(model, prompt))(query), reference) < 1e-12
    printed = rel_error(LinearAttentionBias(model, algorithm_1(model, prompt, printed_step_d=True))(query), reference)
    assert printed > 1e-3  # the erratum: prompt tokens see the whole prompt twice


def test_summing_independent_biases_is_not_exact_but_sequential_conversion_is():
    model = linear_model(3, n_layer=3)
    first, second, query = tokens(4, 1, 12), tokens(5, 1, 12), tokens(6, 1, 8)
    reference = prompted_logits(model, torch.cat([first, second], 1), query)
    a, b = convert(model, first), convert(model, second)
    summed = Cache(layers=[(Sa + Sb, za + zb) for (Sa, za), (Sb, zb) in zip(a.layers, b.layers)], position=0)
    assert rel_error(LinearAttentionBias(model, summed)(query), reference) > 1e-3
    assert rel_error(ICLCA().absorb(model, first).absorb_more(second)(query), reference) < 1e-12


@pytest.mark.parametrize("shift", [None, 1, -1])
def test_missing_or_off_by_one_rotation_is_not_exact(shift):
    model = linear_model(4)
    prompt, query = tokens(7, 2, 16), tokens(8, 2, 8)
    reference = prompted_logits(model, prompt, query)
    cache = Cache.empty(model.config.n_layer)
    with torch.no_grad():
        model(prompt, cache=cache)
    m = prompt.shape[1]
    rotation = 0 if shift is None else -(m + shift)  # correct would be -m
    wrong = Cache(layers=[(rotate_state(S, rotation, model), z) for S, z in cache.layers], position=0)
    assert rel_error(LinearAttentionBias(model, wrong)(query), reference) > 1e-4
    right = Cache(layers=[(rotate_state(S, -m, model), z) for S, z in cache.layers], position=0)
    assert rel_error(LinearAttentionBias(model, right)(query), reference) < 1e-12


def test_one_prompt_serves_a_batch_of_queries():
    model = linear_model(5)
    prompt, queries = tokens(9, 1, 20), tokens(10, 6, 9)
    adapted = ICLCA().absorb(model, prompt)
    reference = prompted_logits(model, prompt.expand(6, -1), queries)
    assert rel_error(adapted(queries), reference) < 1e-12


def test_adapted_model_saves_and_loads(tmp_path):
    model = linear_model(6, dtype=torch.float32, positions="learned")
    prompt, query = tokens(11, 2, 10), tokens(12, 2, 6)
    adapted = ICLCA().absorb(model, prompt)
    adapted.save(tmp_path / "adapted")
    loaded = AdaptedModel.load(tmp_path / "adapted")
    assert isinstance(loaded, LinearAttentionBias) and loaded.position == 10
    assert torch.equal(loaded(query), adapted(query))


def test_reference_points_speak_the_same_protocol(tmp_path):
    model = linear_model(7)
    prompt, query = tokens(13, 2, 10), tokens(14, 2, 6)
    keep = get_absorb_method("keep-prompt").absorb(model, prompt)
    assert rel_error(keep(query), prompted_logits(model, prompt, query)) < 1e-12
    assert torch.equal(DropPrompt().absorb(model, prompt)(query), model(query))
    keep.save(tmp_path / "keep")
    assert torch.equal(AdaptedModel.load(tmp_path / "keep")(query), keep(query))
    assert isinstance(KeepPrompt().absorb(model, prompt), AdaptedModel)


def test_softmax_models_are_refused_with_a_pointer_to_the_approximate_method():
    model = Transformer(TransformerConfig(vocab_size=52, d_model=16, n_head=2, n_layer=1))
    with pytest.raises(ValueError, match="needs linear .*approximate conversion"):
        ICLCA().absorb(model, tokens(0, 1, 4))
    with pytest.raises(ConversionError, match="approximate conversion"):
        convert(model, tokens(0, 1, 4))
    dropout_model = linear_model(8, dropout=0.1).train()
    with pytest.raises(ValueError, match="eval"):
        ICLCA().absorb(dropout_model, tokens(0, 1, 4))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_iclca_table2_default_recipe_conversion_is_exact_float64(seed):
    """The model of `incontext run iclca-table2` as configured by default (Taylor features with the kernel
    normaliser, learned positions, 2 heads of dim 16), with random float64 weights: converting a prompt of an
    induction sequence into biases gives the prompted model's logits."""
    from incontext.experiments.iclca_table2 import Table2Config, train_settings
    from incontext.tasks import get_task

    settings = train_settings(Table2Config())
    options = {k: v for k, v in settings["model"].items() if k not in ("vocab_size", "max_seq_len")}
    assert options["feature_map"] == "taylor" and options["positions"] == "learned" and options.get("linear_norm", "kernel") == "kernel"
    model = linear_model(seed, max_seq_len=settings["task"]["seq_len"], **options)
    assert model.config.dim_head == 16 and model.config.feature_dim == 2 + 16 + 16**2
    task = get_task(**settings["task"])
    batch = task.sample(3, torch.Generator().manual_seed(seed))
    for m in (1, 17, 32, 63):
        prompt, query = batch.inputs[:, :m], batch.inputs[:, m:]
        assert rel_error(ICLCA().absorb(model, prompt)(query), prompted_logits(model, prompt, query)) < 1e-10
    # a second prompt converted on top of the first (Theorem 4.5)
    adapted = ICLCA().absorb(model, batch.inputs[:, :20]).absorb_more(batch.inputs[:, 20:40])
    assert rel_error(adapted(batch.inputs[:, 40:]), prompted_logits(model, batch.inputs[:, :40], batch.inputs[:, 40:])) < 1e-10


def test_the_biased_architecture_starts_as_the_plain_one_and_learns_its_biases():
    """linear_bias (Sec. 4.4 / 6.3): zero biases at the start give the plain model's logits; the biases get gradients
    and, once moved, change every sequence's output as a prompt would; a softmax model refuses them in one line."""
    torch.manual_seed(3)
    plain = Transformer(TransformerConfig(vocab_size=52, n_layer=2, d_model=32, n_head=4, attention="linear",
                                          feature_map="taylor", positions="rope")).double()
    torch.manual_seed(3)
    biased = Transformer(TransformerConfig(vocab_size=52, n_layer=2, d_model=32, n_head=4, attention="linear",
                                           feature_map="taylor", positions="rope", linear_bias=True)).double()
    biased.load_state_dict(plain.state_dict(), strict=False)
    x = tokens(0, 2, 12)
    assert torch.equal(biased(x), plain(x))
    biased(x).logsumexp(-1).sum().backward()
    grads = [biased.blocks[i].attn.bias_kv.grad for i in range(2)] + [biased.blocks[i].attn.bias_d.grad for i in range(2)]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    with torch.no_grad():
        biased.blocks[0].attn.bias_kv.add_(0.1)
    assert rel_error(biased(x), plain(x)) > 1e-3
    with pytest.raises(ValueError, match="linear_bias .* needs attention='linear'"):
        TransformerConfig(vocab_size=52, linear_bias=True)
