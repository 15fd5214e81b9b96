"""kv-press (NVIDIA kvpress's presses, absorb/methods/kv_press.py) and kv-prefix's press start: the masked cache against a plain
reference in float64, a press that keeps everything is keep-prompt on both backends, kept bytes are counted, the press
compresses the document and not the chat template's tokens, the one adapter kvpress needs on this transformers, the
press start reproduces the press's logits at step 0, re-rotation to 0..n-1, folders round-trip, one-line errors."""

import pytest
import torch
from conftest import CHAT_TEMPLATE, SENTENCES, tiny_bpe_tokenizer, tiny_llama_backends

transformers = pytest.importorskip("transformers")
kvpress = pytest.importorskip("kvpress")

from incontext.absorb import AdaptedModel, get_absorb_method  # noqa: E402
from incontext.absorb.presses import document_start, press_cache, press_classes  # noqa: E402
from incontext.interop.hf import wrap_hf  # noqa: E402
from incontext.interop.models import HFCodec  # noqa: E402
from incontext.ops.masked_kv import MaskedKV, masked_attention_reference  # noqa: E402
from incontext.models.lm import cache_kv  # noqa: E402

DOCUMENT = "Ada Lovelace was born in London. Alan Turing works as a mathematician and has a pet cat named Mat."


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bpe_tokenizer(SENTENCES, 300, CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def backends(tokenizer):
    """(our Transformer, the Hugging Face backend) with the same weights: a tiny Llama with grouped K/V heads."""
    return tiny_llama_backends(len(tokenizer))


def placed(codec) -> torch.Tensor:
    return torch.tensor(codec.encode(codec.chat([{"role": "system", "content": DOCUMENT}])))


@pytest.mark.parametrize("seed", range(4))
def test_masked_cache_attends_as_the_plain_reference(seed):
    g = torch.Generator().manual_seed(seed)
    batch, kv_heads, groups, s, t, d = 1 + seed % 2, 2, 1 + seed % 3, 5 + seed, 1 + seed % 4, 8
    k, v = torch.randn(batch, kv_heads, s, d, generator=g, dtype=torch.float64), torch.randn(batch, kv_heads, s, d, generator=g, dtype=torch.float64)
    keep = torch.rand(batch, kv_heads, s, generator=g) > 0.4
    keep[..., 0] = True
    q = torch.randn(batch, kv_heads * groups, t, d, generator=g, dtype=torch.float64)
    nk, nv = torch.randn(batch, kv_heads, t, d, generator=g, dtype=torch.float64), torch.randn(batch, kv_heads, t, d, generator=g, dtype=torch.float64)
    out, grown = MaskedKV(k, v, keep).attend(q, nk, nv, scale=d ** -0.5,
                                             expand_kv=lambda x: x.repeat_interleave(groups, 1))
    reference = masked_attention_reference(q, k, v, keep, nk, nv, d ** -0.5)
    assert torch.allclose(out, reference, atol=1e-12, rtol=1e-10)
    assert grown.keys.shape[2] == s + t and bool(grown.keep[..., s:].all()) and grown.kept_pairs() == int(keep.sum()) + batch * kv_heads * t


@pytest.mark.parametrize("seed", range(6))
def test_a_compacted_masked_cache_attends_and_trains_as_the_whole_one(seed):
    """MaskedKV.compacted (kv-prefix's press start): the kept pairs and the `always` positions moved to the front, the
    cache as long as the largest count; the attention and the gradients of the keys and values equal the whole
    cache's in float64 (an evicted pair has no gradient in either)."""
    g = torch.Generator().manual_seed(seed)
    batch, kv_heads, groups, s, t, d = 1 + seed % 2, 1 + seed % 3, 1 + seed % 2, 6 + 3 * seed, 1 + seed % 3, 8
    k, v = (torch.randn(batch, kv_heads, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    keep = torch.rand(batch, kv_heads, s, generator=g) > 0.3 + 0.1 * seed
    keep[0, 0, -1] = True  # at least one pair
    q = torch.randn(batch, kv_heads * groups, t, d, generator=g, dtype=torch.float64)
    nk, nv = (torch.randn(batch, kv_heads, t, d, generator=g, dtype=torch.float64) for _ in range(2))
    weights = torch.randn(batch, kv_heads * groups, t, d, generator=g, dtype=torch.float64)
    outs, grads = [], []
    for compact in (False, True):
        kk, vv = k.clone().requires_grad_(), v.clone().requires_grad_()
        layer = MaskedKV(kk, vv, keep)
        layer = layer.compacted((0,)) if compact else layer
        if compact:
            assert layer.keys.shape[2] == int((keep | (torch.arange(s) == 0)).sum(-1).max()) < s or keep.all()
            assert layer.kept_pairs() == int(keep.sum()) and bool((layer.keys[..., 0, :] == k[..., 0, :]).all())
        out, _ = layer.attend(q, nk, nv, scale=d ** -0.5, expand_kv=lambda x: x.repeat_interleave(groups, 1))
        (out * weights).sum().backward()
        outs.append(out.detach())
        grads.append((kk.grad, vv.grad))
    assert torch.allclose(outs[1], outs[0], atol=1e-12, rtol=1e-10)
    for whole, compacted in zip(grads[0], grads[1]):
        assert torch.allclose(compacted, whole, atol=1e-12, rtol=1e-10)
        assert not bool(whole[~keep].any())


def test_the_press_list_comes_from_kvpress():
    classes = press_classes()
    assert {"kvzip", "snapkv", "knorm", "expectedattention", "tova", "streamingllm"} <= set(classes)
    assert all(issubclass(cls, kvpress.BasePress) for cls in classes.values())


@pytest.mark.parametrize("press", ["knorm", "kvzip", "tova"])
def test_keeping_everything_is_keep_prompt_on_both_backends(backends, tokenizer, press):
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    for model in backends:
        full = model(query, cache=model.prefill(prompt[None]))
        adapted = get_absorb_method("kv-press", press=press, ratio=1.0, progress=False).absorb(model, prompt, codec=codec)
        assert torch.allclose(adapted(query), full, atol=1e-5), (press, model.backend)


def test_kept_bytes_are_counted_pair_by_pair(backends, tokenizer):
    ours, theirs = backends
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    full = get_absorb_method("keep-prompt").absorb(ours, prompt).kept_bytes(ours)
    knorm = get_absorb_method("kv-press", press="knorm", ratio=0.5).absorb(ours, prompt, codec=codec)
    assert knorm.kept_bytes(ours) == full * (prompt.shape[0] - int(prompt.shape[0] * 0.5)) // prompt.shape[0]
    kvzip = get_absorb_method("kv-press", press="kvzip", ratio=0.25).absorb(ours, prompt, codec=codec)
    layers = kvzip.state().layers
    assert all(isinstance(layer, MaskedKV) for layer in layers)  # head-wise: a full-length cache, evicted pairs masked
    kept = sum(layer.kept_pairs() for layer in layers)
    assert kvzip.kept_bytes(ours) == kept * 2 * layers[0].keys.shape[-1] * 4
    assert abs(kvzip.kept_bytes(ours) / full - 0.25) < 0.03
    on_hf = get_absorb_method("kv-press", press="kvzip", ratio=0.25).absorb(theirs, prompt, codec=codec)
    assert all(isinstance(layer, MaskedKV) for layer in on_hf.state().layers)  # the HF backend holds the mask too
    assert on_hf.kept_bytes(theirs) == kvzip.kept_bytes(ours)


def tiny_qwen2(vocab: int):
    torch.manual_seed(1)
    config = transformers.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=0, eos_token_id=1)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    lm = wrap_hf(hf).eval()
    return lm.as_transformer(), lm


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_head_wise_presses_run_on_the_hugging_face_backend_as_on_ours(backends, tokenizer, family, press="kvzip"):
    """A press that keeps a different number of pairs per head: the Hugging Face backend's per-head mask gives the
    logits of our Transformer's masked cache (whose attention tests/absorb check against the plain reference), for
    a query of several tokens and for greedy decoding token by token after it."""
    ours, theirs = backends if family == "llama" else tiny_qwen2(len(tokenizer))
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    a = get_absorb_method("kv-press", press=press, ratio=0.3).absorb(ours, prompt, codec=codec)
    b = get_absorb_method("kv-press", press=press, ratio=0.3).absorb(theirs, prompt, codec=codec)
    assert torch.equal(a.state().layers[0].keep, b.state().layers[0].keep)
    assert not bool(a.state().layers[0].keep.all())  # something was evicted
    full = get_absorb_method("keep-prompt").absorb(theirs, prompt)(query)
    assert torch.allclose(a(query), b(query), atol=1e-4, rtol=1e-4)
    assert (b(query) - full).abs().max() > 1e-3  # the mask is honoured: not the full cache's logits
    from incontext.absorb.decode import stream_tokens

    assert list(stream_tokens(a, query[0].tolist(), 6)) == list(stream_tokens(b, query[0].tolist(), 6))


def test_kvzip_reconstructs_the_document_not_the_template(backends, tokenizer, monkeypatch):
    ours, _ = backends
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    start = document_start(codec, prompt.tolist())
    assert codec.decode(prompt[:start].tolist()) == "<|im_start|>system\n"
    assert codec.decode(prompt[start:].tolist()).startswith(DOCUMENT)
    chunks = []
    original = kvpress.KVzipPress.prepare

    def spy(self, model, tok, *args, **kwargs):
        pairs = original(self, model, tok, *args, **kwargs)
        chunks.extend(a for a, _ in pairs)
        return pairs

    monkeypatch.setattr(kvpress.KVzipPress, "prepare", spy)
    press_cache(ours, prompt[None], "kvzip", 0.5, codec)
    assert torch.equal(torch.cat(chunks, 1)[0], prompt[start:])  # the document (and its turn's end), from its start
    assert document_start(codec, codec.encode(DOCUMENT)) == 0  # a raw document starts at once


def test_kvpress_still_needs_its_one_adapter(backends):
    """kvpress 0.5.5's unmodified BasePress.forward_hook on this transformers: a KeyError for `cache_position`. When
    this test fails, upstream passes it again and kv_press.with_cache_position can go."""
    hf = backends[1].hf
    cache = transformers.DynamicCache(config=hf.config)
    with pytest.raises(KeyError, match="cache_position"):
        with kvpress.KnormPress(compression_ratio=0.5)(hf):
            hf.model(input_ids=torch.arange(2, 30)[None], past_key_values=cache)


@pytest.mark.parametrize("press, backend", [("kvzip", 0), ("knorm", 0), ("knorm", 1)])
def test_the_press_start_is_the_press_at_step_0(backends, tokenizer, press, backend):
    model = backends[backend]
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    pressed = get_absorb_method("kv-press", press=press, ratio=0.25).absorb(model, prompt, codec=codec)
    start = get_absorb_method("kv-prefix", init="press", press=press, ratio=0.25, steps=0, passes=0,
                              progress=False).absorb(model, prompt, codec=codec)
    assert start.position == pressed.position == prompt.shape[0]  # queries after the whole document
    if press == "kvzip":  # per-head budgets: the start holds the kept pairs alone (compacted), the same attention
        assert max(k.shape[2] for k, _ in cache_kv(start.state())) < prompt.shape[0]
        assert torch.allclose(start(query), pressed(query), atol=1e-5)
    else:
        assert torch.equal(start(query), pressed(query))
    assert start.kept_bytes(model) == pressed.kept_bytes(model)


def test_rerotated_press_start(backends, tokenizer):
    ours, _ = backends
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    whole = get_absorb_method("kv-prefix", init="press-rerotated", press="knorm", ratio=1.0, steps=0, passes=0,
                              progress=False).absorb(ours, prompt, codec=codec)
    assert whole.position == prompt.shape[0]  # every pair kept, each at its own rank: the document's cache
    assert torch.allclose(whole(query), ours(query, cache=ours.prefill(prompt[None])), atol=1e-5)
    quarter = get_absorb_method("kv-prefix", init="press-rerotated", press="knorm", ratio=0.25, steps=0, passes=0,
                                progress=False).absorb(ours, prompt, codec=codec)
    assert quarter.position == prompt.shape[0] - int(prompt.shape[0] * 0.75)  # positions 0..n-1


def test_a_per_head_press_start_keeps_each_heads_budget(backends, tokenizer):
    """init=press-rerotated with KVzip (a different number of pairs per head): in every layer and head the press's
    kept pairs, in document order, keys re-rotated to 0 .. n_h - 1 (rotated back, the document's own keys), values
    unchanged, the rest of the head masked; the prefix as long as the largest budget, the kept bytes the press's.
    All kept (ratio 1): the document's own cache."""
    from incontext.absorb.methods.kv_prefix.start import rerotate
    from incontext.ops.masked_kv import MaskedKV

    ours, _ = backends
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    pressed = get_absorb_method("kv-press", press="kvzip", ratio=0.25).absorb(ours, prompt, codec=codec)
    start = get_absorb_method("kv-prefix", init="press-rerotated", press="kvzip", ratio=0.25, steps=0, passes=0,
                              progress=False).absorb(ours, prompt, codec=codec)
    full = ours.prefill(prompt[None])
    budgets = []
    for layer, mine, (fk, fv) in zip(pressed.state().layers, start.state().layers, full.layers):
        assert isinstance(mine, MaskedKV)
        for h in range(fk.shape[1]):
            positions = layer.keep[0, h].nonzero().flatten()
            n = positions.shape[0]
            budgets.append(n)
            assert mine.keep[0, h, :n].all() and not mine.keep[0, h, n:].any()
            back = rerotate(ours, mine.keys[:, h:h + 1, :n], positions - torch.arange(n))
            assert torch.allclose(back[0, 0], fk[0, h, positions], atol=1e-5)
            assert torch.equal(mine.values[0, h, :n], fv[0, h, positions])
    assert len(set(budgets)) > 1 and start.position == max(budgets) < prompt.shape[0]
    assert start.kept_bytes(ours) == pressed.kept_bytes(ours)
    assert torch.isfinite(start(query)).all()
    whole = get_absorb_method("kv-prefix", init="press-rerotated", press="kvzip", ratio=1.0, steps=0, passes=0,
                              progress=False).absorb(ours, prompt, codec=codec)
    assert torch.allclose(whole(query), ours(query, cache=ours.prefill(prompt[None])), atol=1e-5)


@pytest.mark.parametrize("backend, press", [(0, "kvzip"), (1, "kvzip"), (1, "knorm")])
def test_folders_round_trip(backends, tokenizer, backend, press, tmp_path):
    model = backends[backend]
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    query = torch.tensor([codec.encode("Q: Where was Ada born?\nA:")])
    rerotated = [get_absorb_method("kv-prefix", init="press-rerotated", press=press, steps=2, passes=0,
                                   autocast="none", progress=False)] if backend == 0 else []  # our Transformer's RoPE
    for i, method in enumerate([get_absorb_method("kv-press", press=press, ratio=0.25),
                                get_absorb_method("kv-prefix", init="press", press=press, steps=2, passes=0,
                                                  autocast="none", progress=False), *rerotated]):
        adapted = method.absorb(model, prompt, codec=codec)
        adapted.save(tmp_path / str(i))
        back = AdaptedModel.load(tmp_path / str(i), base=model)
        assert type(back) is type(adapted) and torch.equal(back(query), adapted(query))
        assert back.kept_bytes(model) == adapted.kept_bytes(model)


@pytest.mark.parametrize("options, message", [({"press": "nope"}, "unknown press 'nope'"), ({"ratio": 0}, "ratio"),
                                              ({"ratio": 1.5}, "ratio"), ({"document_start": -1}, "document_start")])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as error:
        get_absorb_method("kv-press", **options)
    assert "\n" not in str(error.value)


def test_kvzip_without_a_tokenizer_says_so(backends, tokenizer):
    prompt = placed(HFCodec(tokenizer))
    with pytest.raises(ValueError, match="give codec="):
        get_absorb_method("kv-press", press="kvzip").absorb(backends[0], prompt)


@pytest.mark.parametrize("press", ["kvzap", "fastkvzip", "restorekv"])
def test_presses_with_hub_weights_are_refused_before_any_model_runs(press):
    with pytest.raises(ValueError, match=f"press={press} needs trained weights") as error:
        get_absorb_method("kv-press", press=press)
    assert "\n" not in str(error.value)


def test_kvgrad_reconstructs_with_the_tokenizer_as_kvzip(backends, tokenizer):
    """KVgrad inherits KVzip's reconstruction (its tokenizer from a folder): it runs on both backends."""
    codec, prompt = HFCodec(tokenizer), placed(HFCodec(tokenizer))
    kept = [get_absorb_method("kv-press", press="kvgrad", ratio=0.3).absorb(m, prompt, codec=codec).kept_bytes(m)
            for m in backends]
    assert kept[0] == kept[1] > 0


def test_compose_steps_keep_each_compacted_press_starts_sink(backends, tokenizer):
    """Two kv-prefix absorbs from KVzip's start (compacted: each layer as long as its largest head budget, the layers of
    different lengths), composed and trained (compose_steps): each document's first pair, at offset 0 and at the first
    prefix's own length in every layer, is left as it was; the rest trains."""
    model, codec = backends[0], HFCodec(tokenizer)
    prompt = placed(codec)
    options = dict(init="press", press="kvzip", ratio=0.25, steps=2, passes=0, autocast="none", progress=False,
                   learning_rate=0.05, patience=50)
    a, b = (get_absorb_method("kv-prefix", **options).absorb(model, p, codec=codec) for p in (prompt, prompt[:-3]))
    plain = get_absorb_method("kv-prefix", **options).compose([a, b])
    trained = get_absorb_method("kv-prefix", **options, compose_steps=3).compose([a, b])
    lengths = [k.shape[2] for k, _ in cache_kv(a.state())]
    assert len(set(lengths)) > 1 and max(lengths) < prompt.shape[0]  # per-layer compaction
    for n, (k0, v0), (k1, v1) in zip(lengths, plain._tensors(), trained._tensors()):
        for at in (0, n):
            assert torch.equal(k0[:, :, at], k1[:, :, at]) and torch.equal(v0[:, :, at], v1[:, :, at])
    assert not all(torch.equal(k0, k1) for (k0, _), (k1, _) in zip(plain._tensors(), trained._tensors()))
