import dataclasses
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import rel_error
from incontext.config import from_dict, to_dict
from incontext.models import Cache, Transformer, TransformerConfig
from incontext.ops import apply_feature_map, apply_rope, rope_cos_sin


# ----------------------------------------------------------------------------- a plain reference


def naive_forward(model: Transformer, inputs: torch.Tensor) -> torch.Tensor:
    """The transformer written out with explicit loops over heads and positions (no shared code paths
    with the model except the feature maps and RoPE, which have their own tests)."""
    c = model.config
    sd = {k: v for k, v in model.state_dict().items()}
    T = inputs.shape[1]
    x = sd["tok_emb.weight"][inputs] if c.tokens else inputs @ sd["read_in.weight"].T + sd["read_in.bias"]
    if c.positions == "learned":
        x = x + sd["pos_emb.weight"][:T]

    def norm(h, prefix):
        if c.norm == "layernorm":
            mu = h.mean(-1, keepdim=True)
            var = ((h - mu) ** 2).mean(-1, keepdim=True)
            out = (h - mu) / torch.sqrt(var + c.norm_eps) * sd[prefix + ".weight"]
            return out + sd[prefix + ".bias"] if c.bias else out
        return h / torch.sqrt((h**2).mean(-1, keepdim=True) + c.norm_eps) * sd[prefix + ".weight"]

    def linear(h, prefix):
        out = h @ sd[prefix + ".weight"].T
        return out + sd[prefix + ".bias"] if prefix + ".bias" in sd else out

    hd, H, Hkv = c.dim_head, c.n_head, c.kv_heads
    previous, first_v = None, None
    for layer in range(c.n_layer):
        p = f"blocks.{layer}."
        qkv = linear(norm(x, p + "norm1"), p + "attn.qkv")
        q = qkv[..., : H * hd].reshape(*x.shape[:2], H, hd)
        k = qkv[..., H * hd : (H + Hkv) * hd].reshape(*x.shape[:2], Hkv, hd)
        v = qkv[..., (H + Hkv) * hd :].reshape(*x.shape[:2], Hkv, hd)
        raw = (q, k, v)
        if previous is not None:
            if c.residual_stream == "q":
                q = q + previous[0]
            if c.residual_stream == "k":
                k = k + previous[1]
            if c.residual_stream == "v":
                v = v + previous[2]
            if c.residual_stream == "value_residual":
                mix = sd[p + "attn.value_mix"]
                v = mix[0] * v + mix[1] * first_v
        previous = raw
        if layer == 0:
            first_v = v
        heads = []
        for h in range(H):
            g = h // (H // Hkv)
            qh, kh, vh = q[:, :, h], k[:, :, g], v[:, :, g]  # (B, T, hd)
            outs = []
            for i in range(T):
                if c.attention == "softmax":
                    qi, kj = qh[:, i : i + 1], kh[:, : i + 1]
                    if c.positions == "rope":
                        cos, sin = rope_cos_sin(torch.arange(T), hd, c.rope_theta, x.dtype)
                        qi = apply_rope(qi, cos[i : i + 1], sin[i : i + 1])
                        kj = apply_rope(kj, cos[: i + 1], sin[: i + 1])
                    scores = (qi * kj).sum(-1) / (math.sqrt(hd) if c.scale_attn else 1.0)
                    outs.append((torch.softmax(scores, -1)[..., None] * vh[:, : i + 1]).sum(1))
                else:
                    favor = model.blocks[layer].attn.favor
                    sq = sk = 1.0
                    if c.scale_attn:
                        sq, sk = (hd**-0.25, hd**-0.25) if c.feature_map in ("favor", "taylor") else (hd**-0.5, 1.0)
                    fq = apply_feature_map(qh[:, i] * sq, c.feature_map, favor)
                    fk = apply_feature_map(kh[:, : i + 1] * sk, c.feature_map, favor)
                    rq, rk = fq, fk
                    if c.positions == "rope":
                        cos, sin = rope_cos_sin(torch.arange(T), fq.shape[-1], c.rope_theta, x.dtype)
                        rq = apply_rope(fq, cos[i], sin[i])
                        rk = apply_rope(fk, cos[: i + 1], sin[: i + 1])
                    num = ((rq[:, None] * rk).sum(-1)[..., None] * vh[:, : i + 1]).sum(1)
                    if c.linear_norm == "kernel":
                        num = num / (fq[:, None] * fk).sum(-1).sum(1)[:, None]
                    outs.append(num)
            heads.append(torch.stack(outs, 1))
        x = x + linear(torch.cat(heads, -1), p + "attn.out")
        hidden = linear(norm(x, p + "norm2"), p + "mlp.fc_in")
        if c.mlp == "swiglu":
            gate, up = hidden.chunk(2, -1)
            hidden = gate * torch.sigmoid(gate) * up
        elif c.mlp == "gelu":
            hidden = 0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))
        elif c.mlp == "gelu_tanh":
            hidden = 0.5 * hidden * (1 + torch.tanh(math.sqrt(2 / math.pi) * (hidden + 0.044715 * hidden**3)))
        else:
            hidden = hidden.clamp_min(0)
        x = x + linear(hidden, p + "mlp.fc_out")
    x = norm(x, "norm_f")
    return x @ sd["lm_head.weight"].T if c.tokens else linear(x, "read_out")


