import math
import statistics

import pytest
import torch

from conftest import ByteCodec
from incontext.absorb import get_absorb_method
from incontext.harness.compare import agreement, compare
from incontext.tasks.metrics import get_metric


def score_query(metric, out, query, calibration=None):
    return get_metric(metric).score_query(out, query, calibration)


def episode_score(metric, scores):
    return get_metric(metric).episode_score(scores)
from incontext.models import Transformer, TransformerConfig
from incontext.tasks import get_task
from incontext.tasks.episodes import Episode, Query, get_episode_source


def tiny(attention="softmax", vocab=256, **kw):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(n_layer=2, d_model=32, n_head=4, vocab_size=vocab, attention=attention,
                                         positions="rope", max_seq_len=2048, **kw)).eval()


def facts_episodes(n=3, people=1):
    return get_episode_source("facts", people=people).episodes(n, seed=0, tokenizer=ByteCodec())


def rows_by_method(rows):
    return {row["method"]: row for row in rows}


def test_keep_prompt_is_the_prompted_model_and_drop_prompt_the_unprompted_one():
    model = tiny()
    episodes = facts_episodes(2)
    rows = rows_by_method(compare(model, get_episode_source("facts"), episodes, {}, progress=False))
    assert rows["keep-prompt"]["agreement"] == {"top1": 1.0, "kl": 0.0, "relative_logits_error": 0.0, "relative_logits_error_std": 0.0}
    # the reference itself, written out: the query read after the prompt, and the query alone
    relative = []
    for episode in episodes:
        m = episode.prompt.shape[0]
        for q in episode.queries:
            full = model(torch.cat([episode.prompt, q.inputs])[None])[0, m:]
            kept = get_absorb("keep-prompt").absorb(model, episode.prompt)(q.inputs[None])[0]
            assert torch.allclose(kept, full, atol=1e-5, rtol=0)
            dropped = get_absorb("drop-prompt").absorb(model, episode.prompt)(q.inputs[None])[0]
            assert torch.equal(dropped, model(q.inputs[None])[0])
            relative.append(float((dropped.double() - full.double()).norm() / full.double().norm()))
    assert rows["drop-prompt"]["agreement"]["relative_logits_error"] > 1e-3  # the prompt matters in this model
    # per query: the Frobenius relative error of its logits; the row: their mean and sample std
    assert math.isclose(rows["drop-prompt"]["agreement"]["relative_logits_error"], statistics.fmean(relative), rel_tol=1e-5)
    assert math.isclose(rows["drop-prompt"]["agreement"]["relative_logits_error_std"], statistics.stdev(relative), rel_tol=1e-4)


def get_absorb(name, **options):
    from incontext.absorb import get_absorb_method

    return get_absorb_method(name, **options)


def test_iclca_on_a_linear_model_agrees_with_the_prompted_model():
    task = get_task("induction", seq_len=32)
    model = tiny("linear", vocab=task.model_io()["vocab_size"])
    source = get_episode_source("induction")
    episodes = source.episodes(6, seed=1, task=task)
    assert len(episodes) == 6 and all(bool(e.queries[0].mask.any()) for e in episodes)
    rows = rows_by_method(compare(model, source, episodes, {"iclca": {}, "iclca-approx": {}}, progress=False))
    iclca = rows["iclca"]
    assert iclca["status"] == "ok" and iclca["agreement"]["relative_logits_error"] < 1e-5
    assert iclca["agreement"]["top1"] == 1.0 and iclca["agreement"]["kl"] < 1e-9
    assert iclca["score"]["mean"] == rows["keep-prompt"]["score"]["mean"]
    assert rows["iclca-approx"]["status"] == "n/a" and "softmax" in rows["iclca-approx"]["reason"]
    correct = positions = 0  # pooled accuracy by hand: all scored positions of all episodes
    with torch.no_grad():
        for e in episodes:
            (q,) = e.queries
            out = model(torch.cat([e.prompt, q.inputs])[None])[0, e.prompt.shape[0]:]
            correct += int((out.argmax(-1) == q.targets)[q.mask].sum())
            positions += int(q.mask.sum())
    assert iclca["score_pooled"] == pytest.approx(correct / positions, abs=1e-12)
    for row in rows.values():
        if row["status"] == "ok":  # every kept state is measured: the prompt's own for all but drop-prompt
            assert row["query_ms"] > 0 and (row["kept_bytes"] > 0) == (row["method"] != "drop-prompt")
    assert iclca["absorb_ms"] > 0  # the conversion is measured, not defaulted


