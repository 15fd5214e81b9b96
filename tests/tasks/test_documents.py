"""The `documents` episode task: varied everyday documents, short answers copied from them, determined answers."""

import random
import re

import pytest
import torch

from conftest import ByteCodec
from incontext.config import ConfigError
from incontext.tasks.documents import KINDS, MAX_QUERIES, make_document
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.facts import ATTRIBUTES, PARAPHRASES, Person

# a phrase only one kind's documents have (every drawn wording of it)
MARKERS = {"meeting-notes": "Next meeting:", "notice": "temporary desk", "itinerary": "free morning",
           "rules": " bin", "product-page": "working days", "letter": "collecting money", "recipe": "Ingredients:",
           "release-notes": "Fixed a crash"}


class ChatCodec(ByteCodec):
    def chat(self, messages, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def read(codec, query):
    """(question text, answer text) of a query: the inputs up to the first scored position, the scored targets."""
    first = int(query.mask.nonzero().min())
    return codec.decode(query.inputs[: first + 1]), codec.decode(query.targets[query.mask])


def count(span: str, text: str) -> int:
    """Whole-span occurrences: not inside a word or a number, time, price, decimal or version."""
    return len(re.findall(r"(?<![\w$#/-])(?<!\d[.:,])" + re.escape(span) + r"(?![\w/-]|[.,:]\d)", text, re.IGNORECASE))


def kind_of(text: str) -> str:
    kinds = [kind for kind, marker in MARKERS.items() if marker in text]
    assert len(kinds) == 1, (kinds, text)
    return kinds[0]


def test_same_seed_same_episodes_and_seeds_differ():
    codec = ByteCodec()
    a, b = (get_episode_source("documents").episodes(6, seed=3, tokenizer=codec) for _ in range(2))
    c = get_episode_source("documents").episodes(6, seed=4, tokenizer=codec)
    for x, y in zip(a, b):
        assert torch.equal(x.prompt, y.prompt) and len(x.queries) == len(y.queries) == 7
        assert all(torch.equal(p.inputs, q.inputs) and torch.equal(p.targets, q.targets) and torch.equal(p.mask, q.mask)
                   for p, q in zip(x.queries, y.queries))
    assert all(not torch.equal(x.prompt, z.prompt) for x, z in zip(a, c))
    first = get_episode_source("documents").episodes(2, seed=3, tokenizer=codec)  # a prefix of the longer draw
    assert all(torch.equal(x.prompt, y.prompt) for x, y in zip(first, a))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_answer_is_a_span_that_occurs_once_in_its_document(seed):
    codec = ByteCodec()
    for episode in get_episode_source("documents", queries=MAX_QUERIES).episodes(len(KINDS), seed=seed, tokenizer=codec):
        prompt = codec.decode(episode.prompt)
        document, worked = prompt.split("\n\nQ: ")
        question, answer = worked.rstrip("\n").split("\nA: ")
        asked = [read(codec, q) for q in episode.queries]
        assert len(asked) == MAX_QUERIES and all(q.startswith("Q: ") and q.endswith("\nA:") for q, _ in asked)
        assert f"Q: {question}\nA:" not in [q for q, _ in asked]  # the worked example is not asked again
        for q, a in [(f"Q: {question}\nA:", " " + answer), *asked]:
            assert a.startswith(" ") and 1 <= len(a.split()) <= 3, a  # a short span: a name, a number, a word
            assert count(a[1:], document) == 1, (a, document)
            assert count(a[1:], q) == 0, (q, a)  # the question does not give its answer away
        assert len({a for _, a in asked}) == len(asked)


def test_answers_are_determined_where_a_question_names_a_value():
    """Within a document all answers differ; facts of one relation are told apart by their key (an item, an
    ingredient, a material), each in the document; recomputed from the text for three keyed relations."""
    for seed in range(60):
        for kind in KINDS:
            doc = make_document(kind, random.Random(f"{seed}-{kind}"))
            answers = [f.answer.lower() for f in doc.facts]
            assert len(set(answers)) == len(answers) and len(doc.facts) > MAX_QUERIES
            by_relation = {}
            for fact in doc.facts:
                by_relation.setdefault(fact.relation, []).append(fact)
                assert count(fact.answer, doc.text) == 1
            for relation, facts in by_relation.items():
                if len(facts) > 1:  # several facts of one relation: each names its own key, in the document
                    keys = [f.key for f in facts]
                    assert all(keys) and len(set(keys)) == len(keys), (relation, keys)
                    assert all(count(k, doc.text) >= 1 for k in keys)
            for fact in doc.facts:
                if fact.relation == "amount":  # How many grams of X: the one amount listed with X
                    assert re.findall(rf"(\d+) (?:g|grams of) {fact.key}\n", doc.text) == [fact.answer]
                if fact.relation == "bin colour":  # Which bin does X go in: the one bin named with X
                    found = re.findall(rf"{fact.key} goes in the (\w+) bin|Use the (\w+) bin for {fact.key}\.", doc.text, re.I)
                    assert ["".join(m) for m in found] == [fact.answer]
                if fact.relation == "action owner":  # Who will V the X: the one member given X
                    assert re.findall(rf"(\w+) to \w+ the {fact.key}\b", doc.text) == [fact.answer]


def test_every_kind_appears_once_a_round_and_kinds_select():
    codec = ByteCodec()
    episodes = get_episode_source("documents").episodes(2 * len(KINDS), seed=0, tokenizer=codec)
    kinds = [kind_of(codec.decode(e.prompt).split("\n\nQ: ")[0]) for e in episodes]
    assert sorted(kinds[: len(KINDS)]) == sorted(kinds[len(KINDS):]) == sorted(KINDS)
    chosen = get_episode_source("documents", kinds="recipe, notice").episodes(6, seed=1, tokenizer=codec)
    assert {kind_of(codec.decode(e.prompt)) for e in chosen} == {"recipe", "notice"}


def test_documents_are_varied_and_of_a_few_hundred_bytes():
    """Several wordings per kind (two seeds' documents of a kind are not one template with new values) and
    several question wordings; the document fits a short prompt."""
    for kind in KINDS:
        docs = [make_document(kind, random.Random(i)) for i in range(12)]
        skeletons = set()
        for doc in docs:  # the text less its values: what is left is the wording and layout
            text = doc.text
            for value in sorted({v for f in doc.facts for v in (f.answer, f.key) if v}, key=len, reverse=True):
                text = text.replace(value, "_")
            skeletons.add(re.sub(r"[A-Z][a-z]+|\$?[\d.:]+", "_", text))
        assert len(skeletons) >= 4, kind
        assert all(300 <= len(d.text) <= 1200 for d in docs), [len(d.text) for d in docs]
        assert all(len(f.questions) >= 2 for d in docs for f in d.facts)
    codec = ByteCodec()
    questions = [read(codec, q)[0] for e in get_episode_source("documents").episodes(16, seed=0, tokenizer=codec)
                 for q in e.queries]
    assert any(q.startswith("Q: According to the ") for q in questions)
    assert {q.split()[1] for q in questions} >= {"Who", "What", "How", "Which", "On", "According"}


def facts_phrases() -> set[str]:
    """The fixed parts of facts' statements, questions and paraphrases (tasks/facts.py), less the generic ones."""
    person = Person("Xa", "Yb", "Placeq", "jobq", "animalq", "Petq", 1234)
    texts = [t for a in ATTRIBUTES for t in (person.statement(a), person.question(a)[0], person.cloze(a),
                                             *(person.paraphrase(a, f) for f in range(PARAPHRASES)))]
    parts = {p.strip() for t in texts for p in re.split(r"Xa Yb|Placeq|jobq|animalq|Petq|1234|Q: |\nA:", t)}
    return {p for p in parts if len(p) >= 6} - {"What is", "What does", "What did", "Tell me what", "called?"}


def test_no_facts_template_is_used():
    phrases = facts_phrases()
    assert {"was born in", "works as a", "has a pet", "'s job?", "What is the name of", "Where was"} <= phrases
    codec = ByteCodec()
    for episode in get_episode_source("documents").episodes(3 * len(KINDS), seed=5, tokenizer=codec):
        texts = [codec.decode(episode.prompt)] + [read(codec, q)[0] for q in episode.queries]
        for text in texts:
            assert not [p for p in phrases if p in text], text
            assert not re.search(r"\b(born|pets?|birthplace|occupation)\b", text, re.I), text


def test_chat_format_places_the_document_as_facts_does():
    codec = ChatCodec()
    plain = codec.decode(get_episode_source("documents").episodes(1, seed=0, tokenizer=codec)[0].prompt)
    document = plain.split("\n\nQ: ")[0]
    for placement, start in (("system", f"<system>{document}</system><user>"),
                             ("user", f"<user>Remember this document:\n{document}</user><assistant>I will remember it.")):
        episode = get_episode_source("documents", format="chat", placement=placement).episodes(1, seed=0, tokenizer=codec)[0]
        prompt = codec.decode(episode.prompt)
        assert prompt.startswith(start) and prompt.endswith("</assistant>")
        assert len(episode.queries) == 7
        for q in episode.queries:
            question, answer = read(codec, q)
            assert question.startswith("<user>") and question.endswith("</user><assistant>") and "Q: " not in question
            assert not answer.startswith(" ") and count(answer, document) == 1
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        get_episode_source("documents", format="chat").episodes(1, tokenizer=ByteCodec())


@pytest.mark.parametrize("options, message", [
    ({"kinds": "poems"}, "kinds='poems': unknown kind 'poems'; give all or a comma list of meeting-notes, notice"),
    ({"kinds": ""}, "unknown kind ''"),
    ({"kinds": "recipe,recipe"}, "a kind is named twice"),
    ({"queries": 0}, "queries must be a positive integer"),
    ({"queries": MAX_QUERIES + 1}, f"asked at most {MAX_QUERIES} questions"),
    ({"questions": "cloze"}, "has no training questions (give none"),
    ({"format": "html"}, "DocumentsConfig.format"),
    ({"placement": "top"}, "DocumentsConfig.placement"),
    ({"colour": "red"}, "task 'documents': DocumentsConfig: unknown key(s) ['colour']"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ConfigError) as error:
        get_episode_source("documents", **options)
    assert message in str(error.value) and len(str(error.value).splitlines()) == 1


def test_the_document_alone():
    episodes = get_episode_source("documents", queries=3).episodes(2, seed=0, tokenizer=ByteCodec())
    assert all(len(e.queries) == 3 and e.train_queries == [] and e.train_groups is None and e.query_groups is None
               and e.parts == [] for e in episodes)
    assert get_episode_source("documents").metric == "exact"
