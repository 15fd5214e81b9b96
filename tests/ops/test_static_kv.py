"""Attention over a fixed-size key/value buffer (ops/static_kv.py) against the plain causal form, float64 over random
shapes and seeds: new tokens written at each row's own position, rows at different positions, padding masked; and
the decoder built on it (models/static_decode.py) against decoding on a growing cache."""

import pytest
import torch

from incontext.models import Cache, Transformer, TransformerConfig
from incontext.models.static_decode import StaticDecoder, supported
from incontext.ops.static_kv import StaticKV, causal_reference


@pytest.mark.parametrize("seed", range(4))
def test_rows_at_their_own_positions_equal_causal_attention(seed):
    g = torch.Generator().manual_seed(seed)
    b, h_kv, groups, d = 3, int(torch.randint(1, 3, (), generator=g)), int(torch.randint(1, 4, (), generator=g)), 8
    p, t, room = int(torch.randint(1, 9, (), generator=g)), int(torch.randint(1, 5, (), generator=g)), 12
    k0, v0 = (torch.randn(1, h_kv, p, d, generator=g, dtype=torch.float64) for _ in range(2))
    lengths = torch.randint(0, room - t, (b,), generator=g)  # each row already holds `lengths` more tokens
    extra_k, extra_v = (torch.randn(b, h_kv, room, d, generator=g, dtype=torch.float64) for _ in range(2))
    positions = p + lengths
    state = StaticKV.filled(k0, v0, p + room, positions.clone())
    for r in range(b):
        state.k[r, :, p: p + int(lengths[r])] = extra_k[r, :, : int(lengths[r])]
        state.v[r, :, p: p + int(lengths[r])] = extra_v[r, :, : int(lengths[r])]
        state.k[r, :, p + int(lengths[r]):] = 1e3  # stale slots past a row's end: must stay unseen
    q = torch.randn(b, h_kv * groups, t, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, h_kv, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    out, same = state.attend(q, k, v, scale=0.3)
    assert same is state
    for r in range(b):
        n = int(lengths[r])
        keys = torch.cat([k0[0], extra_k[r, :, :n], k[r]], 1)[None]
        values = torch.cat([v0[0], extra_v[r, :, :n], v[r]], 1)[None]
        expected = causal_reference(q[r: r + 1], keys, values, 0.3)
        assert torch.allclose(out[r: r + 1], expected, atol=1e-12, rtol=0)
        assert torch.equal(state.k[r, :, p + n: p + n + t], k[r])


def model(seed=0, positions="rope"):
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=50, max_seq_len=64,
                               positions=positions, norm="rmsnorm", mlp="swiglu", bias=False)
    return Transformer(config).double().eval()


@pytest.mark.parametrize("positions", ["rope", "learned"])
@torch.no_grad()
def test_the_decoder_equals_a_growing_cache(positions):
    m = model(positions=positions)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 50, (1, 7), generator=g)
    cache = m.prefill(prompt)
    assert supported(m, cache)
    decoder = StaticDecoder(m, cache, rows=2, room=9, capture=False)
    tokens = torch.randint(0, 50, (2, 4), generator=g)
    lengths = torch.tensor([4, 2])
    first = decoder.prefill(tokens, lengths)
    steps = torch.randint(0, 50, (2, 5), generator=g)
    logits = [decoder.step(steps[:, j]).clone() for j in range(5)]
    for r in range(2):
        row = Cache(layers=list(cache.layers), position=cache.position)
        ids = torch.cat([tokens[r, : int(lengths[r])], steps[r]])[None]
        expected = m(ids, cache=row)[0]
        n = int(lengths[r])
        assert torch.allclose(first[r, :n], expected[:n], atol=1e-10, rtol=0)
        assert torch.allclose(torch.stack([x[r] for x in logits]), expected[n:], atol=1e-10, rtol=0)
    decoder.restart()  # back to the prompt: the same step again gives the same logits
    again = decoder.step(steps[:, 0]).clone()
    plain = m(steps[:, :1], cache=Cache(layers=[(k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)) for k, v in cache.layers],
                                        position=cache.position))[:, -1]
    assert torch.allclose(again, plain, atol=1e-10, rtol=0)


def test_the_decoder_refuses_what_it_cannot_hold():
    m = model()
    cache = m.prefill(torch.zeros(1, 3, dtype=torch.long))
    decoder = StaticDecoder(m, cache, rows=1, room=2, capture=False)
    decoder.step(torch.tensor([1]))
    decoder.step(torch.tensor([2]))
    with pytest.raises(ValueError, match="holds 5 positions; 6 needed"):
        decoder.step(torch.tensor([3]))
    with pytest.raises(ValueError, match="capture needs a CUDA model"):
        StaticDecoder(m, cache, rows=1, room=2, capture=True)
    with pytest.raises(ValueError, match="softmax attention"):
        StaticDecoder(m, Cache.empty(2), rows=1, room=2, capture=False)
