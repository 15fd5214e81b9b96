"""Queries derived from a document's text by rules, no writer model: sentence prefixes the teacher continues
("prefix"), "What does the text say about NAME?" ("about") and sentences turned into questions ("qa"); the cloze
form of a fact; whether an answer's words are the document's (grounded)."""

from __future__ import annotations

import functools
import re
from collections import Counter

import torch

from .options import DERIVED_KINDS, seed_kinds
from ...tasks.queries import plain_question


def document_text(codec, ids: list[int]) -> str:
    """The document's text as the writer and the rules read it: the ids decoded without the tokenizer's special
    tokens (a chat template's markers around a system-placed document, a BOS), which are no text to ask about."""
    special = set(getattr(getattr(codec, "tokenizer", None), "all_special_ids", None) or ())
    return codec.decode([i for i in ids if i not in special])


_STOP = set("a an the in on at of to for by with from as and or but if so then this that these those it its he she they "
            "we you i his her their our my there here is are was were be been has have had do does did not no however "
            "after before when while during each every some all what who which how where also than into about".split())


_NAME = re.compile(r"[A-Z][\w-]*(?: [A-Z][\w-]*)*")  # a run of capitalised words


_NUMBER = re.compile(r"\d(?:[\d,.:/-]*\d)?")  # a number, a time, a date


_WHEN = re.compile(r"(?:(?:mon|tues|wednes|thurs|fri|satur|sun)day|january|february|march|april|may|june|july|august|"
                   r"september|october|november|december|\d{1,2}:\d\d|\d{4}|noon|midnight)\b", re.I)


_SUBJECT = r"(?P<x>[A-Z][\w'-]*(?: [\w'-]+){0,5}?)"  # a sentence's subject: up to six words


_PARTICIPLE = r"(?P<p> (?:[a-z]+ed|born|held|built|made|found|kept|set|run|sold|seen|written|given))?"


_RULES = [  # (pattern over a sentence without its last punctuation, the question it asks), tried in turn
    (re.compile(_SUBJECT + r" (?P<v>has|have|had) (?:\d[\d,.]*|one|two|three|four|five|six|seven|eight|nine|ten|"
                r"several|many) (?P<z>[a-z][a-z -]*?)(?:,.*| (?:in|on|at|of|named|called|with|and|for|who|which|that)\b.*)?"),
     lambda m, x: f"How many {m['z']} {dict(has='does', have='do', had='did')[m['v']]} {x} have?"),
    (re.compile(_SUBJECT + r" (?P<v>is|are|was|were)" + _PARTICIPLE + r" (?P<prep>on|at|in|during|since) (?P<y>.+)"),
     lambda m, x: (f"When {m['v']} {x}{m['p'] or ''}?" if _WHEN.match(m["y"]) else
                   f"Where {m['v']} {x}{m['p'] or ''}?" if m["y"][0].isupper() and m["prep"] in ("at", "in") else None)),
    (re.compile(_SUBJECT + r" (?P<verb>[a-z]{2,}[^s\W]s)(?P<o>(?: [\w'-]+)*?) (?:on|at) (?P<y>.+)"),
     lambda m, x: (f"When does {x} {re.sub(r'(?:(?<=[cs]h)|(?<=[xo]))es$|s$', '', m['verb'])}{m['o']}?"
                   if _WHEN.match(m["y"]) else None)),
    (re.compile(_SUBJECT + r" (?P<v>is|are|was|were) (?!not\b|(?:[a-z]+ed|born|on|at|in|during|since)\b)(?P<y>.+)"),
     lambda m, x: f"What {m['v']} {x}?"),
]