def test_inapplicable_and_failing_methods_are_reported_not_raised():
    model = tiny()
    rows = rows_by_method(compare(model, get_episode_source("facts"), facts_episodes(2),
                                  {"iclca": {}, "cgt-fold": {}, "dynamic-eval": {"learning_rate": 1e30}}, progress=False))
    assert rows["iclca"]["status"] == "n/a" and "linear" in rows["iclca"]["reason"]
    assert rows["cgt-fold"]["status"] == "n/a" and "CGT" in rows["cgt-fold"]["reason"]
    assert rows["dynamic-eval"]["status"] == "failed" and "the update exploded" in rows["dynamic-eval"]["reason"]


def test_unknown_method_and_option_are_refused_before_any_work():
    model = tiny()
    with pytest.raises(KeyError, match="registered"):
        compare(model, get_episode_source("facts"), facts_episodes(1), {"no-such-method": {}}, progress=False)
    with pytest.raises(ValueError, match="dynamic-eval: unknown option 'no_such_option'; options: learning_rate"):
        compare(model, get_episode_source("facts"), facts_episodes(1), {"dynamic-eval": {"no_such_option": 1}}, progress=False)


def test_scoring_by_hand():
    vocab = 5
    logits = torch.full((3, vocab), -10.0)
    logits[0, 1] = logits[1, 2] = logits[2, 4] = 10.0  # argmax 1, 2, 4
    q = Query(inputs=torch.tensor([0, 1, 2]), targets=torch.tensor([1, 2, 3]), mask=torch.tensor([False, True, True]))
    s = score_query("exact", logits, q)
    assert s.exact == 0.0 and s.correct == 1.0 and s.total == 2  # position 1 right, position 2 wrong
    log_p = torch.log_softmax(logits.double(), -1)
    assert math.isclose(s.logprob, float(log_p[1, 2] + log_p[2, 3]), rel_tol=1e-12)
    q_right = Query(inputs=torch.tensor([0, 1, 2]), targets=torch.tensor([1, 2, 4]), mask=torch.tensor([False, True, True]))
    assert score_query("exact", logits, q_right).exact == 1.0
    assert episode_score("exact", [s, score_query("exact", logits, q_right)])["score"] == 0.5
    assert episode_score("accuracy", [s, score_query("accuracy", logits, q_right)])["score"] == 3 / 4
    ce = episode_score("ce", [s])["score"]
    assert math.isclose(ce, -float(log_p[1, 2] + log_p[2, 3]) / 2, rel_tol=1e-12)
    # choice: candidates 3 and 4 at the last masked position; 4 wins plainly, 3 after calibration
    choice = Query(inputs=torch.tensor([0, 1, 2]), targets=torch.tensor([0, 0, 3]), mask=torch.tensor([False, False, True]),
                   choices=torch.tensor([3, 4]))
    calibration = torch.tensor([-30.0, 0.0], dtype=torch.float64)
    c = score_query("choice", logits, choice, calibration)
    assert c.correct == 0.0 and c.calibrated == 1.0 and c.total == 1
    # mse on vectors
    out = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    vq = Query(inputs=torch.zeros(2, 3), targets=torch.tensor([[0.0, 0.0], [3.0, 4.0]]), mask=torch.tensor([True, True]))
    assert math.isclose(episode_score("mse", [score_query("mse", out, vq)])["score"], ((1 + 4) / 2 + (9 + 16) / 2) / 2)


