"""The `jsonl` task (your own documents and questions), its metric `generated` and the harness generating answers."""

import json
from pathlib import Path

import pytest
import torch

from conftest import ByteCodec
from incontext.absorb import get_absorb_method
from incontext.harness import compare as harness
from incontext.absorb.decode import greedy_answers
from incontext.harness.compare import compare
from incontext.harness.report import table
from incontext.models import Transformer, TransformerConfig
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.jsonl import read_qa_file
from incontext.tasks.metrics import answer_contains, get_metric, normalize_answer, token_f1

SMALL = Path(__file__).resolve().parents[1] / "data" / "qa_small.jsonl"


class Codec(ByteCodec):
    """Bytes as ids, decoded leniently (a random model's bytes need not be UTF-8), with a chat template."""

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def chat(self, messages, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</s>\n" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def tiny():
    torch.manual_seed(0)
    return Transformer(TransformerConfig(n_layer=2, d_model=32, n_head=4, vocab_size=256, attention="softmax",
                                         positions="rope", max_seq_len=2048)).eval()


def question_text(codec, query):
    return codec.decode(query.inputs[: int(query.mask.nonzero()[0]) + 1].tolist())


def answer_text(codec, query):
    return codec.decode(query.targets[query.mask].tolist())


# ----------------------------------------------------------------------------- the file and its episodes


def test_the_small_file_is_three_records_in_order():
    records = read_qa_file(SMALL)
    assert [r.line for r in records] == [1, 2, 3]
    assert records[0].document == "Mira Talven keeps bees in Orlu. She was born in 1961."
    assert records[1].document == "The Vesk bridge is made of red stone."  # under "context"
    assert records[0].questions == (("Where does Mira Talven keep bees?", ("Orlu",)),
                                    ("When was Mira Talven born?", ("1961",)))
    assert records[1].questions == (("What is the Vesk bridge made of?", ("red stone", "stone")),)


def test_plain_episodes_ask_each_question_after_the_document():
    codec = Codec()
    source = get_episode_source("jsonl", path=str(SMALL), max_answer_tokens=5)
    assert source.metric == "generated" and source.higher_is_better
    episodes = source.episodes(3, tokenizer=codec)
    first = episodes[0]
    assert codec.decode(first.prompt.tolist()) == "Mira Talven keeps bees in Orlu. She was born in 1961.\n\n"
    assert [question_text(codec, q) for q in first.queries] == ["Q: Where does Mira Talven keep bees?\nA:",
                                                               "Q: When was Mira Talven born?\nA:"]
    assert [answer_text(codec, q) for q in first.queries] == [" Orlu", " 1961"]  # teacher-forced on the answer
    assert [q.answers for q in first.queries] == [("Orlu",), ("1961",)]
    assert episodes[1].queries[0].answers == ("red stone", "stone") and answer_text(codec, episodes[1].queries[0]) == " red stone"
    assert all(q.max_answer_tokens == 5 for e in episodes for q in e.queries)
    assert not first.train_queries and first.train_groups is None  # never the evaluation questions
    # the first n records, whatever the seed
    again = source.episodes(2, seed=7, tokenizer=codec)
    assert all(torch.equal(a.prompt, b.prompt) for a, b in zip(again, episodes))


def test_chat_episodes_put_the_document_in_the_first_turn():
    codec = Codec()
    episode = get_episode_source("jsonl", path=str(SMALL), format="chat").episodes(1, tokenizer=codec)[0]
    assert codec.decode(episode.prompt.tolist()) == ("<user>Read this document:\nMira Talven keeps bees in Orlu. She was "
                                                     "born in 1961.</s>\n<assistant>I have read it.</s>\n")
    query = episode.queries[0]
    assert question_text(codec, query) == "<user>Where does Mira Talven keep bees?</s>\n<assistant>"
    assert answer_text(codec, query) == "Orlu"
    with pytest.raises(ValueError, match="format=chat needs a tokenizer with a chat template"):
        get_episode_source("jsonl", path=str(SMALL), format="chat").episodes(1, tokenizer=ByteCodec())


def test_more_episodes_than_records_is_one_line():
    with pytest.raises(ValueError, match=r"qa_small.jsonl holds 3 records, fewer than the 4 episodes asked .*ask for 3 episodes or fewer"):
        get_episode_source("jsonl", path=str(SMALL)).episodes(4, tokenizer=Codec())


GOOD = {"document": "Ana lives in Pol.", "questions": [{"question": "Where does Ana live?", "answer": "Pol"}]}


def line(record) -> str:
    return record if isinstance(record, str) else json.dumps(record)


@pytest.mark.parametrize("second, fragment", [
    ("{not json", "line 2: not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("[1, 2]", "line 2: a record is a JSON object"),
    ({"questions": GOOD["questions"]}, 'line 2: the record has no "document" (nor "context" or "text"); its keys: [\'questions\']'),
    ({"document": "  ", "questions": GOOD["questions"]}, 'line 2: "document" must be a non-empty string'),
    ({"text": 3, "questions": GOOD["questions"]}, 'line 2: "text" must be a non-empty string, got 3'),
    ({"document": "x"}, 'line 2: "questions" must be a non-empty list'),
    ({"document": "x", "questions": []}, 'line 2: "questions" must be a non-empty list'),
    ({"document": "x", "questions": ["Where?"]}, "line 2, question 1: must be an object"),
    ({"document": "x", "questions": [{"question": "", "answer": "Pol"}]}, 'line 2, question 1: "question" must be a non-empty string'),
    ({"document": "x", "questions": [GOOD["questions"][0], {"question": "Who?"}]}, 'line 2, question 2: needs "answer"'),
    ({"document": "x", "questions": [{"question": "Who?", "answer": ""}]}, "line 2, question 1: an answer must be a string with a word"),
    ({"document": "x", "questions": [{"question": "Who?", "answer": "The."}]}, "got 'The.'"),  # nothing left after normalising
    ({"document": "x", "questions": [{"question": "Who?", "answer": 1961}]}, "an answer must be a string"),
    ({"document": "x", "questions": [{"question": "Who?", "answers": []}]}, '"answers" must be a non-empty list of strings'),
])
def test_a_bad_record_is_one_line_naming_file_and_line(tmp_path, second, fragment):
    path = tmp_path / "mine.jsonl"
    path.write_text(line(GOOD) + "\n" + line(second) + "\n")
    with pytest.raises(ValueError) as error:
        get_episode_source("jsonl", path=str(path))  # the options are checked: before any model loads
    message = str(error.value)
    assert f"{path}, line 2" in message and fragment in message and "\n" not in message


def test_bad_files_are_one_line(tmp_path):
    def refused(fragment, **options):
        with pytest.raises(ValueError) as error:
            get_episode_source("jsonl", **options)
        assert fragment in str(error.value) and "\n" not in str(error.value), str(error.value)

    refused("needs the file: option path=FILE")
    refused(f"path={tmp_path / 'none.jsonl'}: cannot read the file (No such file or directory)", path=str(tmp_path / "none.jsonl"))
    refused(f"path={tmp_path}: cannot read the file", path=str(tmp_path))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    refused("empty.jsonl: no records", path=str(tmp_path / "empty.jsonl"))
    (tmp_path / "bytes.jsonl").write_bytes(json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
    refused("bytes.jsonl, line 2: not UTF-8 text", path=str(tmp_path / "bytes.jsonl"))
    refused("max_answer_tokens must be a positive integer", path=str(SMALL), max_answer_tokens=0)
    refused("format", path=str(SMALL), format="html")


def test_blank_lines_a_bom_and_extra_keys_are_fine(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps({**GOOD, "id": 7}) + "\r\n\n" + json.dumps(GOOD) + "\n").encode())
    assert [r.line for r in read_qa_file(path)] == [1, 3]


def test_a_question_past_the_tokenizers_context_names_its_line(tmp_path):
    class Short(Codec):
        class tokenizer:  # noqa: N801  (a Hugging Face tokenizer's context length)
            model_max_length = 50

    path = tmp_path / "long.jsonl"
    path.write_text(line(GOOD) + "\n" + line({"document": "x", "questions": [{"question": "Where " * 8, "answer": "Pol"}]}) + "\n")
    source = get_episode_source("jsonl", path=str(path))
    assert len(source.episodes(1, tokenizer=Short())) == 1
    with pytest.raises(ValueError, match=r"long.jsonl, line 2, question 1: the document, question and answer take 59 "
                                         r"tokens, more than the model's context of 50"):
        source.episodes(2, tokenizer=Short())


# ----------------------------------------------------------------------------- the metric


def test_squad_normalisation_contains_and_token_f1():
    assert normalize_answer("  The Oboe, of course!\n") == "oboe of course"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # articles are whole words
    assert answer_contains("It is the Oboe.", "oboe") and answer_contains("In 1961, yes", "1961")
    assert not answer_contains("in 19610", "1961") and not answer_contains("x", "the")  # whole words; nothing to find
    assert answer_contains("red   stone bridge", "Red stone")
    assert token_f1("the red stones", "red stone") == pytest.approx(0.5)  # 1 of 2 words either way
    assert token_f1("Orlu", "orlu!") == 1.0 and token_f1("", "orlu") == 0.0 and token_f1("a", "the") == 1.0
    assert token_f1("stone stone red", "red stone") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))


