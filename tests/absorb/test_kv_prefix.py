"""kv-prefix: a trained K/V prefix (Cartridges) on both backends: exactly keep-prompt at p = M from the document's
own K/V, training moves only the prefix (not the first position, not the base), save/load, transformers' own
generate from the prefix as past_key_values, and one-line errors for bad options."""

import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from incontext.absorb import AdaptedModel, KeepPrompt, get_absorb_method  # noqa: E402
from incontext.absorb.study import stage as study_stage  # noqa: E402
from incontext.absorb.distill import training_steps  # noqa: E402
from incontext.absorb.decode import stream_tokens  # noqa: E402
from incontext.interop.hf import to_hf_llama  # noqa: E402
from incontext.models.hf_backend import HFCausalLM, prefix_cache  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402

FAST = {"progress": False, "study.n_continuations": 1, "study.continuation_tokens": 6, "study.window_tokens": 8, "passes": 0}


def tiny(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=128,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)
    model = Transformer(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(params=["incontext", "hf"])
def model(request):
    ours = tiny()
    return ours if request.param == "incontext" else HFCausalLM(to_hf_llama(ours).eval()).eval()


def prompt_and_query(m=20, n=7, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 61, (m,), generator=g), torch.randint(0, 61, (1, n), generator=g)


@pytest.mark.parametrize("m", [1, 9, 20])
def test_the_documents_own_kv_at_p_equal_m_is_keep_prompt(model, m):
    prompt, query = prompt_and_query(m)
    adapted = get_absorb_method("kv-prefix", prefix_tokens=m, steps=0, **FAST).absorb(model, prompt)
    with torch.no_grad():
        assert (adapted(query) - KeepPrompt().absorb(model, prompt)(query)).abs().max() < 1e-10
    assert adapted.kept_bytes(model) == KeepPrompt().absorb(model, prompt).kept_bytes(model)


def test_training_moves_only_the_prefix_and_lowers_the_kl(model):
    prompt, query = prompt_and_query()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    initial = get_absorb_method("kv-prefix", prefix_tokens=5, steps=0, **FAST).absorb(model, prompt)
    trained = get_absorb_method("kv-prefix", prefix_tokens=5, steps=25, learning_rate=0.05, **FAST).absorb(model, prompt)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the base is untouched
    assert all(p.grad is None for p in model.parameters())
    kl = trained.history["loss"]
    assert kl[-1] < 0.8 * kl[0]
    for (k0, v0), (k1, v1) in zip(initial._tensors(), trained._tensors()):
        assert torch.equal(k0[:, :, :1], k1[:, :, :1]) and torch.equal(v0[:, :, :1], v1[:, :, :1])  # the sink
        assert not torch.equal(k0, k1)
    assert trained.kept_bytes(model) == initial.kept_bytes(model) == KeepPrompt().absorb(model, prompt).kept_bytes(model) // 4


def test_save_and_load_give_the_same_model(model, tmp_path):
    prompt, query = prompt_and_query()
    adapted = get_absorb_method("kv-prefix", prefix_tokens=6, steps=3, **FAST).absorb(model, prompt)
    adapted.save(tmp_path / "prefix")
    loaded = AdaptedModel.load(tmp_path / "prefix", base=model)
    with torch.no_grad():
        assert torch.equal(loaded(query), adapted(query))
    assert loaded.query_cache().position == 6
    # the file holds the prefix alone (what the method keeps), not the frozen base; the base is shared on load
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "prefix" / "adapted.safetensors"))
    assert sorted(saved) == sorted(n for n, _ in adapted.named_buffers(recurse=False))
    assert sum(t.numel() * t.element_size() for t in saved.values()) == adapted.kept_bytes(model)
    assert loaded.base is model
    with pytest.raises(ValueError, match="its base model"):
        AdaptedModel.load(tmp_path / "prefix")


def test_transformers_generates_from_the_prefix_as_past_key_values(model):
    """Greedy generation with transformers' own generate from the prefix equals ours."""
    prompt, query = prompt_and_query()
    adapted = get_absorb_method("kv-prefix", prefix_tokens=6, steps=3, **FAST).absorb(model, prompt)
    hf = model.hf if model.backend == "hf" else to_hf_llama(model).eval()
    ours = list(stream_tokens(adapted, query[0].tolist(), 8))
    ids = torch.cat([torch.zeros(1, adapted.position, dtype=torch.long), query], 1)  # placeholders for the prefix
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # transformers >= 5.24
    theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                         pad_token_id=-1, **{name: prefix_cache(adapted, hf.config)})
    eos = hf.generation_config.eos_token_id  # transformers stops at the end-of-text token; our stream goes on
    if isinstance(eos, int) and eos in ours:
        ours = ours[: ours.index(eos) + 1]
    assert len(ours) >= 3 and theirs[0, adapted.position + query.shape[1]:].tolist() == ours