def test_pooled_score_weights_episodes_by_their_positions():
    from incontext.harness.compare import MethodRecord

    record = MethodRecord("m", {}, episode_scores=[{"score": 1.0}, {"score": 0.0}], episode_positions=[3, 1],
                          absorb_ms=[1.0, 1.0], query_ms=[1.0], kept_bytes=[0, 0], peak_bytes=[None, None])
    row = record.summary("accuracy")
    assert row["score"]["mean"] == 0.5 and row["score_pooled"] == 0.75
    assert "score_pooled" not in record.summary("choice")


def test_agreement_by_hand():
    ref = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    out = torch.tensor([[0.0, 2.0, 0.0], [0.0, 1.0, 0.0]])
    q = Query(inputs=torch.tensor([0, 1]), targets=torch.tensor([0, 1]), mask=torch.tensor([True, True]))
    a = agreement(out, ref, q, tokens=True)
    p, r = torch.log_softmax(ref.double(), -1), torch.log_softmax(out.double(), -1)
    assert a["top1_sum"] == 1.0 and a["positions"] == 2
    assert math.isclose(a["kl_sum"], float((p.exp() * (p - r)).sum()), rel_tol=1e-12)
    assert math.isclose(a["relative"], float((out - ref).norm() / ref.norm()), rel_tol=1e-6)


def test_prompt_errors_are_one_line():
    model = tiny()
    method = get_absorb("keep-prompt")
    with pytest.raises(ValueError, match="empty"):
        method.absorb(model, torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="context holds 2048"):
        method.absorb(model, torch.zeros(2048, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids"):
        method.absorb(model, torch.zeros(4))
    with pytest.raises(ValueError, match="loss_mask"):
        get_absorb("dynamic-eval").absorb(model, torch.zeros(4, dtype=torch.long), loss_mask=torch.ones(3, dtype=torch.bool))


def test_a_batch_of_prompts_equals_one_at_a_time():
    model = tiny()
    prompts = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(0))
    queries = torch.randint(0, 256, (3, 4), generator=torch.Generator().manual_seed(1))
    for name, options in (("keep-prompt", {}), ("dynamic-eval", {"learning_rate": 1e-2})):
        method = get_absorb(name, **options)
        together = method.absorb(model, prompts)(queries)
        for i in range(3):
            alone = method.absorb(model, prompts[i])(queries[i : i + 1])[0]
            assert torch.allclose(together[i], alone, atol=1e-5, rtol=0)


def test_dynamic_eval_loss_mask_selects_the_trained_tokens():
    model = tiny()
    prompt = torch.randint(0, 256, (10,), generator=torch.Generator().manual_seed(0))
    method = get_absorb("dynamic-eval", learning_rate=1e-2)
    none = torch.zeros(10, dtype=torch.bool)
    with pytest.raises(ValueError, match="selects nothing"):
        method.absorb(model, prompt, loss_mask=none)
    only_last = none.clone()
    only_last[-1] = True
    adapted = method.absorb(model, prompt, loss_mask=only_last)
    # the same step, written out: SGD on the last token's cross-entropy only
    import copy

    reference = copy.deepcopy(model)
    logits = reference(prompt[None])[0]
    loss = torch.nn.functional.cross_entropy(logits[-2:-1], prompt[-1:], reduction="sum")
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    with torch.no_grad():
        for p, g in zip(reference.parameters(), grads):
            p -= 1e-2 * g
    query = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    assert torch.allclose(adapted(query), reference(query, position_offset=10), atol=1e-5, rtol=0)


def test_episodes_with_vector_inputs():
    task = get_task("linear_regression", d_in=3, n_points=8)
    source = get_episode_source("linear_regression")
    episodes = source.episodes(4, seed=0, task=task)
    assert all(e.prompt.shape[0] % 2 == 0 for e in episodes)  # whole (x, y) pairs
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(n_layer=1, d_model=16, n_head=2, d_input=task.model_io()["d_input"],
                                          d_output=task.model_io()["d_output"], attention="linear", positions="rope")).eval()
    rows = rows_by_method(compare(model, source, episodes, {"iclca": {}}, progress=False))
    assert rows["iclca"]["agreement"]["top1"] is None and rows["iclca"]["agreement"]["relative_logits_error"] < 1e-5
    assert rows["iclca"]["score"]["mean"] == pytest.approx(rows["keep-prompt"]["score"]["mean"], rel=1e-4)
    with pytest.raises(ValueError, match="trained on 'linear_regression'"):
        source.episodes(2, task=get_task("induction"))
    with pytest.raises(ValueError, match="needs a model trained"):
        source.episodes(2)