def test_generated_scores_the_answer_against_any_gold_answer():
    codec = Codec()
    metric = get_metric("generated")
    assert metric.generates and metric.label == "contains %" and metric.columns == {"f1": "token F1 %"}
    query = get_episode_source("jsonl", path=str(SMALL)).episodes(2, tokenizer=codec)[1].queries[0]  # red stone / stone
    out = torch.zeros(len(query.inputs), 256)
    full, part, miss = (metric.score_answer(out, query, a) for a in ("Red stone.", "grey stone", "wood"))
    assert (full.correct, full.f1) == (1.0, 1.0)
    assert part.correct == 1.0 and part.f1 == pytest.approx(2 / 3)  # "stone" is a gold answer too (F1 1/2 vs red stone)
    assert (miss.correct, miss.f1) == (0.0, 0.0)
    assert full.logprob == pytest.approx(-len(" red stone") * torch.log(torch.tensor(256.0)).item())  # uniform logits
    assert metric.episode_score([full, miss]) == {"score": 0.5, "f1": 0.5, "answer_logprob": full.logprob}
    with pytest.raises(ValueError, match="scores a generated answer"):
        metric.score_query(out, query)


# ----------------------------------------------------------------------------- the harness


def hand_greedy(model, context: list[int], n: int, codec) -> str:
    """The model's greedy continuation of `context`, re-run on the whole sequence, cut at a newline after its text."""
    produced = []
    with torch.no_grad():
        for _ in range(n):
            produced.append(int(model(torch.tensor([context + produced]))[0, -1].argmax()))
            if "\n" in codec.decode(produced).lstrip():
                break
    return codec.decode(produced).lstrip().split("\n", 1)[0]


