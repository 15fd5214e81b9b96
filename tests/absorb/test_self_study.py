"""The distillation data stage: deterministic, top-k targets (the full KL at k = V), and its cache on disk (reused
only when model, document and settings match; an interrupted write leaves no file under the real name)."""

import dataclasses

import pytest
import torch

pytest.importorskip("peft")

from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.study import (
    answer as study_answer, cache as study_cache, stage as study_stage, writers as study_writers,
)  # noqa: E402
from incontext.absorb.distill import distillation_kl  # noqa: E402
from incontext.absorb.study import StudyOptions, top_k_targets  # noqa: E402
from incontext.absorb.study import study as _study  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402
from incontext.models.static_decode import StaticDecoder  # noqa: E402

OPTIONS = StudyOptions(window_tokens=6, n_continuations=2, continuation_tokens=5, n_questions=0)


def tiny(seed=0, vocab=61):
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=vocab, max_seq_len=400,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    return Transformer(config).double().eval()


PROMPT = torch.randint(0, 61, (18,), generator=torch.Generator().manual_seed(1))


def study(model, prompt, queries, options, codec, generator, top_k=20, cache_dir=None, **kw):
    """study_stage.study with the options' top_k and cache given apart."""
    return _study(model, prompt, queries, dataclasses.replace(options, top_k=top_k, cache=str(cache_dir or "")), codec,
                  generator, **kw)


def run(model, tmp_path=None, seed=0, options=OPTIONS, top_k=8, prompt=PROMPT):
    return study(model, prompt, [], options, None, torch.Generator().manual_seed(seed), top_k=top_k,
                 cache_dir=tmp_path, seed=seed)


def same(a, b):
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


def test_the_stage_is_deterministic_and_keeps_the_top_k():
    model = tiny()
    (first, counts), (again, _) = run(model), run(model)
    assert same(first, again) and counts["continuations"] == 2 and counts["recall_windows"] > 0
    ids, values, index = first[0]
    assert values.shape[-1] == index.shape[-1] == 8 and (values[:, :-1] >= values[:, 1:]).all()


def test_top_k_at_the_whole_vocabulary_is_the_full_kl():
    model, student = tiny(0), tiny(1)
    full, _ = study(model, PROMPT, [], OPTIONS, None, torch.Generator().manual_seed(0), top_k=None)
    with torch.no_grad():
        assert abs(float(distillation_kl(student, full[:3]) - distillation_kl(student, top_k_targets(full[:3], 61)))) < 1e-12
        assert torch.isfinite(distillation_kl(student, top_k_targets(full[:3], 4)))


def test_the_argmax_term_is_the_cross_entropy_of_the_teachers_top_token():
    """distillation_kl with argmax_weight w: the KL plus w times the mean over taught positions of -log q(argmax p),
    against a plain loop over the sequences (float64), for top-k and whole-distribution targets alike."""
    model, student = tiny(0).double(), tiny(1).double()
    full, _ = study(model, PROMPT, [], OPTIONS, None, torch.Generator().manual_seed(0), top_k=None)
    batch = full[:3]
    with torch.no_grad():
        ce, n = 0.0, 0
        for ids, logp in batch:
            log_q = torch.log_softmax(student(ids[None])[0, -logp.shape[0]:], -1)
            ce -= float(log_q.gather(-1, logp.argmax(-1, keepdim=True)).sum())
            n += logp.shape[0]
        for targets in (batch, top_k_targets(batch, 4)):
            plain = float(distillation_kl(student, targets))
            assert abs(float(distillation_kl(student, targets, 0.5)) - (plain + 0.5 * ce / n)) < 1e-10


def test_the_cache_is_reused_only_when_everything_matches(tmp_path, monkeypatch):
    model = tiny()
    built, counts = run(model, tmp_path)
    assert not counts["cached"] and len(list(tmp_path.glob("*.safetensors"))) == 1
    calls = []
    original = study_stage.teacher_sequences
    monkeypatch.setattr(study_stage, "teacher_sequences", lambda *a, **k: calls.append(1) or original(*a, **k))
    reused, counts = run(model, tmp_path)
    assert counts["cached"] and same(reused, built) and not calls
    for changed in (dict(seed=1), dict(top_k=4), dict(options=StudyOptions(window_tokens=5, n_questions=0)),
                    dict(prompt=PROMPT[:-1])):
        assert not run(model, tmp_path, **changed)[1]["cached"]
    assert not run(tiny(seed=3), tmp_path)[1]["cached"]  # another model
    assert len(calls) == 5 and len(list(tmp_path.glob("*.safetensors"))) == 6


