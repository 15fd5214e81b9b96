"""The `documents` episode task: varied everyday documents, each asked back in short spans (exact match).

Where `facts` lists invented people's facts one template a line, this task writes whole documents of eight kinds
(`KINDS`): meeting notes, a notice, a travel itinerary, house or club rules, a product page, an e-mail or letter,
a recipe and release notes. Each states about a dozen things (who, which day, what time, where, how many, what
price, which version, which item) in sentence forms drawn per document (key: value lines, lists, prose), and
questions ask them back in several wordings ("Who chaired the meeting?", "According to the notice, how many weeks
will the work take?"); the answer is a short span copied from the document (a name, a number, a time, a word).

Nothing can be known without the document: people, places, firms and products are invented words (`Names`, its
own syllables, never a name another task of this project uses), numbers are drawn. Every answer is determined:
a document's values are all different, each answer occurs once in it (as a whole span), and where several facts
share a relation a question names which ("Who will print the flyers?": its key, one fact a key).

An episode is one document, then one worked question and answer in facts' frame (`Q: ...\\nA: answer`, so a small
LM sees the answer format); `queries` other facts of the document are asked, scored like facts (teacher-forced
exact match of the answer's tokens). format=chat places the document as facts' chat format does.

    doc = make_document("recipe", random.Random(0))   # Document: kind, text, facts (answer, question wordings)
    episodes = get_episode_source("documents", kinds="recipe,notice").episodes(8, seed=0, tokenizer=codec)
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import torch

from ..config import check_choices
from .document_kinds import KINDS, MAX_QUERIES, Document, Fact, Names, occurrences
from .episodes import Episode, EpisodeSource, _need, _positive, chat_document, text_query
from .queries import plain_question

_DRAWS = 200  # draws of a document before a failed uniqueness check is an error (a draw rarely fails)


# ------------------------------------------------------------------------------------------- invented values


# ------------------------------------------------------------------------------------------- the kinds
# Each writes one document with a Names: (text, facts). Facts are listed in the order the text states them.


def _checked(text: str, facts: list[Fact]) -> bool:
    """Every answer determined: answers all different, each once in the text, none in its questions; the keys a
    relation's questions name are in the text and all different (one fact per key); enough facts to ask."""
    answers = [fact.answer.lower() for fact in facts]
    keys = [(fact.relation, fact.key.lower()) for fact in facts if fact.key]
    return (len(facts) > MAX_QUERIES and len(set(answers)) == len(answers) and len(set(keys)) == len(keys)
            and all(occurrences(fact.answer, text) == 1 and (not fact.key or occurrences(fact.key, text) >= 1)
                    and not any(occurrences(fact.answer, q) for q in fact.questions) for fact in facts))


def make_document(kind: str, rng: random.Random) -> Document:
    """One document of `kind` (KINDS) drawn from `rng`; redrawn (from the same rng) until every answer is
    determined (`_checked`: a draw rarely fails)."""
    if kind not in KINDS:
        raise ValueError(f"unknown document kind {kind!r}; kinds: {', '.join(KINDS)}")
    write, noun = KINDS[kind]
    for _ in range(_DRAWS):
        text, facts, *named = write(Names(rng))
        if _checked(text, facts):
            return Document(kind, text, tuple(facts), named[0] if named else noun)
    raise ValueError(f"no {kind} document with determined answers in {_DRAWS} draws")


def ask(fact: Fact, noun: str, rng: random.Random) -> tuple[str, str]:
    """(question in facts' frame "Q: ...\\nA:", answer with its leading space): one of the fact's wordings, a third
    of the time as "According to {noun}, ...?"."""
    question = rng.choice(fact.questions)
    if rng.random() < 1 / 3:
        question = f"According to {noun}, {question[0].lower()}{question[1:]}"
    return plain_question(question), f" {fact.answer}"


def parse_kinds(value) -> tuple[str, ...]:
    """The `kinds` option read: "all" or a comma list of KINDS (in the given order, no repeats). One-line
    ValueError otherwise."""
    text = str(value).strip()
    if text == "all":
        return tuple(KINDS)
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in KINDS]
    if not text or unknown:
        raise ValueError(f"DocumentsConfig.kinds={value!r}: unknown kind {(unknown or [''])[0]!r}; give all or a "
                         f"comma list of {', '.join(KINDS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"DocumentsConfig.kinds={value!r}: a kind is named twice")
    return tuple(names)


@dataclass
class DocumentsConfig:
    kinds: str = "all"  # all, or a comma list of the document kinds (meeting-notes, notice, itinerary, ...) to draw
    queries: int = 7  # questions asked per document, 1 to 10 (one more is the prompt's worked example)
    format: Literal["plain", "chat"] = "plain"  # chat: the document and questions as chat turns (Instruct models)
    questions: str = "none"  # training questions: none only (the document alone)
    # chat format only: where the document goes, as facts' placement (system: a system turn; user: a user turn
    # "Remember this document:" with the assistant's acknowledgement)
    placement: Literal["system", "user"] = "system"

    def __post_init__(self):
        _positive(self, "queries")
        if self.queries > MAX_QUERIES:
            raise ValueError(f"DocumentsConfig.queries={self.queries}: a document is asked at most {MAX_QUERIES} questions")
        if str(self.questions).strip() != "none":
            raise ValueError(f"DocumentsConfig.questions={self.questions!r}: the documents task has no training "
                             f"questions (give none: the document alone)")
        parse_kinds(self.kinds)
        check_choices(self)


class Documents(EpisodeSource):
    name = "documents"
    description = ("varied everyday documents (meeting notes, notices, itineraries, rules, product pages, letters, "
                   "recipes, release notes); questions ask short spans back (exact match of the greedy answer)")
    metric = "exact"
    config_class = DocumentsConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        if self.config.format == "chat" and not hasattr(codec, "chat"):
            raise ValueError("documents format=chat needs a tokenizer with a chat template")
        rng = random.Random(f"documents-{seed}")
        kinds, order = parse_kinds(self.config.kinds), []
        out = []
        for _ in range(n):
            if not order:  # every kind once per round, in a drawn order
                order = rng.sample(kinds, len(kinds))
            out.append(self.episode(make_document(order.pop(), rng), rng, codec))
        return out

    def episode(self, document: Document, rng: random.Random, codec) -> Episode:
        """The document, a worked question and answer (one fact), then `queries` other facts asked in document
        order."""
        facts = list(document.facts)
        example = facts.pop(rng.randrange(len(facts)))
        picked = sorted(rng.sample(range(len(facts)), self.config.queries))
        worked = ask(example, document.noun, rng)
        asked = [ask(facts[i], document.noun, rng) for i in picked]
        if self.config.format == "plain":
            prompt = f"{document.text}\n\n{worked[0]}{worked[1]}\n\n"
            queries = [text_query(codec, q, a) for q, a in asked]
        else:
            prompt, queries = chat_document(codec, document.text, worked, asked, self.config.placement,
                                            ("Remember this document:", "I will remember it."))
        return Episode(prompt=torch.tensor(codec.encode(prompt)), queries=queries)