def test_episode_of_text_tasks_need_a_tokenizer():
    with pytest.raises(ValueError, match="needs a tokenizer"):
        get_episode_source("facts").episodes(1)
    with pytest.raises(KeyError, match="facts"):
        get_episode_source("no-such-task")
    with pytest.raises(ValueError, match=r"task 'facts': FactsConfig: unknown key\(s\) \['colour'\]; allowed keys: \['people', 'format', 'documents', 'questions', 'placement'\]"):
        get_episode_source("facts", colour=1)
    assert isinstance(facts_episodes(1)[0], Episode)


def test_a_prompt_longer_than_the_context_stops_the_comparison_in_one_line():
    model = tiny()
    model.config.max_seq_len = 64  # the facts prompts are ~150 bytes
    with pytest.raises(ValueError, match="keep-prompt failed on episode 0: ValueError: the prompt has .* context holds 64"):
        compare(model, get_episode_source("facts"), facts_episodes(1), {}, progress=False)


def test_no_applicable_method_is_a_one_line_error_not_a_crash():
    model = tiny()
    with pytest.raises(ValueError, match="no compared method applies to this model .*iclca: "):
        compare(model, get_episode_source("facts"), facts_episodes(1), {"iclca": {}}, progress=False, references=False)


def test_a_cgt_is_its_own_prompted_reference():
    """keep-prompt on a CGT is the CGT's forward over prompt and query (it has no cache): agreement is measured."""
    from incontext.absorb.methods.reference import PromptPrepended
    from incontext.models import CGT, CGTConfig

    torch.manual_seed(0)
    model = CGT(CGTConfig(vocab_size=11, n_layer=2, split_layer=1, d_x=8, n_head_x=2, d_y=4, n_head_y=1,
                          rank=2, n_templates=2, max_seq_len=16)).eval()
    prompt, query = torch.randint(0, 11, (1, 5)), torch.randint(0, 11, (1, 3))
    adapted = get_absorb_method("keep-prompt").absorb(model, prompt)
    assert isinstance(adapted, PromptPrepended)
    assert torch.equal(adapted(query), model(torch.cat([prompt, query], 1))[:, 5:])
    assert get_absorb_method("drop-prompt").unsupported(model) is None


def test_no_training_query_reaches_a_method_by_default_for_any_task():
    """Every text task gives the methods the document alone unless its options ask for training questions: each
    absorb of a compare run receives no train_queries (recorded by a method that learns from them)."""
    from incontext.absorb.protocol import AbsorbMethod

    seen = []

    class Spy(AbsorbMethod):
        name = "spy-train-queries"
        takes_codec = True

        def _absorb(self, model, given):
            train_queries, train_groups = given.train_queries, given.train_groups
            seen.append((list(train_queries or []), train_groups))
            return get_absorb("keep-prompt")._absorb(model, given)

    try:
        model = tiny()
        for task, options in (("facts", {}), ("facts", {"documents": 2, "people": 2}), ("continuation", {"prompt_tokens": 32, "query_tokens": 8})):
            source = get_episode_source(task, **options)
            episodes = source.episodes(2, seed=0, tokenizer=ByteCodec())
            rows = rows_by_method(compare(model, source, episodes, {"spy-train-queries": {}}, progress=False))
            assert rows["spy-train-queries"]["status"] == "ok" and "trained_on_questions" not in rows["spy-train-queries"]
            assert "keep-prompt (wording consensus)" not in rows
        assert seen and all(queries == [] and groups is None for queries, groups in seen)
    finally:
        from incontext.absorb import protocol as base
        base.METHODS.unregister("spy-train-queries")