@pytest.mark.parametrize("options, message", [
    ({"prefix_tokens": 0}, "prefix_tokens must be an integer >= 1"),
    ({"prefix_tokens": 2.5}, "prefix_tokens must be an integer"),
    ({"learning_rate": float("nan")}, "learning_rate must be a finite number"),
    ({"init": "zeros"}, "init must be one of"),
    ({"steps": -1}, "steps must be an integer >= 0"),
    ({"passes": -2}, "passes must be an integer >= 0"),
    ({"compose_steps": -1}, "compose_steps must be an integer >= 0"),
    ({"schedule": "cosine"}, "unknown option 'schedule'"),
    ({"study.window_tokens": 0}, "kv-prefix.study: window_tokens must be an integer >= 1"),
    ({"study": 3}, "study holds options: give study.OPTION=VALUE"),
    ({"autocast": "int8"}, "autocast must be one of none, bfloat16, float16"),
    ({"argmax_weight": -1}, "argmax_weight must be a finite number >= 0"),
])
def test_bad_options_are_refused(options, message):
    """Through the registry (--set) and through the class from Python alike: one check, one-line errors."""
    from incontext.absorb.methods.kv_prefix import KVPrefix

    for make in (lambda: get_absorb_method("kv-prefix", **options), lambda: KVPrefix(**options)):
        with pytest.raises(ValueError, match=message) as error:
            make()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["kv-prefix", "distill-lora"])
def test_the_wording_ensemble_without_groups_is_refused_not_ignored(name):
    """wording_ensemble=true with training queries but no train_groups: one line before any work (it was ignored)."""
    prompt, query = prompt_and_query()
    method = get_absorb_method(name, study=dict(wording_ensemble=True), steps=1, **FAST)
    with pytest.raises(ValueError, match=f"{name}: study.wording_ensemble=true needs train_groups") as error:
        method.absorb(tiny(), prompt, train_queries=[query[0]])
    assert "\n" not in str(error.value)
    assert method.absorb(tiny(), prompt, train_queries=[query[0]], train_groups=[0]) is not None


def test_options_from_python_are_the_registrys():
    """The class built from Python holds the Options' defaults and the given values, converted as --set's are."""
    from incontext.absorb.methods.kv_prefix import KVPrefix, KVPrefixOptions

    method = KVPrefix(prefix_tokens=8, study=dict(temperature=2, seed_prompts=["question", "creative"]))
    options = method.options
    assert options.prefix_tokens == 8 and options.passes == KVPrefixOptions.passes and options.study.temperature == 2.0
    assert isinstance(options.study.temperature, float) and options.study.seed_prompts == ("question", "creative")
    assert not hasattr(method, "prefix_tokens")  # a method reads its options in self.options alone
    assert not set(vars(method)) & set(KVPrefixOptions.__dataclass_fields__)  # one place: method.options, no copies
    assert method.given_options == {"prefix_tokens": 8, "study.temperature": 2.0, "study.seed_prompts": ("question", "creative")}
    with pytest.raises(ValueError, match="unknown option 'prefix'"):
        KVPrefix(prefix=8)