def test_greedy_answers_stop_at_the_newline_after_their_text_and_at_the_context(monkeypatch):
    from incontext.absorb import decode as generation

    codec, calls = Codec(), []
    query = get_episode_source("jsonl", path=str(SMALL), max_answer_tokens=9).episodes(1, tokenizer=codec)[0].queries[0]

    def scripted(model, ids, budget, stop_ids=()):
        calls.append((ids, budget))
        yield from codec.encode("\n Orlu.\nQ: more")[:budget]

    monkeypatch.setattr(generation, "stream_tokens", scripted)
    monkeypatch.setattr(generation, "context_room", lambda model, n: None)
    assert greedy_answers(None, [query], codec) == ["Orlu."]  # the leading newline skipped, cut at the next
    assert calls == [(codec.encode("Q: Where does Mira Talven keep bees?\nA:"), 9)]  # the question alone
    monkeypatch.setattr(generation, "context_room", lambda model, n: 4)  # the model's context ends 4 tokens on
    assert greedy_answers(None, [query], codec) == ["Or"] and calls[-1][1] == 4  # newline, space, O, r
    monkeypatch.setattr(generation, "context_room", lambda model, n: 0)
    assert greedy_answers(None, [query], codec) == [""] and len(calls) == 2  # no room: no answer, nothing run


