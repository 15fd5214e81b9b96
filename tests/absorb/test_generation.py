"""Every adapted model's `query_cache()` continues the query as its forward does: the base run through the cache
gives the adapted model's logits for the query and for every token decoded after it (float64)."""

import pytest
import torch

from incontext.absorb import get_absorb_method
from incontext.absorb.decode import context_room, start_position, stream_tokens
from incontext.models import CGT, CGTConfig, Transformer, TransformerConfig


def transformer(seed, **options):
    torch.manual_seed(seed)
    config = {"vocab_size": 40, "n_layer": 2, "d_model": 16, "n_head": 2, "positions": "rope", "max_seq_len": 64,
              "init_std": 0.3, **options}
    return Transformer(TransformerConfig(**config)).double().eval()


CASES = [  # (method, its options, the model it absorbs into)
    ("keep-prompt", {}, {}),
    ("drop-prompt", {}, {}),
    ("iclca", {}, {"attention": "linear", "feature_map": "elu"}),
    ("iclca", {}, {"attention": "linear", "feature_map": "elu", "positions": "learned"}),
    ("iclca-approx", {"n_features": 16, "exact_sinks": 1}, {}),
    ("dynamic-eval", {"learning_rate": 0.1}, {"positions": "learned"}),
    ("dynamic-eval", {"learning_rate": 0.1, "keep_prompt": True}, {}),
    ("distill-lora", {"steps": 2, "learning_rate": 0.05, "study.n_continuations": 1, "study.continuation_tokens": 3,
                      "progress": False, "merge": False}, {}),
    ("cgt-fold", {}, None),
]


@pytest.mark.parametrize("seed, method, options, model_options", [(i, *case) for i, case in enumerate(CASES)])
def test_query_cache_continues_like_forward(seed, method, options, model_options):
    if model_options is None:
        torch.manual_seed(seed)
        model = CGT(CGTConfig(n_layer=3, split_layer=2, d_x=16, n_head_x=2, d_y=8, n_head_y=2, vocab_size=40)).double().eval()
    else:
        model = transformer(seed, **model_options)
    g = torch.Generator().manual_seed(seed)
    prompt, query = torch.randint(0, 40, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g), \
        torch.randint(0, 40, (1, 5), generator=g)
    adapted = get_absorb_method(method, **options).absorb(model, prompt)
    with torch.no_grad():
        for p in adapted.parameters():  # weights not float32-representable
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 1e-3)
    cache = adapted.query_cache()
    assert cache is not None
    with torch.no_grad():
        logits = adapted.base(query, cache=cache)
        assert (logits - adapted(query)).abs().max() < 1e-12
        sequence = query
        for _ in range(3):  # decoding one token at a time through the cache
            token = logits[:, -1:].argmax(-1)
            sequence = torch.cat([sequence, token], 1)
            logits = adapted.base(token, cache=cache)
            assert (logits[:, -1] - adapted(sequence)[:, -1]).abs().max() < 1e-12
        assert adapted.query_cache().position == start_position(adapted)  # a fresh cache each time
    chain = list(stream_tokens(adapted, query[0].tolist(), 6))
    assert chain == greedy(adapted, query[0].tolist(), 6)


def greedy(adapted, ids, n):
    with torch.no_grad():
        for _ in range(n):
            ids = ids + [int(adapted(torch.tensor([ids]))[0, -1].argmax())]
    return ids[-n:]


def test_context_room_counts_the_absorbed_prompt():
    model = transformer(0, positions="learned")
    prompt = torch.arange(10)
    assert context_room(model, 4) == 60
    assert context_room(get_absorb_method("dynamic-eval").absorb(model, prompt), 4) == 50
    assert context_room(get_absorb_method("keep-prompt").absorb(model, prompt), 4) == 50
    assert context_room(get_absorb_method("drop-prompt").absorb(model, prompt), 4) == 60
