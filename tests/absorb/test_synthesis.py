"""Synthesis from the document alone: queries derived from its text by rules (seeded, spread, distinct, each kind as
it should be) and the grounding filter (the answer's words in the document; the teacher's first answer token likelier
with the document than without, against a plain loop)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_distill_lora import CharCodec
from test_self_study import tiny

from incontext.absorb.study import answer as study_answer, derived as study_derived, writers as study_writers
from incontext.absorb.study import StudyOptions, derived_queries, grounded, study
from incontext.models import Cache

DOC = "The meeting is on Tuesday at 10:30 in Room B. Alice Brown chairs it. The budget is 4,500 euros."


def derive(text=DOC, kinds="prefix,about,qa", limit=100, seed=0):
    return derived_queries(text, kinds, limit, torch.Generator().manual_seed(seed))


def test_derived_queries_are_seeded_distinct_and_within_the_limit():
    every = derive()
    assert derive(seed=3) == derive(seed=3) and len(set(every)) == len(every) == 12
    assert sorted(derive(seed=3)) == sorted(every)  # the seed orders, the limit chooses
    for limit in range(1, 14):
        assert len(derive(limit=limit, seed=limit)) == min(limit, 12)
    own = [set(derive(sentence)) for sentence in study_derived._sentences(DOC)]
    picked = [next(i for i, queries in enumerate(own) if q in queries) for q in derive(limit=3, seed=5)]
    assert picked == [0, 1, 2]  # three queries: one from each sentence, in the document's order
    assert derive(limit=0) == [] and derive("") == []


def test_each_kind_derives_what_it_should():
    prefixes = {"The meeting is on": "Tuesday", "The meeting is on Tuesday at": "10:30",
                "The meeting is on Tuesday at 10:30 in": "Room B", "Alice Brown": "chairs", "The budget is": "4,500",
                "The budget is 4,500": "euros"}
    assert set(derive(kinds="prefix")) == set(prefixes)
    for prefix, span in prefixes.items():  # the query stops right before its span
        assert any(s.startswith(prefix + " " + span) for s in study_derived._sentences(DOC))
    assert set(derive(kinds="about")) == {f"Q: What does the text say about {n}?\nA:" for n in
                                          ("Tuesday", "Room B", "Alice Brown")}
    assert set(derive(kinds="qa")) == {"Q: When is the meeting?\nA:", "Q: Who chairs it?\nA:", "Q: What is the budget?\nA:"}
    rules = {"Bob has 3 cats named Tom.": "How many cats does Bob have?",
             "The Eiffel Tower was completed in 1889.": "When was the Eiffel Tower completed?",
             "Ada was born in London.": "Where was Ada born?", "The shop closes on Sunday.": "When does the shop close?"}
    for text, question in rules.items():
        assert f"Q: {question}\nA:" in derive(text, "qa")


def test_no_query_without_a_matching_sentence():
    assert derive("it rained all day. we stayed home.", "about,qa") == []
    assert derive("Hi. Ok.", "prefix") == [] and derive("It is late. This is it.", "qa") == []


def test_bad_kinds_are_refused_in_one_line():
    for bad in ("prefix,poem", ""):
        with pytest.raises(ValueError, match="derived_kinds must be a comma-separated subset of prefix,about,qa") as e:
            StudyOptions(derived_kinds=bad)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="derived_kinds"):
        derive(kinds="rhyme")


def test_the_text_test_of_grounding():
    for answer in (" Alice Brown.", "4,500", " on TUESDAY", " room", " 10"):
        assert grounded(answer, DOC), answer
    for answer in ("", " the", " is it", " Paris", " at 9", " euro", " Brownie"):
        assert not grounded(answer, DOC), answer


def reference_gains(model, rows):
    """For each (ids with the document, ids without it): the greedy first answer token with the document and its
    log-prob with the document minus without, by a plain loop."""
    out = []
    with torch.no_grad():
        for teacher, student in rows:
            with_doc = F.log_softmax(model(torch.tensor([teacher])), -1)[0, -1]
            first = int(with_doc.argmax())
            out.append((first, float(with_doc[first] - F.log_softmax(model(torch.tensor([student])), -1)[0, -1, first])))
    return out


def test_the_filter_keeps_answers_the_document_makes_likelier(monkeypatch):
    """_grounded_rows on plain Q/A answers and chat turns: kept exactly where the gain of a plain loop exceeds the
    margin (with the text test passed), and where the text test passes (any gain)."""
    model, codec = tiny(vocab=64), CharCodec()
    text = DOC.replace(",", "")
    prompt = torch.tensor(codec.encode(text))
    questions = ["Q: When is the meeting?\nA:", "Q: Who chairs it?\nA:", "Q: What is the budget?\nA:", "The budget is",
                 "Q: Where is Room B?\nA:", "The meeting is on"]
    queries = [torch.tensor(codec.encode(q)) for q in questions]
    cache = Cache.empty(model.config.n_layer)
    with torch.no_grad():
        model(prompt[None], cache=cache)
        plain = study_answer._answer(model, cache, queries, [4] * len(queries))
        chat = study_writers._chat_turns(model, prompt, [q[3:-3] for q in questions[:3]], 200, codec, 5)
    items = plain + chat
    starts = [q.shape[0] - 1 for q in queries] + [ids.shape[0] - logp.shape[0] for ids, logp in chat]
    rows = [(prompt.tolist() + q.tolist(), q.tolist()) for q in queries]
    rows += [(codec.encode(codec.chat([{"role": "user", "content": f"{text}\n\n{q[3:-3]}"}], add_generation_prompt=True)),
              codec.encode(codec.chat([{"role": "user", "content": q[3:-3]}], add_generation_prompt=True))) for q in questions[:3]]
    reference = reference_gains(model, rows)
    answers = [torch.cat([ids[a + 1:], logp[-1:].argmax(-1)]).tolist() for (ids, logp), a in zip(items, starts)]
    assert [answer[0] for answer in answers] == [first for first, _ in reference]
    gains = sorted(gain for _, gain in reference)
    margin = (gains[len(gains) // 2 - 1] + gains[len(gains) // 2]) / 2
    monkeypatch.setattr(study_writers, "GROUNDED_MARGIN", margin)
    monkeypatch.setattr(study_writers, "grounded", lambda answer, document: True)
    kept = study_writers._grounded_rows(model, codec, text, items, starts)
    assert kept == [gain > margin for _, gain in reference] and True in kept and False in kept
    monkeypatch.undo()
    monkeypatch.setattr(study_writers, "GROUNDED_MARGIN", -float("inf"))
    assert study_writers._grounded_rows(model, codec, text, items, starts) == [
        grounded(codec.decode([t for t in answer if t != codec.eos_token_id]), text) for answer in answers]


def test_study_with_derived_queries_is_seeded_and_counts_them():
    model, codec = tiny(vocab=64), CharCodec()
    prompt = torch.tensor(codec.encode("The meeting is on Tuesday at 10:30 in Room B. Alice Brown chairs it. Bob has 3 cats."))
    options = StudyOptions(window_tokens=8, n_continuations=0, answer_tokens=3, chat_answer_tokens=4, derived=6, top_k=None)

    def run(o=options, seed=1):
        return study(model, prompt, [], o, codec, torch.Generator().manual_seed(seed))

    (first, counts), (again, _) = run(), run()
    assert counts["derived"] == 6 and counts["chat_turns"] == 4  # the questions among them also as chat turns
    assert len(first) == counts["recall_windows"] + counts["derived"] + counts["chat_turns"]
    assert len(first) == len(again) and all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    kept, filtered = run(dataclasses.replace(options, grounded=True))
    assert filtered["derived"] + filtered["chat_turns"] + filtered["ungrounded"] == counts["derived"] + counts["chat_turns"]
    assert len(kept) + filtered["ungrounded"] == len(first)
    assert run(dataclasses.replace(options, chunk_tokens=48))[1]["derived"] > 0  # shared out over the chunks
    assert run(dataclasses.replace(options, derived=0))[1]["derived"] == 0


def test_a_second_model_writes_the_questions_and_messages():
    """writer=(model, tokenizer): the questions and self-study messages come from the writer's forward passes (the
    model being adapted only answers them), seeded; without it the model writes its own; a writer in the cache key."""
    model, writer, codec = tiny(seed=0, vocab=64), tiny(seed=7, vocab=64), CharCodec()
    prompt = torch.tensor(codec.encode("Abe was born in Rome. Abe is a baker. Bea has two cats."))
    options = StudyOptions(window_tokens=6, n_continuations=0, answer_tokens=2, n_questions=2, n_conversations=2,
                           message_tokens=6, top_k=8)
    calls = {"model": 0, "writer": 0}
    hooks = [m.tok_emb.register_forward_pre_hook(lambda module, args, name=name: calls.__setitem__(name, calls[name] + 1))
             for name, m in (("model", model), ("writer", writer))]
    try:
        own = study(model, prompt, [], options, codec, torch.Generator().manual_seed(1))
        assert calls["writer"] == 0
        before = calls["model"]
        written = study(model, prompt, [], options, codec, torch.Generator().manual_seed(1), writer=(writer, codec))
        during = calls["model"] - before
        again = study(model, prompt, [], options, codec, torch.Generator().manual_seed(1), writer=(writer, codec))
    finally:
        for hook in hooks:
            hook.remove()
    assert calls["writer"] > 0 and during < before  # the writer did the writing; the model only answered
    assert len(written[0]) == len(again[0]) and all(torch.equal(a[0], b[0]) for a, b in zip(written[0], again[0]))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(own[0], written[0])) or len(own[0]) != len(written[0])
    from incontext.absorb import get_absorb_method

    with pytest.raises(ValueError, match="writer must be a \\(model, tokenizer\\) pair"):
        get_absorb_method("kv-prefix", writer=writer)


def test_the_rules_read_the_document_without_special_tokens():
    class Marked:  # a chat template's markers around a system-placed document are special ids, not text
        tokenizer = type("T", (), {"all_special_ids": [0, 1]})()
        words = {0: "<|im_start|>", 1: "<|im_end|>", 2: "system\n", 3: DOC, 4: "\n"}

        def decode(self, ids):
            return "".join(self.words[i] for i in ids)

    text = study_derived.document_text(Marked(), [0, 2, 3, 1, 4])
    assert text == "system\n" + DOC + "\n" and derive(text) == derive(DOC)
    assert study_derived.document_text(CharCodec(), [5, 6]) == CharCodec().decode([5, 6])  # no special ids: all of it


def test_kv_prefix_derives_queries_by_default_and_distill_lora_does_not():
    from incontext.absorb import get_absorb_method

    prefix, lora = get_absorb_method("kv-prefix"), get_absorb_method("distill-lora")
    assert prefix.options.study.derived == 16 and lora.options.study.derived == 0  # the sweep's choice is kv-prefix's alone
    assert get_absorb_method("kv-prefix", **{"study.n_questions": 8}).options.study.derived == 16  # others keep it
    assert get_absorb_method("kv-prefix", study=dict(derived=0)).options.study.derived == 0


def test_reconstruction_pieces_cover_the_document_then_spread():
    from incontext.absorb.study.stage import reconstruction_pieces

    assert reconstruction_pieces(10, 0, 4) == []
    assert reconstruction_pieces(10, 5, 4) == [(0, 4), (4, 8), (6, 10)]  # consecutive, the last flush with the end
    assert reconstruction_pieces(100, 3, 10) == [(0, 10), (40, 50), (90, 100)]  # spread where 3 do not cover it
    assert reconstruction_pieces(100, 1, 10) == [(0, 10)] and reconstruction_pieces(3, 2, 10) == [(0, 3)]


def test_reconstruction_is_the_teacher_repeating_the_document_after_the_instruction():
    """Each reconstruction sequence: the instruction (a chat turn where the tokenizer has a template) and a piece of
    the document; its targets are the model's distributions reading the document, the instruction and the piece
    (float64, a plain forward pass), from the instruction's last token on."""
    from incontext.absorb.study.options import REPEAT
    from incontext.tasks.placement import chat_turn

    model, codec = tiny(vocab=64), CharCodec()
    prompt = torch.tensor(codec.encode("The meeting is on Tuesday at ten in Room B. Alice Brown chairs it."))
    options = StudyOptions(window_tokens=8, n_continuations=0, answer_tokens=0, reconstruction=3,
                           reconstruction_tokens=16, top_k=None)
    sequences, counts = study(model, prompt, [], options, codec, torch.Generator().manual_seed(0))
    assert counts["reconstruction"] == 3 and len(sequences) == counts["recall_windows"] + 3
    instruction = torch.tensor(codec.encode(chat_turn(codec, REPEAT, "system")))
    m = prompt.shape[0]
    from incontext.absorb.study.stage import reconstruction_pieces

    assert reconstruction_pieces(m, 3, 16) == [(0, 16), (32, 48), (m - 16, m)]
    for (ids, logp), (s, e) in zip(sequences[counts["recall_windows"]:], reconstruction_pieces(m, 3, 16)):
        assert torch.equal(ids, torch.cat([instruction, prompt[s:e]]))
        with torch.no_grad():
            full = model(torch.cat([prompt, ids])[None])[0, m + instruction.shape[0] - 1:]
        assert logp.shape[0] == e - s + 1 and torch.allclose(logp, F.log_softmax(full, -1), atol=1e-10)
    plain = StudyOptions(**{**dataclasses.asdict(options), "reconstruction": 0})
    assert study(model, prompt, [], plain, codec, torch.Generator().manual_seed(0))[1]["reconstruction"] == 0
    chunked = dataclasses.replace(options, chunk_tokens=40)
    pieces = study(model, prompt, [], chunked, codec, torch.Generator().manual_seed(0))[1]
    assert pieces["chunks"] > 1 and pieces["reconstruction"] == 3  # each piece once, in the chunk that holds it