def test_compare_generates_each_methods_answers_and_scores_them():
    model, codec = tiny(), Codec()
    source = get_episode_source("jsonl", path=str(SMALL), max_answer_tokens=4)
    episodes = source.episodes(3, tokenizer=codec)
    rows = {r["method"]: r for r in compare(model, source, episodes, {"dynamic-eval": {"n_steps": 1}}, progress=False,
                                            per_episode=True, codec=codec)}
    assert list(rows) == ["keep-prompt", "drop-prompt", "dynamic-eval"]
    for row in rows.values():
        assert row["status"] == "ok", row
        assert set(row["episode_scores"][0]) == {"score", "f1", "answer_logprob"}
        assert row["episode_positions"] == [2, 1, 1]  # one per question
    assert rows["keep-prompt"]["agreement"]["kl"] == 0.0 and rows["drop-prompt"]["agreement"]["kl"] > 0
    # keep-prompt's answers are the prompted model's greedy answers; drop-prompt's the model's without the document
    for name, with_prompt in (("keep-prompt", True), ("drop-prompt", False)):
        for episode, scores in zip(episodes, rows[name]["episode_scores"]):
            answers = [hand_greedy(model, (episode.prompt.tolist() if with_prompt else [])
                                   + q.inputs[: int(q.mask.nonzero()[0]) + 1].tolist(), 4, codec) for q in episode.queries]
            contains = [any(answer_contains(a, g) for g in q.answers) for a, q in zip(answers, episode.queries)]
            f1 = [max(token_f1(a, g) for g in q.answers) for a, q in zip(answers, episode.queries)]
            assert scores["score"] == sum(contains) / len(contains) and scores["f1"] == pytest.approx(sum(f1) / len(f1))
    adapted = get_absorb_method("keep-prompt").absorb(model, episodes[0].prompt)
    assert greedy_answers(adapted, episodes[0].queries, codec) == [
        hand_greedy(model, episodes[0].prompt.tolist() + q.inputs[: int(q.mask.nonzero()[0]) + 1].tolist(), 4, codec)
        for q in episodes[0].queries]


def test_a_method_that_answers_right_scores_full_marks(monkeypatch):
    """The hook's wiring: whatever greedy_answers returns is what the metric scores, per method."""
    model, codec = tiny(), Codec()
    source = get_episode_source("jsonl", path=str(SMALL))
    episodes = source.episodes(3, tokenizer=codec)
    monkeypatch.setattr(harness, "greedy_answers", lambda adapted, queries, codec: [f"It is {q.answers[-1]}." for q in queries])
    rows = compare(model, source, episodes, {}, progress=False, codec=codec)
    assert [r["score"]["mean"] for r in rows] == [1.0, 1.0]
    assert rows[0]["f1"]["mean"] == pytest.approx(0.5)  # "it is orlu" against "orlu": precision 1/3, recall 1
    results = {"metric": "generated", "rows": rows, "model_description": "tiny", "task": "jsonl", "episodes": 3,
               "queries": 4, "mean_prompt_tokens": 40.0, "torch_threads": 1, "tuning": {}, "split": "dev",
               "episode_seed": 0, "training_questions": None}
    head = table(results).splitlines()[2]
    assert "| contains % [95% CI] | token F1 % | top-1 agree % |" in head
    assert "| keep-prompt | 100.0 [100.0, 100.0] | 50.0 [50.0, 50.0] |" in table(results)


def test_generated_answers_need_a_decoding_tokenizer():
    model, codec = tiny(), Codec()
    source = get_episode_source("jsonl", path=str(SMALL))
    with pytest.raises(ValueError, match="reference method keep-prompt failed .* needs the model's tokenizer"):
        compare(model, source, source.episodes(1, tokenizer=codec), {}, progress=False)