@pytest.mark.parametrize("backend", ["incontext", "hf"])
def test_autocast_trains_with_half_precision_matmuls_and_keeps_the_prefix_in_float32(monkeypatch, backend):
    """autocast=bfloat16: the student's logits come out of bf16 matmuls during training (never during the data
    stage: the teacher's targets stay float32), the prefix stays float32, and it lands near the float32 prefix
    without equalling it; "none" trains exactly as before (the same prefix twice)."""
    from incontext.absorb import distill

    model = tiny(dtype=torch.float32, seed=5)
    if backend == "hf":
        model = HFCausalLM(to_hf_llama(model).eval()).eval()
    prompt, _ = prompt_and_query(m=16, seed=6)
    seen = []
    loss = distill.distillation_loss
    monkeypatch.setattr(distill, "distillation_loss", lambda logits, tensors, *rest: (seen.append(logits.dtype), loss(logits, tensors, *rest))[1])
    options = dict(FAST, prefix_tokens=4, steps=8, learning_rate=0.02, patience=50, heldout=0)  # training's losses only
    plain = get_absorb_method("kv-prefix", **options, autocast="none").absorb(model, prompt)
    again = get_absorb_method("kv-prefix", **options, autocast="none").absorb(model, prompt)
    assert set(seen) == {torch.float32}
    seen.clear()
    half = get_absorb_method("kv-prefix", **options, autocast="bfloat16").absorb(model, prompt)
    assert set(seen) == {torch.bfloat16} and len(seen) == 8
    assert all(sequence[1].dtype == torch.float32 for sequence in half.sequences)
    gaps = []
    for (k0, v0), (k1, v1), (k2, v2) in zip(plain._tensors(), again._tensors(), half._tensors()):
        assert torch.equal(k0, k1) and torch.equal(v0, v1) and k2.dtype == v2.dtype == torch.float32
        gaps += [float((k0 - k2).abs().max() / k0.abs().max()), float((v0 - v2).abs().max() / v0.abs().max())]
    assert 0 < max(gaps) < 0.05


@pytest.mark.parametrize("backend", ["incontext", "hf"])
@pytest.mark.parametrize("seed", [0, 1])
def test_autocast_training_on_the_weights_cast_once_equals_autocasts_own_casts(monkeypatch, backend, seed):
    """Under autocast the frozen weights are cast to bf16 once (runtime.frozen_casts, read through functional_call)
    instead of by autocast at every forward: the trained prefix is the same bit for bit; the casts are used."""
    from incontext.absorb import distill

    model = tiny(dtype=torch.float32, seed=5 + seed)
    if backend == "hf":
        model = HFCausalLM(to_hf_llama(model).eval()).eval()
    elif seed:  # an output layer tied to the embedding (SmolLM2's): its cast is its own, the embedding stays float32
        model.lm_head.weight = model.tok_emb.weight
    prompt, _ = prompt_and_query(m=16, seed=6 + seed)
    options = dict(FAST, prefix_tokens=4, steps=8, learning_rate=0.02, patience=50, autocast="bfloat16")
    made = []
    real = distill.frozen_casts
    monkeypatch.setattr(distill, "frozen_casts", lambda *a, **k: (made.append(real(*a, **k)), made[-1])[1])
    once = get_absorb_method("kv-prefix", **options).absorb(model, prompt)
    assert made and made[0] and all(t.dtype == torch.bfloat16 for t in made[0].values())
    each_step = get_absorb_method("kv-prefix", **options, speed=distill.Speed(cast_once=False)).absorb(model, prompt)
    assert made[-1] == {}
    for (k0, v0), (k1, v1) in zip(once._tensors(), each_step._tensors()):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the model itself is untouched


@pytest.mark.parametrize("autocast", ["bfloat16", "float16"])
def test_autocast_leaves_a_float64_model_in_float64(autocast):
    """Autocast casts float32 only: a float64 model trains in float64 under it, the same prefix as without it (the
    weights cast once are float32 weights only, so nothing changes here either)."""
    model = tiny(dtype=torch.float64, seed=2)
    prompt, _ = prompt_and_query(m=16, seed=3)
    options = dict(FAST, prefix_tokens=4, steps=3, learning_rate=0.02, patience=50)
    half = get_absorb_method("kv-prefix", **options, autocast=autocast).absorb(model, prompt)
    plain = get_absorb_method("kv-prefix", **options).absorb(model, prompt)
    for (k0, v0), (k1, v1) in zip(half._tensors(), plain._tensors()):
        assert k0.dtype == torch.float64 and torch.equal(k0, k1) and torch.equal(v0, v1)