def derived_queries(text: str, kinds, limit: int, generator: torch.Generator) -> list[str]:
    """Up to `limit` distinct queries derived from the text alone, spread over its sentences (each sentence's in an
    order drawn from `generator`, one per sentence in turn): "prefix", a sentence up to a name, a number (time, date)
    or its last content word, which the teacher continues; "about", "Q: What does the text say about NAME?\nA:" for
    each name; "qa", sentences turned into questions by rules (_RULES), "Q: ...?\nA:"."""
    kinds = seed_kinds(kinds, DERIVED_KINDS, "derived_kinds")
    sentences = _sentences(text)
    if limit < 1 or not sentences:
        return []
    capitalised = Counter(re.findall(r"\b[A-Z][\w-]*", text))
    spans = [_name_spans(s, capitalised) for s in sentences]
    names = list(dict.fromkeys(s[a:b] for s, found in zip(sentences, spans) for a, b in found))
    per, seen = [], set()
    for s, found in zip(sentences, spans):
        mine = []
        if "prefix" in kinds:
            content = [m.start() for m in re.finditer(r"[^\W\d_]{3,}", s) if m.group().lower() not in _STOP][-1:]
            starts = sorted({a for a, _ in found} | {m.start() for m in _NUMBER.finditer(s)} | set(content))
            mine += [s[:a].rstrip() for a in starts if s[:a].strip()]
        if "about" in kinds:
            mine += [plain_question(f"What does the text say about {s[a:b]}?") for a, b in found]
        if "qa" in kinds:
            mine += [plain_question(q) for q in _rule_questions(s, names)]
        mine = [q for q in dict.fromkeys(mine) if q not in seen]
        seen.update(mine)
        per.append([mine[i] for i in torch.randperm(len(mine), generator=generator).tolist()])
    picked = []
    for r in range(max(map(len, per))):  # round r: the r-th query of every sentence that has one, while they fit
        layer, need = [(i, r, qs[r]) for i, qs in enumerate(per) if len(qs) > r], limit - len(picked)
        picked += layer if len(layer) <= need else [layer[k * len(layer) // need] for k in range(need)]
        if len(picked) == limit:
            break
    return [q for *_, q in sorted(picked)]


def cloze(text: str, answer: str) -> str | None:
    """The sentence of `text` that holds `answer`, up to it (the form the sentence-prefix rule cuts: "Ada was born
    in" for "Ada was born in Paris."), or None where the answer is not in the text or starts its sentence."""
    at = text.find(answer) if answer else -1
    if at < 0:
        return None
    start = max(text.rfind(mark, 0, at) for mark in (".", "\n", "!", "?")) + 1
    return text[start:at].strip() or None


def _name_spans(sentence: str, capitalised: Counter) -> list[tuple[int, int]]:
    """Where the sentence names something: runs of capitalised words, at its start without a leading stopword ("The")
    and only as two or more words or a word the text capitalises twice or more."""
    out = []
    for m in _NAME.finditer(sentence):
        a, run = m.start(), m.group()
        first, _, rest = run.partition(" ")
        if a == 0 and (first.lower() in _STOP or not rest and capitalised[first] < 2):
            a, run = a + len(first) + 1, rest if first.lower() in _STOP else ""
        if run and run.lower() not in _STOP:
            out.append((a, a + len(run)))
    return out


def _rule_questions(sentence: str, names: list[str]) -> list[str]:
    """The questions _RULES ask of one sentence, and "Who VERB ...?" where it starts with a name and a verb."""
    s, out = sentence.rstrip(" .!?;:"), []
    for pattern, ask in _RULES:
        m = pattern.fullmatch(s)
        x = m and m["x"]
        if m and "," not in x and x.lower() not in _STOP and x.split()[0].lower() not in _STOP - {"the", "a", "an", "this"}:
            question = ask(m, x[0].lower() + x[1:] if x.split()[0].lower() in _STOP else x)
            out += [question] if question else []
    who = max((n for n in names if s.startswith(n + " ")), key=len, default=None)
    m = who and re.fullmatch(r"(?P<verb>[a-z]+(?:s|ed)) (?P<rest>[^,]+)", s[len(who) + 1:])
    return out + ([f"Who {m['verb']} {m['rest']}?"] if m else [])


@functools.lru_cache(maxsize=8)
def _words(text: str) -> frozenset[str]:
    """The text's words, lowercased (one document's, read once for all the answers grounded against it)."""
    return frozenset(re.findall(r"[^\W_]+", text.lower()))


def grounded(answer_text: str, document_text: str) -> bool:
    """Whether one of the answer's content words (alphanumeric of >= 3 characters and no stopword, or any number) is a
    word of the document, case-insensitive."""
    document = _words(document_text)
    return any(w in document for w in re.findall(r"[^\W_]+", answer_text.lower())
               if w.isdigit() or len(w) >= 3 and w not in _STOP)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]