def random_model(seed: int, **options) -> Transformer:
    torch.manual_seed(seed)
    config = TransformerConfig(**{"n_layer": 2, "n_head": 4, "d_model": 32, "vocab_size": 37, **options})
    model = Transformer(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # move every parameter away from its initial value (gains 1, biases 0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.1)
    return model


def random_inputs(model: Transformer, seed: int, batch: int = 2, length: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    c = model.config
    if c.tokens:
        return torch.randint(0, c.vocab_size, (batch, length), generator=g)
    return torch.randn(batch, length, c.d_input, generator=g, dtype=torch.float64)


model_options = st.fixed_dictionaries(
    {
        "attention": st.sampled_from(["softmax", "linear"]),
        "positions": st.sampled_from(["learned", "rope", "none"]),
        "norm": st.sampled_from(["layernorm", "rmsnorm"]),
        "mlp": st.sampled_from(["gelu", "gelu_tanh", "relu", "swiglu"]),
        "bias": st.booleans(),
        "scale_attn": st.booleans(),
        "tie_embeddings": st.booleans(),
        "feature_map": st.sampled_from(["elu", "taylor", "favor"]),
        "linear_norm": st.sampled_from(["kernel", "none"]),
        "residual_stream": st.sampled_from(["none", "q", "k", "v", "value_residual"]),
        "n_kv_head": st.sampled_from([None, 2, 1]),
        "n_layer": st.integers(1, 3),
    }
)


# ----------------------------------------------------------------------------- equality with the reference


@given(options=model_options, seed=st.integers(0, 1000))
def test_forward_matches_naive_reference_float64(options, seed):
    model = random_model(seed, **options)
    x = random_inputs(model, seed)
    assert rel_error(model(x), naive_forward(model, x)) < 1e-10


def test_vector_inputs_match_reference():
    model = random_model(0, vocab_size=None, d_input=6, d_output=3, residual_stream="v")
    x = random_inputs(model, 0)
    out = model(x)
    assert out.shape == (2, 9, 3)
    assert rel_error(out, naive_forward(model, x)) < 1e-10


@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_implementations_agree_inside_the_model(attention):
    key = "softmax_impl" if attention == "softmax" else "linear_impl"
    impls = ["sdpa", "reference"] if attention == "softmax" else ["chunked", "parallel", "recurrent"]
    outs = []
    for impl in impls:
        model = random_model(3, attention=attention, positions="rope", **{key: impl, "chunk_size": 4})
        outs.append(model(random_inputs(model, 3, length=13)))
    for out in outs[1:]:
        assert rel_error(out, outs[0]) < 1e-10


# ----------------------------------------------------------------------------- incremental decoding


@given(options=model_options, seed=st.integers(0, 1000), cuts=st.lists(st.integers(1, 11), min_size=1, max_size=3))
def test_cached_decoding_equals_full_forward(options, seed, cuts):
    model = random_model(seed, **options)
    x = random_inputs(model, seed, length=12)
    full = model(x)
    cache = Cache.empty(model.config.n_layer)
    pieces, start = [], 0
    for cut in sorted(set(cuts)) + [12]:
        if cut > start:
            pieces.append(model(x[:, start:cut], cache=cache))
            start = cut
    assert cache.position == 12
    assert rel_error(torch.cat(pieces, 1), full) < 1e-10


def test_position_offset_matches_cache_position():
    model = random_model(1, positions="learned")
    x = random_inputs(model, 1)
    cache = Cache.empty(2)
    model(x[:, :4], cache=cache)
    tail_cached = model(x[:, 4:], cache=cache)
    tail_offset_only = model(x[:, 4:], position_offset=4)
    assert rel_error(tail_cached, model(x)[:, 4:]) < 1e-12
    assert rel_error(tail_offset_only, tail_cached) > 1e-3  # without the cache the prompt is missing


# ----------------------------------------------------------------------------- residual streams


def test_streams_add_zero_parameters_and_value_residual_adds_two_per_layer():
    base = Transformer(TransformerConfig(n_layer=3, vocab_size=11, d_model=16, n_head=2)).num_parameters()
    for stream in ("q", "k", "v"):
        config = TransformerConfig(n_layer=3, vocab_size=11, d_model=16, n_head=2, residual_stream=stream)
        assert Transformer(config).num_parameters() == base
    config = TransformerConfig(n_layer=3, vocab_size=11, d_model=16, n_head=2, residual_stream="value_residual")
    assert Transformer(config).num_parameters() == base + 2 * 2


@pytest.mark.parametrize("stream", ["q", "k", "v", "value_residual"])
def test_each_stream_changes_the_function_from_layer_two_on(stream):
    classic = random_model(5, n_layer=3)
    streamed = Transformer(dataclasses.replace(classic.config, residual_stream=stream)).double().eval()
    state = classic.state_dict()
    if stream == "value_residual":
        state.update({f"blocks.{i}.attn.value_mix": torch.tensor([0.3, 0.7], dtype=torch.float64) for i in (1, 2)})
    streamed.load_state_dict(state)
    x = random_inputs(classic, 5)
    assert rel_error(streamed(x), classic(x)) > 1e-3
    one_layer = random_model(5, n_layer=1)
    one_streamed = Transformer(dataclasses.replace(one_layer.config, residual_stream=stream)).double().eval()
    one_streamed.load_state_dict(one_layer.state_dict())
    assert torch.equal(one_streamed(x), one_layer(x))  # layer 1 gets nothing added


def test_value_residual_with_self_weight_one_and_first_weight_zero_is_classic():
    classic = random_model(6, n_layer=3)
    streamed = Transformer(dataclasses.replace(classic.config, residual_stream="value_residual")).double().eval()
    state = classic.state_dict()
    state.update({f"blocks.{i}.attn.value_mix": torch.tensor([1.0, 0.0], dtype=torch.float64) for i in (1, 2)})
    streamed.load_state_dict(state)
    x = random_inputs(classic, 6)
    assert rel_error(streamed(x), classic(x)) < 1e-14


# ----------------------------------------------------------------------------- generation


def test_greedy_generation_matches_argmax_without_cache():
    model = random_model(7, positions="rope")
    prompt = random_inputs(model, 7, length=5)
    generated = model.generate(prompt, 8)
    tokens = prompt
    for _ in range(8):
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, tokens)


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = random_model(8, attention="linear")
    prompt = random_inputs(model, 8, length=4)
    a = model.generate(prompt, 10, greedy=False, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 10, greedy=False, generator=torch.Generator().manual_seed(1))
    c = model.generate(prompt, 10, greedy=False, generator=torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    top1 = model.generate(prompt, 10, greedy=False, top_k=1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(top1, model.generate(prompt, 10))


def test_generation_stops_at_eos():
    model = random_model(9)
    prompt = random_inputs(model, 9, batch=1, length=3)
    first = int(model(prompt)[0, -1].argmax())
    out = model.generate(prompt, 10, eos_token_id=first)
    assert out.shape == (1, 4) and int(out[0, -1]) == first


# ----------------------------------------------------------------------------- options and errors


def test_dropout_only_in_training_mode():
    model = random_model(10, dropout=0.3, attn_dropout=0.3, softmax_impl="reference")
    x = random_inputs(model, 10)
    assert torch.equal(model(x), model(x))
    model.train()
    assert not torch.equal(model(x), model(x))


def test_tied_head_shares_the_embedding():
    model = Transformer(TransformerConfig(vocab_size=20, d_model=16, n_head=2, n_layer=1))
    assert model.lm_head.weight is model.tok_emb.weight
    untied = Transformer(TransformerConfig(vocab_size=20, d_model=16, n_head=2, n_layer=1, tie_embeddings=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight


def test_gradients_flow_to_every_parameter():
    model = random_model(11, attention="linear", feature_map="favor", residual_stream="value_residual", n_layer=3)
    model.train()
    model(random_inputs(model, 11)).pow(2).mean().backward()
    for name, p in model.named_parameters():
        if name == "pos_emb.weight":
            continue  # rows past the sequence length get no gradient
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize(
    "options, message",
    [
        ({"attention": "sparse"}, "attention"),
        ({"vocab_size": None}, "exactly one of vocab_size"),
        ({"d_input": 4}, "exactly one of vocab_size"),
        ({"n_head": 3}, "not divisible"),
        ({"n_kv_head": 3}, "multiple of n_kv_head"),
        ({"dropout": 1.0}, "dropout"),
        ({"n_layer": 0}, "n_layer"),
        ({"positions": "rope", "head_dim": 5, "n_head": 2}, "even head_dim"),
    ],
)
def test_invalid_configs_are_rejected_with_a_clear_message(options, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig(**{"vocab_size": 10, "d_model": 16, "n_head": 4, **options})


def test_unknown_config_keys_are_named():
    with pytest.raises(ValueError, match=r"TransformerConfig: unknown key\(s\) \['n_layers'\]; allowed keys: \['n_layer'"):
        from_dict(TransformerConfig, {"vocab_size": 10, "n_layers": 2})
    config = TransformerConfig(vocab_size=10, d_model=16, n_head=2)
    assert from_dict(TransformerConfig, to_dict(config)) == config


def test_bad_inputs_are_rejected():
    model = Transformer(TransformerConfig(vocab_size=10, d_model=16, n_head=2, n_layer=1, max_seq_len=8))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        model(torch.tensor([[1, 10]]))
    with pytest.raises(ValueError, match="integer ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_choices_are_read_from_the_literal_annotations():
    from incontext.config import choices
    from incontext.ops.linear_attention import LINEAR_ATTENTION_IMPLS
    from incontext.ops.softmax_attention import SOFTMAX_ATTENTION_IMPLS

    allowed = choices(TransformerConfig)
    assert set(allowed["softmax_impl"]) == set(SOFTMAX_ATTENTION_IMPLS) and set(allowed["linear_impl"]) == set(LINEAR_ATTENTION_IMPLS)
    with pytest.raises(ValueError, match="TransformerConfig.attention='sparse' is not one of"):
        TransformerConfig(vocab_size=5, attention="sparse")