def test_the_wording_consensus_reference_by_hand():
    """With training questions the harness adds keep-prompt answering each question with its wordings' consensus:
    at each answer position the prompted model's log-probabilities after the question's own wording and after each
    of its training wordings (read with the answer, teacher-forced), averaged and renormalised."""
    import torch.nn.functional as F

    model = tiny()
    source = get_episode_source("facts", people=1, questions="paraphrases:2")
    episodes = source.episodes(2, seed=0, tokenizer=ByteCodec())
    rows = compare(model, source, episodes, {"distill-lora": {"steps": 1, "passes": 0, "progress": False}}, progress=False,
                   codec=ByteCodec())
    assert [r["method"] for r in rows][:3] == ["keep-prompt", "keep-prompt (wording consensus)", "drop-prompt"]
    by = rows_by_method(rows)
    assert by["distill-lora"]["trained_on_questions"] is True
    assert "trained_on_questions" not in by["keep-prompt"] and "trained_on_questions" not in by["keep-prompt (wording consensus)"]
    metric = get_metric("exact")
    scores, kl = [], []
    for episode in episodes:
        kept = get_absorb("keep-prompt").absorb(model, episode.prompt)
        per = []
        for query, group in zip(episode.queries, episode.query_groups):
            n = int(query.mask.sum())
            answer = query.targets[-n:]
            wordings = [query.inputs] + [torch.cat([w, answer[:-1]]) for w, g in zip(episode.train_queries, episode.train_groups)
                                         if g == group]
            assert len(wordings) == 1 + 1 + 2  # its own, the statement start and two paraphrases
            logp = torch.stack([F.log_softmax(kept(w[None])[0, -n:].double(), -1) for w in wordings])
            out = kept(query.inputs[None])[0].double().clone()
            out[-n:] = F.log_softmax(logp.mean(0), -1) + torch.logsumexp(out[-n:], -1, keepdim=True)
            per.append(metric.score_query(out, query))
            p = F.log_softmax(kept(query.inputs[None])[0][query.mask].double(), -1)
            kl.append(float((p.exp() * (p - F.log_softmax(out[query.mask], -1))).sum() / n))
        scores.append(metric.episode_score(per)["score"])
    row = by["keep-prompt (wording consensus)"]
    assert row["score"]["mean"] == pytest.approx(statistics.fmean(scores), abs=1e-12)
    assert row["agreement"]["kl"] > 0  # it is not the prompted model's own answer
    assert row["agreement"]["relative_logits_error"] < 0.5  # on the logits' scale: compared like with like
    assert row["kept_bytes"] == by["keep-prompt"]["kept_bytes"]


def test_every_row_has_its_costs():
    """Costs are measured, not defaulted: positive absorb time for a method that trains, query time for every row,
    kept bytes that are the prompt's K/V cache for keep-prompt and nothing for drop-prompt."""
    model = tiny()
    rows = rows_by_method(compare(model, get_episode_source("facts"), facts_episodes(2),
                                  {"dynamic-eval": {"learning_rate": 1e-4}}, progress=False))
    assert rows["dynamic-eval"]["absorb_ms"] > 0 and all(r["query_ms"] > 0 for r in rows.values())
    assert rows["drop-prompt"]["kept_bytes"] == 0
    per_token = 2 * model.config.n_layer * model.config.d_model * 4  # K and V, float32
    assert rows["keep-prompt"]["kept_bytes"] >= per_token * min(e.prompt.shape[0] for e in facts_episodes(2))