def test_passes_over_a_large_data_stage_lengthen_training():
    """Training runs max(steps, passes * sequences / batch_size) steps (none at steps = 0)."""
    model = tiny()
    prompt, _ = prompt_and_query()
    g = torch.Generator().manual_seed(5)
    queries = [torch.randint(0, 61, (1, 4), generator=g) for _ in range(9)]
    options = dict(FAST, prefix_tokens=5, steps=3, learning_rate=0.01, patience=1000, batch_size=2)
    trained = get_absorb_method("kv-prefix", **{**options, "passes": 2}).absorb(model, prompt, train_queries=queries)
    n = sum(v for k, v in trained.history["pool"].items() if k != "cached")
    assert n > 9 and trained.history["steps"] == -(-2 * n // 2) == training_steps(3, 2, n, 2)
    assert get_absorb_method("kv-prefix", **options).absorb(model, prompt, train_queries=queries).history["steps"] == 3
    assert training_steps(0, 2, n, 2) == 0


def test_early_stopping_waits_for_a_pass_over_the_sequences():
    """The plateau test compares windows of `patience` steps, at least one pass over the data stage's sequences:
    with patience 1 and a threshold every window meets, training stops after two passes, not after two steps."""
    model = tiny()
    prompt, _ = prompt_and_query()
    g = torch.Generator().manual_seed(5)
    queries = [torch.randint(0, 61, (1, 4), generator=g) for _ in range(9)]
    options = dict(FAST, prefix_tokens=5, steps=200, learning_rate=0.01, patience=1, min_improvement=0.99, batch_size=2)
    trained = get_absorb_method("kv-prefix", **options).absorb(model, prompt, train_queries=queries)
    n = sum(v for k, v in trained.history["pool"].items() if k != "cached")
    assert n > 9 and trained.history["stopped_early"] and trained.history["steps"] == 2 * -(-n // 2)


def test_a_prefix_longer_than_the_document_or_the_context_is_refused(model):
    prompt, _ = prompt_and_query(10)
    with pytest.raises(ValueError, match="exceeds the document's 10 tokens"):
        get_absorb_method("kv-prefix", prefix_tokens=11, steps=0, **FAST).absorb(model, prompt)
    with pytest.raises(ValueError, match="no room for queries"):
        get_absorb_method("kv-prefix", prefix_tokens=128, steps=0, **FAST).absorb(model, torch.arange(200) % 61)


def test_a_document_longer_than_the_context_is_absorbed_in_chunks(model):
    """Both backends: a 300-token document on a 128-token context: the teacher reads chunks of half the context, the
    prefix (a quarter of the context by default) starts as the document's first 32 tokens' own K/V, and the
    untrained prefix answers as keep-prompt does on those 32 tokens (1e-10, float64)."""
    prompt, query = prompt_and_query(300)
    adapted = get_absorb_method("kv-prefix", steps=0, **FAST).absorb(model, prompt)
    assert adapted.position == 32 and adapted.history["pool"]["chunks"] == len(study_stage.chunk_spans(300, 0, 128)) > 1
    keep = KeepPrompt().absorb(model, prompt[:32])
    assert (adapted(query) - keep(query)).abs().max() < 1e-10
    with pytest.raises(ValueError, match="study.chunk_tokens=128 leaves the teacher no room"):
        get_absorb_method("kv-prefix", study=dict(chunk_tokens=128), steps=0, **FAST).absorb(model, prompt)


def test_composed_prefixes_at_full_length_are_both_documents_in_context(model):
    """Two documents' own K/V (p = M each), concatenated: the query sees both, as if each had been prefilled on its
    own and the caches joined (their positions as they were absorbed)."""
    from incontext.absorb.methods.kv_prefix import compose_prefixes
    from incontext.models.lm import cache_kv

    first, query = prompt_and_query(9, seed=1)
    second, _ = prompt_and_query(7, seed=2)
    a, b = (get_absorb_method("kv-prefix", prefix_tokens=p.shape[0], steps=0, **FAST).absorb(model, p) for p in (first, second))
    both = compose_prefixes(a, b)
    assert both.position == 16 and both.kept_bytes(model) == a.kept_bytes(model) + b.kept_bytes(model)
    joined = [torch.cat([x, y], 2) for x, y in zip(cache_kv(a.state())[0], cache_kv(b.state())[0])]
    assert all(torch.equal(x, y) for x, y in zip(cache_kv(both.state())[0], joined))
    with torch.no_grad():
        out = both(query)
    assert torch.isfinite(out).all() and not torch.equal(out, a(query))
    with pytest.raises(ValueError, match="at least two"):
        compose_prefixes(a)


def test_a_per_head_press_prefix_composes_with_its_mask(model):
    """A prefix from a per-head press (MaskedKV layers, as KVzip's start) composed with a plain one: its evicted pairs
    stay unattended. Where every head keeps the same positions the mask equals leaving those pairs out of the cache
    (keys carry their rotation), so the composition equals the composition of the compacted prefix (float64)."""
    from incontext.absorb.methods.kv_prefix import TrainedPrefix, compose_prefixes
    from incontext.models import Cache
    from incontext.models.lm import cache_kv, with_kv
    from incontext.ops.masked_kv import MaskedKV

    first, query = prompt_and_query(9, seed=1)
    second, _ = prompt_and_query(7, seed=2)
    a, b = (get_absorb_method("kv-prefix", prefix_tokens=p.shape[0], steps=0, init="document", **FAST).absorb(model, p)
            for p in (first, second))
    kept = torch.tensor([0, 2, 3, 6, 8])
    masked_layers, compact = [], []
    for k, v in cache_kv(a.state()):
        keep = torch.zeros(k.shape[:3], dtype=torch.bool)
        keep[:, :, kept] = True
        masked_layers.append(MaskedKV(k, v, keep))
        compact.append((k[:, :, kept], v[:, :, kept]))
    masked = TrainedPrefix(model, Cache(layers=masked_layers, position=a.position))
    compacted = TrainedPrefix(model, with_kv(a.state(), compact))
    assert compacted.position == masked.position == 9
    both, reference = compose_prefixes(masked, b), compose_prefixes(compacted, b)
    assert all(isinstance(layer, MaskedKV) and int(layer.keep.sum()) == layer.keep.shape[1] * (5 + 7)
               for layer in both.state().layers)
    with torch.no_grad():
        out, expected = both(query), reference(query)
    assert (out - expected).abs().max() < 1e-10
    assert not torch.allclose(out, compose_prefixes(a, b)(query))


def test_compose_steps_train_the_concatenation_on_both_stages(model, tmp_path):
    """compose_steps: the concatenated prefixes trained on the union of both documents' data stages, each
    document's first position (its sink) left as it was; it fits both stages better than the plain concatenation;
    0 is the plain concatenation; a prefix loaded from a folder has no data stage: a one-line error."""
    from incontext.absorb.methods.kv_prefix import compose_prefixes
    from incontext.absorb.distill import distillation_kl

    first, query = prompt_and_query(12, seed=1)
    second, _ = prompt_and_query(16, seed=2)
    options = dict(FAST, steps=4, learning_rate=0.05, patience=50)
    a, b = (get_absorb_method("kv-prefix", **options).absorb(model, p) for p in (first, second))
    plain = get_absorb_method("kv-prefix", **options).compose([a, b])
    assert all(torch.equal(x, y) for x, y in zip(plain._tensors()[0], compose_prefixes(a, b)._tensors()[0]))
    trained = get_absorb_method("kv-prefix", **options, compose_steps=12).compose([a, b])
    assert trained.position == plain.position == a.position + b.position and trained.history["compose"]["steps"] == 12
    for (k0, v0), (k1, v1) in zip(plain._tensors(), trained._tensors()):
        for at in (0, a.position):  # each document's sink
            assert torch.equal(k0[:, :, at], k1[:, :, at]) and torch.equal(v0[:, :, at], v1[:, :, at])
        assert not torch.equal(k0, k1)
    sequences = a.sequences + b.sequences
    with torch.no_grad():
        fit = [sum(float(distillation_kl(lambda t, c=c: model(t, cache=c.query_cache()), [item])) for item in sequences)
               for c in (plain, trained)]
    assert fit[1] < fit[0]
    a.save(tmp_path / "a")
    loaded = type(a).load(tmp_path / "a", model)
    with pytest.raises(ValueError, match="compose_steps trains on each absorb's data stage") as error:
        get_absorb_method("kv-prefix", **options, compose_steps=2).compose([loaded, b])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("seed, argmax_weight", [(0, 0.0), (1, 0.5)])
def test_the_fixed_shape_step_a_cuda_graph_replays_equals_the_eager_step(monkeypatch, seed, argmax_weight):
    """On a CUDA device the training step is captured as a CUDA graph, which needs fixed shapes (every batch padded
    to the longest sequence) and a loss without host syncs; run eagerly here, that step trains the same prefix as
    the eager one whose batches are padded to their own longest sequence (float64, 1e-10)."""
    from incontext.absorb import distill

    model = tiny(seed=seed)
    prompt, _ = prompt_and_query(m=16, seed=seed + 3)
    g = torch.Generator().manual_seed(seed)
    queries = [torch.randint(0, 61, (1, n), generator=g) for n in (3, 5, 9, 2)]  # sequences of several lengths
    options = dict(FAST, prefix_tokens=4, steps=12, learning_rate=0.05, patience=50, study=dict(window_tokens=6, answer_tokens=2),
                   argmax_weight=argmax_weight)
    eager = get_absorb_method("kv-prefix", **options).absorb(model, prompt, train_queries=queries)
    fixed = get_absorb_method("kv-prefix", **options, speed=distill.Speed(fixed_shapes=True)).absorb(
        model, prompt, train_queries=queries)
    assert eager.history["steps"] == fixed.history["steps"] == 12 and eager.history["pool"]["train_queries"] == 4
    for (k0, v0), (k1, v1) in zip(eager._tensors(), fixed._tensors()):
        assert (k0 - k1).abs().max() < 1e-10 and (v0 - v1).abs().max() < 1e-10
    assert max(abs(a - b) for a, b in zip(eager.history["loss"], fixed.history["loss"])) < 1e-10
    initial = get_absorb_method("kv-prefix", **{**options, "steps": 0}).absorb(model, prompt)
    assert max((k0 - k1).abs().max() for (k0, _), (k1, _) in zip(initial._tensors(), fixed._tensors())) > 1e-3


def test_rerotate_moves_rope_keys_to_other_positions():
    """A RoPE model's keys are shift-equivariant: the document read from position d has keys R(d) times those read
    from 0 in every layer, so rerotate(keys at 0, d) equals them (float64, 1e-10); negative shifts too."""
    from incontext.absorb.methods.kv_prefix import rerotate
    from incontext.models import Cache
    from incontext.models.lm import cache_kv

    model = tiny(seed=3)
    prompt, _ = prompt_and_query(m=12, seed=4)
    at_zero = cache_kv(model.prefill(prompt[None]))
    for d in (5, 17):
        cache = Cache.empty(model.config.n_layer, position=d)
        with torch.no_grad():
            model(prompt[None], cache=cache)
        for (k0, _), (kd, _) in zip(at_zero, cache_kv(cache)):
            shift = torch.full((12,), d)
            assert (rerotate(model, k0, shift) - kd).abs().max() < 1e-10
            assert (rerotate(model, kd, -shift) - k0).abs().max() < 1e-10


@pytest.mark.parametrize("m,p", [(9, 9), (20, 5), (21, 7)])
def test_document_spread_keeps_the_documents_own_kv_from_across_it(m, p):
    """init=document-spread: the prefix's values are the whole document's values at p positions spread over it (the
    first included), its keys those keys moved to the prefix's positions; at p = M it is keep-prompt exactly."""
    from incontext.absorb.methods.kv_prefix import rerotate
    from incontext.models.lm import cache_kv

    model = tiny(seed=m)
    prompt, query = prompt_and_query(m, seed=p)
    adapted = get_absorb_method("kv-prefix", prefix_tokens=p, steps=0, init="document-spread", **FAST).absorb(model, prompt)
    index = torch.linspace(0, m - 1, p, dtype=torch.float64).round().long()
    assert index[0] == 0 and len(set(index.tolist())) == p
    for (k, v), (fk, fv) in zip(adapted._tensors(), cache_kv(model.prefill(prompt[None]))):
        assert torch.equal(v, fv[:, :, index])
        assert (rerotate(model, k, index - torch.arange(p)) - fk[:, :, index]).abs().max() < 1e-10
    assert adapted.position == p
    if p == m:
        with torch.no_grad():
            assert (adapted(query) - KeepPrompt().absorb(model, prompt)(query)).abs().max() < 1e-10
    hf = HFCausalLM(to_hf_llama(model).eval()).eval()
    with pytest.raises(ValueError, match="init=document-spread"):
        get_absorb_method("kv-prefix", prefix_tokens=p, steps=0, init="document-spread", **FAST).absorb(hf, prompt)


def test_autocast_on_a_device_without_the_dtype_fails_before_the_data_stage(monkeypatch):
    """A dtype the device cannot compute in is a one-line error before the data stage's teacher decodes run."""
    from incontext import runtime
    from incontext.absorb import distill

    monkeypatch.setattr(runtime, "_supported", lambda device, dtype: "no bfloat16 here" if dtype == torch.bfloat16 else None)
    monkeypatch.setattr(distill, "study", lambda *a, **k: pytest.fail("the data stage ran before the dtype check"))
    prompt, _ = prompt_and_query(m=16, seed=3)
    with pytest.raises(ValueError, match="dtype bfloat16 is not supported on cpu: no bfloat16 here"):
        get_absorb_method("kv-prefix", **FAST, prefix_tokens=4, steps=2, autocast="bfloat16").absorb(tiny(), prompt)