def test_an_interrupted_write_leaves_no_entry(tmp_path, monkeypatch):
    def broken(tensors, path):
        open(path, "wb").write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("safetensors.torch.save_file", broken)
    with pytest.raises(KeyboardInterrupt):
        run(tiny(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_both_methods_share_the_cached_stage(tmp_path):
    model = tiny()
    common = dict(steps=2, progress=False, study=dict(top_k=8, cache=str(tmp_path), window_tokens=6, n_continuations=2,
                                                      continuation_tokens=5, n_questions=0, derived=0,
                                                      reconstruction=0))
    # the same study options (kv-prefix's own defaults: derived=16, reconstruction=8)
    lora = get_absorb_method("distill-lora", **common).absorb(model, PROMPT)
    prefix = get_absorb_method("kv-prefix", prefix_tokens=4, **common).absorb(model, PROMPT)
    assert not lora.history["pool"]["cached"] and prefix.history["pool"]["cached"]


def test_seed_prompts_write_messages_the_teacher_answers():
    """Self-study conversations: with a chat template each message becomes a chat turn, without one a Q/A turn;
    seeded (the same messages twice)."""
    from test_distill_lora import CharCodec

    model = tiny(vocab=64)
    codec = CharCodec()
    prompt = torch.tensor(codec.encode("Abe was born in Rome. Abe is a baker."))
    options = StudyOptions(window_tokens=6, n_continuations=0, n_questions=0, n_conversations=3, message_tokens=6,
                           seed_prompts=("question", "creative"))
    messages = [study_writers._seed_messages(model, codec.decode(prompt.tolist()), codec, options, torch.Generator().manual_seed(5))
                for _ in range(2)]
    assert messages[0] == messages[1] and 1 <= len(messages[0]) <= 3
    sequences, counts = study(model, prompt, [], options, codec, torch.Generator().manual_seed(5), top_k=8)
    assert counts["conversations"] == len(messages[0]) and counts["chat_turns"] == counts["conversations"]
    with pytest.raises(ValueError, match="seed_prompts must be"):
        study_writers._seed_messages(model, codec.decode(prompt.tolist()), codec, StudyOptions(n_conversations=1, seed_prompts=("poetry",)),
                                  torch.Generator())


def test_distill_lora_trains_on_the_same_conversations_as_kv_prefix(tmp_path):
    """The self-study conversations are options of the one data stage: distill-lora's absorb writes them, and
    kv-prefix with the same settings reuses that cached stage (same messages, same teacher targets)."""
    from test_distill_lora import CharCodec

    model, codec = tiny(vocab=64), CharCodec()
    prompt = torch.tensor(codec.encode("Abe was born in Rome. Abe is a baker."))
    common = dict(steps=1, progress=False, study=dict(top_k=8, cache=str(tmp_path), window_tokens=6, n_continuations=0,
                                                      n_questions=0, derived=0, n_conversations=2, message_tokens=6,
                                                      seed_prompts="question,creative", reconstruction=0))
    lora = get_absorb_method("distill-lora", **common).absorb(model, prompt, codec=codec)
    prefix = get_absorb_method("kv-prefix", prefix_tokens=4, **common).absorb(model, prompt, codec=codec)
    assert lora.history["pool"]["conversations"] >= 1 and not lora.history["pool"]["cached"]
    assert prefix.history["pool"]["cached"] and prefix.history["pool"]["conversations"] == lora.history["pool"]["conversations"]
    with pytest.raises(ValueError, match="seed_prompts must be"):
        get_absorb_method("distill-lora", study=dict(seed_prompts="poetry"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_answers_equal_one_query_at_a_time(seed):
    """`_answered_batched` (queries grouped by length, chunks of `rows`) and `_answered_full_passes` (queries of any
    length right-padded together, one full pass per answer token) against the reference `_answered`, float64."""
    from incontext.models import Cache

    model = tiny(seed)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 61, (int(torch.randint(5, 30, (), generator=g)),), generator=g)
    queries = [torch.randint(0, 61, (int(torch.randint(1, 5, (), generator=g)),), generator=g) for _ in range(11)]
    n_answers = [int(torch.randint(0, 4, (), generator=g)) for _ in queries]
    with torch.no_grad():
        cache = Cache.empty(model.config.n_layer)
        model(prompt[None], cache=cache)
        reference = [study_answer._answered(model, study_answer._copy(cache), q, n) for q, n in zip(queries, n_answers)]
        batched = study_answer._answered_batched(model, cache, queries, n_answers, rows=2)
        passes = study_answer._answered_full_passes(model, cache, queries, n_answers, rows=3)  # transformers' on a GPU
        static = study_answer._answered_static(model, cache, queries, n_answers,  # ours on a GPU (here eager)
                                             StaticDecoder(model, cache, rows=4, room=8, capture=False))
    for answers in (batched, passes, static):
        assert len(answers) == len(reference)
        for (ids, logp), (ref_ids, ref_logp) in zip(answers, reference):
            assert torch.equal(ids, ref_ids) and ids.dtype == ref_ids.dtype
            assert logp.shape == ref_logp.shape and torch.allclose(logp, ref_logp, atol=1e-10, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_wording_ensemble_against_a_plain_loop(seed):
    """wording_ensemble (float64) against a loop over each question's wordings with the reference `_answered`: the
    consensus is the wording's greedy answer whose first token has the highest summed log-probability over the
    wordings; every wording is taught the mean of the wordings' log-probabilities along it, renormalised, at the
    answer positions, and keeps its own targets on the query. A question with one wording is left as it was."""
    from incontext.models import Cache

    model = tiny(seed)
    g = torch.Generator().manual_seed(seed + 10)
    prompt = torch.randint(0, 61, (20,), generator=g)
    queries = [torch.randint(0, 61, (int(torch.randint(2, 6, (), generator=g)),), generator=g) for _ in range(7)]
    groups = [0, 0, 0, 1, 1, 2, 1]  # questions 0 and 1 in several wordings (not adjacent), 2 in one
    options = StudyOptions(window_tokens=6, n_continuations=0, answer_tokens=3, wording_ensemble=True)
    (stage, counts), (plain, _) = [study(model, prompt, queries, o, None, torch.Generator().manual_seed(0), top_k=None,
                                         groups=groups) for o in (options, StudyOptions(**{**vars(options),
                                                                                           "wording_ensemble": False}))]
    assert counts["ensembled"] == 2
    with torch.no_grad():
        cache = Cache.empty(model.config.n_layer)
        model(prompt[None], cache=cache)
        own = [study_answer._answered(model, study_answer._copy(cache), q, 3) for q in queries]
        expected = list(own)
        for question in (0, 1):
            rows = [i for i, q in enumerate(groups) if q == question]
            answers = [torch.cat([own[i][0][len(queries[i]):], own[i][1][-1:].argmax(-1)]) for i in rows]
            score = [sum(float(own[j][1][len(queries[j]) - 1, a[0]]) for j in rows) for a in answers]
            best = answers[score.index(max(score))]
            forced = {i: study_answer._answered(model, study_answer._copy(cache), torch.cat([queries[i], best[:-1]]), 0)
                      for i in rows}
            mean = sum(forced[i][1][len(queries[i]) - 1:] for i in rows) / len(rows)
            poe = mean - mean.logsumexp(-1, keepdim=True)
            for i in rows:
                m = len(queries[i])
                expected[i] = (torch.cat([queries[i], best[:-1]]), torch.cat([own[i][1][: m - 1], poe]))
    answered = stage[-len(queries):]  # the training queries' sequences come last (no questions, no conversations)
    assert same(plain[: -len(queries)], stage[: -len(queries)])  # the recall windows as without the ensemble
    for (ids, logp), (ref_ids, ref_logp) in zip(answered, expected):
        assert torch.equal(ids, ref_ids) and torch.allclose(logp, ref_logp, atol=1e-10, rtol=0)
    assert same(answered[5:6], plain[-2:-1])  # the question with one wording is as without the ensemble
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(answered, plain[-len(queries):]))  # some answer changed
    first = {tuple(logp[len(q) - 1:].shape) for (ids, logp), q, gr in zip(answered, queries, groups) if gr == 0}
    assert len(first) == 1


def test_train_groups_name_one_question_per_training_query():
    model = tiny()
    method = get_absorb_method("kv-prefix", steps=1, progress=False, study=dict(n_continuations=0))
    with pytest.raises(ValueError, match="^kv-prefix: train_groups has 1 ids for 2 training queries$"):
        method.absorb(model, PROMPT, train_queries=[PROMPT[:3], PROMPT[3:6]], train_groups=[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_static_decode_gives_the_same_stage(seed, monkeypatch):
    """The whole stage (continuations sampled on the CPU from the logits of each step, training queries answered)
    decoded on a static cache (how a CUDA device decodes, here eager) against the plain decode, float64."""
    model = tiny(seed)
    g = torch.Generator().manual_seed(seed + 5)
    queries = [torch.randint(0, 61, (int(torch.randint(1, 6, (), generator=g)),), generator=g) for _ in range(7)]
    options = StudyOptions(window_tokens=6, n_continuations=3, continuation_tokens=6, answer_tokens=3)

    def stage(mode):
        return study(model, PROMPT, queries, options, None, torch.Generator().manual_seed(seed), top_k=None,
                     static_decode=mode)

    (plain, counts), (static, again) = stage("never"), stage("always")
    assert counts == again and counts["continuations"] == 3 and counts["train_queries"] == 7
    assert len(plain) == len(static)
    for (ids, logp), (ref_ids, ref_logp) in zip(static, plain):
        assert torch.equal(ids, ref_ids) and torch.allclose(logp, ref_logp, atol=1e-10, rtol=0)


def test_the_static_answers_take_fewer_rows_for_a_long_document(monkeypatch):
    """The static cache copies the document's K/V into every row: its buffers stay within STATIC_BYTES (fewer rows at a
    time, the same answers)."""
    from incontext.models import Cache

    model = tiny(0)
    queries = [torch.randint(0, 61, (3,), generator=torch.Generator().manual_seed(i)) for i in range(5)]
    seen = []
    original = study_answer.StaticDecoder.__init__

    def spy(self, model, cache, rows, room, capture):
        seen.append(rows)
        original(self, model, cache, rows, room, capture)

    monkeypatch.setattr(study_answer.StaticDecoder, "__init__", spy)
    with torch.no_grad():
        cache = Cache.empty(model.config.n_layer)
        model(PROMPT[None], cache=cache)
        wide = study_answer._answer(model, cache, queries, [2] * 5)
        k = cache.layers[0][0]
        per_row = 2 * 2 * k.shape[1] * (cache.position + 5) * k.shape[3] * k.element_size()
        monkeypatch.setattr(study_answer, "STATIC_BYTES", 2 * per_row)
        narrow = study_answer._answer(model, cache, queries, [2] * 5)
    assert seen == [5, 2] and len(wide) == len(narrow) == 5
    for (ids, logp), (ids2, logp2) in zip(wide, narrow):  # batches of other sizes: float64 rounding apart
        assert torch.equal(ids, ids2) and torch.allclose(logp, logp2, atol=1e-10, rtol=0)


# ----------------------------------------------------------------------------- documents longer than a chunk


@pytest.mark.parametrize("m, size", [(10, 4), (97, 16), (200, 48), (33, 33), (7, 2)])
def test_chunks_cover_the_document_and_hold_every_passage_of_half_a_chunk(m, size):
    spans = study_stage.chunk_spans(m, size, None)
    assert spans[0][0] == 0 and spans[-1][1] == m and all(b - a == min(size, m) for a, b in spans)
    half = max(1, size // 2)
    for start in range(m - half + 1):  # every passage of half a chunk lies whole in some chunk
        assert any(a <= start and start + half <= b for a, b in spans)
    assert study_stage.chunk_spans(m, 0, None) == [(0, m)] == study_stage.chunk_spans(m, 0, m + 1)
    assert study_stage.chunk_spans(m, 0, m)[0] == (0, m // 2)  # a document the context does not hold: half of it


def test_a_chunk_the_context_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="study.chunk_tokens=96 leaves the teacher no room within the model's context .96") as error:
        study_stage.chunk_spans(200, 96, 96)
    assert "\n" not in str(error.value)


def test_queries_go_to_the_chunk_that_holds_their_rare_tokens():
    prompt = torch.arange(60)  # every token once: chunk j alone holds its own tokens
    spans = study_stage.chunk_spans(60, 20, None)  # starts 0, 10, 20, 30, 40
    queries = [torch.tensor([1, 2, 3]), torch.tensor([52, 55, 58]), torch.tensor([25, 26, 100]), torch.tensor([100])]
    assert study_stage.assign_chunks(prompt, spans, queries) == [0, 4, 1, 0]  # ties: the first chunk


@pytest.mark.parametrize("seed", [0, 1])
def test_every_chunked_sequence_is_the_teacher_reading_its_chunk(seed):
    """A 150-token document on a model whose context holds 96: the teacher reads 48-token chunks, and each sequence's
    targets are the model's own log-probabilities after some chunk (float64, 1e-10), recall windows and answered
    queries alike; each query is taught after a chunk that holds it."""
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=96,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    model = Transformer(config).double().eval()
    prompt = torch.randint(0, 61, (150,), generator=torch.Generator().manual_seed(seed + 5))
    queries = [prompt[100:106].clone(), prompt[3:8].clone()]
    options = StudyOptions(window_tokens=8, n_continuations=3, continuation_tokens=5, answer_tokens=4)
    sequences, counts = study_stage.teacher_sequences(model, prompt, queries, options, None, torch.Generator().manual_seed(0))
    spans = study_stage.chunk_spans(150, 0, 96)
    assert counts["chunks"] == len(spans) > 1 and counts["continuations"] == 3 and counts["train_queries"] == 2
    assert counts["recall_windows"] == len(study_stage.window_starts(150, 8))
    homes = []
    with torch.no_grad():
        for ids, logp in sequences:
            n = logp.shape[0]
            errors = [float((torch.log_softmax(model(torch.cat([prompt[a:b], ids])[None])[0, -n:], -1) - logp).abs().max())
                      for a, b in spans]
            assert min(errors) < 1e-10
            homes.append(errors.index(min(errors)))
    again, _ = study_stage.teacher_sequences(model, prompt, queries, options, None, torch.Generator().manual_seed(0))
    assert same(sequences, again)
    for query in queries:  # its answered sequence: the query and 3 of its 4 answer tokens
        home, = [h for (ids, _), h in zip(sequences, homes)
                 if ids.shape[0] == query.shape[0] + 3 and torch.equal(ids[: query.shape[0]], query)]
        a, b = spans[home]
        assert query.tolist() in [prompt[s: s + query.shape[0]].tolist() for s in range(a, b - query.shape[0] + 1)]


@pytest.mark.parametrize("init", ["document", "document-spread"])
def test_kv_prefix_absorbs_a_document_longer_than_the_context(init):
    torch.manual_seed(0)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=96,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    model = Transformer(config).eval()
    prompt = torch.randint(0, 61, (150,), generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="the prompt has 150 tokens; the model's context holds 96"):
        get_absorb_method("keep-prompt").absorb(model, prompt)
    adapted = get_absorb_method("kv-prefix", init=init, steps=4, passes=0, progress=False,
                                study=dict(n_continuations=1, continuation_tokens=4, window_tokens=8)).absorb(model, prompt)
    assert adapted.position == 96 // 4 and adapted.history["pool"]["chunks"] == len(study_stage.chunk_spans(150, 0, 96)) == 6
    assert torch.isfinite(adapted(prompt[None, :10])).all()
    with pytest.raises(ValueError, match="prefix_tokens=90 and the data stage's sequences of up to 24 tokens exceed") as error:
        get_absorb_method("kv-prefix", prefix_tokens=90, init="document", steps=1, progress=False,
                          study=dict(n_continuations=0)).absorb(model, prompt)
    assert "\n" not in str(error.value)


@torch.no_grad()
def test_spread_start_of_a_long_document_is_each_chunks_own_keys_and_values():
    """init=document-spread over chunks: each prefix position holds the K/V its token has in the chunk that holds it
    most centrally, re-rotated to its prefix place (float64, 1e-10); with one chunk, the whole document's."""
    from incontext.absorb.methods.kv_prefix import rerotate, spread_prefix
    from incontext.models.lm import cache_kv

    model = tiny(2)
    prompt = torch.randint(0, 61, (60,), generator=torch.Generator().manual_seed(4))
    spans = study_stage.chunk_spans(60, 20, None)
    assert torch.equal(cache_kv(spread_prefix(model, prompt, 60, [(0, 60)]))[0][0], cache_kv(model.prefill(prompt[None]))[0][0])
    prefix = cache_kv(spread_prefix(model, prompt, 7, spans))
    index = torch.linspace(0, 59, 7, dtype=torch.float64).round().long().tolist()
    for t, i in enumerate(index):
        j = max(range(len(spans)), key=lambda c: min(i - spans[c][0], spans[c][1] - 1 - i) if spans[c][0] <= i < spans[c][1] else -1)
        a, b = spans[j]
        k, v = cache_kv(model.prefill(prompt[None, a:b]))[1]
        want = rerotate(model, k[:, :, [i - a]], torch.tensor([t - (i - a)]))
        assert float((prefix[1][0][:, :, t: t + 1] - want).abs().max()) < 1e-10
        assert float((prefix[1][1][:, :, t: t + 1] - v[:, :, [i - a]]).abs().max()) < 1e-10


def test_the_harness_and_a_direct_absorb_run_the_same_data_stage(tmp_path):
    """The tokenizer reaches the data stage through `absorb(..., codec=)` from the harness (and `incontext absorb`)
    as from Python: the harness's absorb writes the cached stage a direct absorb with the codec then reuses (same
    key: model, document, queries, settings, the tokenizer), and one without the codec does not."""
    from conftest import ByteCodec
    from test_composition import byte_model

    from incontext.harness.compare import compare
    from incontext.tasks.episodes import get_episode_source

    class Bytes(ByteCodec):  # the random model writes any byte: decoded leniently
        def decode(self, ids):
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    model, codec = byte_model(torch.float32), Bytes()
    source = get_episode_source("facts", people=1)
    episode = source.episodes(1, seed=0, tokenizer=codec)[0]
    fast = {"steps": 1, "progress": False, "study.n_continuations": 0, "study.window_tokens": 64, "study.n_questions": 1,
            "study.cache": str(tmp_path)}
    compare(model, source, [episode], {"kv-prefix": fast}, progress=False, references=False, codec=codec)
    method = get_absorb_method("kv-prefix", **fast)
    pool = method.absorb(model, episode.prompt, train_queries=list(episode.train_queries), codec=codec).history["pool"]
    assert pool["cached"]  # the stage the harness wrote, with the tokenizer
    bare = method.absorb(model, episode.prompt, train_queries=list(episode.train_queries)).history["pool"]
    assert not bare["cached"] and bare["questions"] == 0
    # a method without a data stage takes the codec and ignores it; a codec that is no tokenizer is one line
    dropped = get_absorb_method("drop-prompt").absorb(model, episode.prompt, codec=codec)
    assert torch.equal(dropped(episode.prompt[None, :5]), model(episode.prompt[None, :5]))
    with pytest.raises(ValueError, match="^kv-prefix: the codec must be a tokenizer with encode and decode, got int$"):
        method.absorb(model, episode.prompt, codec=3)


def test_every_method_gets_the_one_input():
    """absorb() hands every method's _absorb one AbsorbInput: the checked prompt (batched), the loss mask, the training
    queries, their groups and the codec, whatever the method reads of it."""
    from incontext.absorb import AbsorbInput, AbsorbMethod, get_absorb_method
    from incontext.absorb.protocol import METHODS

    seen = []

    class Spy(AbsorbMethod):
        name = "spy-one-input"

        def _absorb(self, model, given):
            seen.append(given)
            return get_absorb_method("drop-prompt")._absorb(model, given)

    try:
        model, codec = tiny(vocab=64), object()
        queries = [torch.tensor([1, 2]), torch.tensor([3])]
        Spy().absorb(model, torch.tensor([4, 5, 6]), loss_mask=torch.tensor([True, False, True]), train_queries=queries,
                     train_groups=[0, 0], codec=None)
        [given] = seen
        assert isinstance(given, AbsorbInput) and given.prompt.tolist() == [[4, 5, 6]]
        assert given.loss_mask.tolist() == [[True, False, True]] and given.train_queries is queries
        assert given.train_groups == [0, 0] and given.codec is None and codec is not None
    finally:
        METHODS.unregister("spy-one-input")


def test_a_cached_stage_is_reused_only_with_the_same_tokenizer(tmp_path):
    """The tokenizer is one of the settings: a stage written with one chat template is not read back for another
    (its chat turns would differ), nor for none; the same tokenizer again reads it back."""
    from test_distill_lora import CharCodec

    class OtherTemplate(CharCodec):
        def chat(self, messages, add_generation_prompt=False):
            return "".join(f"[{m['role'][0]}]{m['content']}|" for m in messages) + ("[a]" if add_generation_prompt else "")

    model = tiny(vocab=64)
    prompt = torch.tensor(CharCodec().encode("Abe was born in Rome. Abe is a baker."))

    def pool(codec):
        return study(model, prompt, [], OPTIONS, codec, torch.Generator().manual_seed(0), top_k=8,
                     cache_dir=tmp_path, seed=0)[1]["cached"]

    assert [pool(CharCodec()), pool(CharCodec()), pool(OtherTemplate()), pool(None), pool(OtherTemplate())] == \
        [False, True, False, False, True]
    assert study_cache.tokenizer_fingerprint(None) is None
    assert study_cache.tokenizer_fingerprint(CharCodec()) == study_cache.tokenizer_fingerprint(CharCodec())


def test_the_windows_only_ablation_trains_on_windows_of_the_document_alone():
    """kv-prefix:windows-only (n_continuations=0, answer_tokens=0) on a `facts` episode at the task's defaults: the
    task gives no training query, so every training sequence is a window of the document (no query, no question),
    and the teacher's targets are the prompted model's log-probabilities reading the window after the document."""
    from conftest import ByteCodec

    from incontext.tasks.episodes import get_episode_source

    episode = get_episode_source("facts", people=1).episodes(1, seed=0, tokenizer=ByteCodec())[0]
    assert episode.train_queries == []
    model = tiny(vocab=256)
    options = StudyOptions(window_tokens=24, n_continuations=0, answer_tokens=0, n_questions=0)
    sequences, counts = study(model, episode.prompt, episode.train_queries, options, ByteCodec(),
                              torch.Generator().manual_seed(0), top_k=None)
    prompt = episode.prompt.tolist()
    assert counts["recall_windows"] == len(sequences) > 0 and counts.get("train_queries", 0) == 0
    for ids, teacher in sequences:
        ids = ids.tolist()
        starts = [s for s in range(len(prompt) - len(ids) + 1) if prompt[s:s + len(ids)] == ids]
        assert starts, "a training sequence that is not a window of the document"
        with torch.no_grad():
            full = torch.log_softmax(model(torch.tensor(prompt + ids)[None])[0, len(prompt):].double(), -1)
        assert torch.allclose(teacher.double(), full[-teacher.shape[0]:], atol=1e-9)


@pytest.mark.parametrize("length, context", [(40, 96), (150, 96)])
def test_the_stage_cut_as_made_is_the_stage_cut_at_the_end(length, context):
    """teacher_sequences(top_k=k) (windows and reconstruction pieces cut to top-k as they are read, the way `study`
    builds its stage) equals top_k_targets of the full stage, bit for bit, in one chunk and in several."""
    torch.manual_seed(3)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61,
                               max_seq_len=context, positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    model = Transformer(config).eval()
    prompt = torch.randint(0, 61, (length,), generator=torch.Generator().manual_seed(4))
    options = StudyOptions(window_tokens=4, n_continuations=2, continuation_tokens=5, answer_tokens=4)
    queries = [prompt[10:16].clone()]
    with torch.no_grad():
        full, counts = study_stage.teacher_sequences(model, prompt, queries, options, None, torch.Generator().manual_seed(0))
        cut, again = study_stage.teacher_sequences(model, prompt, queries, options, None, torch.Generator().manual_seed(0),
                                                   top_k=5)
    late, made = top_k_targets(full, 5), top_k_targets(cut, 5)  # study cuts the other kinds at the end
    assert counts == again and counts["recall_windows"] > 16 and len(made) == len(late)
    assert sum(len(item) == 3 for item in cut) == counts["recall_windows"] + counts["reconstruction"]
    assert all(len(a) == len(b) == 3 and all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(made, late))