def test_per_episode_question_records_and_the_derived_split_by_hand():
    """compare(per_episode=True) keeps each asked question's record: its text, the gold answer, right or wrong (the
    episode's score is their mean), and for a method whose data stage derived queries from the document, whether the
    question or its fact's cloze was among the queries it trained on (read again here from the method's own absorb);
    by_derived adds up the right answers on either side."""
    from incontext.absorb.study import cloze, document_text

    model, codec = tiny(), ByteCodec()
    source = get_episode_source("facts", people=2)
    episodes = source.episodes(2, seed=0, tokenizer=codec)
    options = {"steps": 1, "passes": 0, "progress": False, "heldout": 0}
    rows = rows_by_method(compare(model, source, episodes, {"kv-prefix": options}, progress=False, codec=codec,
                                  per_episode=True))
    for name in ("keep-prompt", "kv-prefix"):
        row = rows[name]
        assert [len(e) for e in row["questions"]] == [len(e.queries) for e in episodes]
        for records, score, episode in zip(row["questions"], row["episode_scores"], episodes):
            assert statistics.fmean(r["right"] for r in records) == pytest.approx(score["score"])
            for record, query in zip(records, episode.queries):
                first = int(query.mask.nonzero()[0])
                assert record["question"] == codec.decode(query.inputs[: first + 1].tolist()).strip()
                assert record["answer"] == codec.decode(query.targets[query.mask].tolist()).strip()
    assert "asked_derived" not in rows["keep-prompt"]["questions"][0][0] and rows["keep-prompt"]["by_derived"] is None
    covered = 0
    for records, episode in zip(rows["kv-prefix"]["questions"], episodes):
        derived = get_absorb("kv-prefix", **options).absorb(model, episode.prompt, codec=codec).history["derived_queries"]
        assert derived and len(derived) <= 16
        text = document_text(codec, episode.prompt.flatten().tolist())
        for record in records:
            assert record["asked_derived"] == (record["question"] in {d.strip() for d in derived})
            assert record["cloze_derived"] == (cloze(text, record["answer"]) in {d.strip() for d in derived})
            covered += record["asked_derived"] or record["cloze_derived"]
    split = rows["kv-prefix"]["by_derived"]
    assert split["covered"]["asked"] == covered and split["covered"]["asked"] + split["not_covered"]["asked"] == 14
    assert split["covered"]["right"] + split["not_covered"]["right"] == sum(
        r["right"] for e in rows["kv-prefix"]["questions"] for r in e)


def test_cloze_is_the_sentence_up_to_the_answer():
    from incontext.absorb.study import cloze

    text = "Ada was born in Paris. She wrote about engines!\nBob has two cats"
    assert cloze(text, "Paris") == "Ada was born in"
    assert cloze(text, "engines") == "She wrote about"
    assert cloze(text, "two cats") == "Bob has"
    assert cloze(text, "Ada") is None and cloze(text, "Rome") is None and cloze(text, "") is None


def test_the_row_counts_the_episodes_whose_training_keep_start_undid():
    """kv-prefix with keep_start: the row's kept_start_episodes is the number of episodes whose absorb undid its
    training (each absorb's history, read again here); a row without keep_start has no such field."""
    model, codec = tiny(), ByteCodec()
    source = get_episode_source("facts", people=2)
    episodes = source.episodes(2, seed=0, tokenizer=codec)
    options = {"steps": 2, "passes": 0, "progress": False, "learning_rate": 3.0, "study.n_continuations": 2}
    rows = rows_by_method(compare(model, source, episodes, {"kv-prefix:keep": {**options, "keep_start": True},
                                                            "kv-prefix": options}, progress=False, codec=codec))
    undone = sum(get_absorb("kv-prefix", **options, keep_start=True).absorb(model, e.prompt, codec=codec)
                 .history["kept_start"] for e in episodes)
    assert rows["kv-prefix:keep"]["kept_start_episodes"] == undone
    assert "kept_start_episodes" not in rows["kv-prefix"]
