"""Absorb episodes: a prompt, queries that need it, and how to score them (the harness's input).

An `Episode` is what one absorb method sees once: a prompt to absorb, then queries answered without the
prompt in the context. Each `Query` is a token (or vector) sequence with next-token targets and a mask of the
positions that are scored; the source's `metric` names how (a registered object in `tasks/metrics.py`):

- `exact`: 1 if the greedy answer is the target, i.e. the argmax at every masked position equals its target
  (teacher-forced, so the first len(answer) greedy tokens are the answer); also the answer's log-probability;
- `accuracy`: share of masked positions whose argmax is the target (pooled over an episode's queries);
- `choice`: the candidate token (`Query.choices`) with the highest log-probability at the last masked
  position; calibrated: minus the same scores on the episode's content-free `calibration` query;
- `ce`: mean cross-entropy of the masked targets (lower is better);
- `mse`: mean squared error at the masked positions, for vector tasks (lower is better);
- `generated`: the greedy answer generated from the question (`Query.answers`), normalised, contains a gold answer;
  also its token F1 (the `jsonl` task: your own documents and questions, `tasks/jsonl.py`).

Sources come in two kinds. Text sources (`facts`, `documents` in tasks/documents.py, `topics`, `continuation`)
produce text and need the model's tokenizer (anything with `encode(text) -> list[int]`; `chat(messages) -> str` for
the chat format). Task sources (`induction`, `linear_regression`, `arithmetic`) cut sequences of a registered
training task in two, so they need a model trained on that task (the task object is passed in).

    source = get_episode_source("facts", people=3)
    episodes = source.episodes(20, seed=0, tokenizer=codec)
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import torch

from ..config import check_choices, from_dict
from ..registry import Registry
from .base import Task
from .facts import MAX_PEOPLE, PARAPHRASES, facts_prompt, make_people
from .metrics import get_metric
from .queries import question_of



@dataclass
class Query:
    inputs: torch.Tensor  # (N,) token ids, or (N, d_input) vectors
    targets: torch.Tensor  # (N,) next-token ids, or (N, d_output)
    mask: torch.Tensor  # (N,) bool: the scored positions
    choices: torch.Tensor | None = None  # (C,) candidate token ids (metric "choice"); the target is one of them
    # metrics that generate ("generated"): the gold answers as text (the targets teacher-force the first), and the
    # most tokens the greedy answer to the question (the inputs up to the first scored position) may take
    answers: tuple[str, ...] = ()
    max_answer_tokens: int = 16
    one_line: bool = True  # the greedy answer is cut at its first newline (RULER's lists may span lines: False)
    match: str = "all"  # metric "ruler": all (the share of `answers` present) or part (any of them)

    def __post_init__(self):
        n = self.inputs.shape[0]
        if n == 0 or self.targets.shape[0] != n or tuple(self.mask.shape) != (n,):
            raise ValueError(f"a query needs inputs, targets and mask of one length > 0; got {tuple(self.inputs.shape)}, "
                             f"{tuple(self.targets.shape)}, {tuple(self.mask.shape)}")
        if not bool(self.mask.any()):
            raise ValueError("a query needs at least one scored position")


@dataclass
class Episode:
    prompt: torch.Tensor  # (M,) token ids or (M, d_input) vectors
    queries: list[Query]
    prompt_loss_mask: torch.Tensor | None = None  # (M,) bool: prompt tokens a training method learns (None: all)
    train_queries: list[torch.Tensor] = field(default_factory=list)  # a method may train on these; never scored
    train_groups: list[int] | None = None  # one id per training query: the wordings of one question share it
    # one id per query: the training queries' question it asks (train_groups' ids), for the harness's reference that
    # answers each query with its training wordings' consensus (None: no query has training wordings)
    query_groups: list[int] | None = None
    calibration: Query | None = None  # content-free query for calibrated "choice" scoring
    # documents that make up the prompt (each a whole episode: its own prompt, queries and training queries); the
    # prompt is their concatenation and the queries theirs in order. Methods that compose (kv-prefix, distill-lora)
    # absorb each part alone and answer every query with the parts combined (the harness's "composed" rows).
    parts: list["Episode"] = field(default_factory=list)

    def __post_init__(self):
        if self.train_groups is not None and len(self.train_groups) != len(self.train_queries):
            raise ValueError(f"an episode's train_groups ({len(self.train_groups)}) must name one question per training "
                             f"query ({len(self.train_queries)})")
        if self.query_groups is not None and len(self.query_groups) != len(self.queries):
            raise ValueError(f"an episode's query_groups ({len(self.query_groups)}) must name one question per query "
                             f"({len(self.queries)})")
        if self.parts:
            if not torch.equal(self.prompt, torch.cat([part.prompt for part in self.parts])):
                raise ValueError("an episode's prompt must be the concatenation of its parts' prompts")
            if len(self.queries) != sum(len(part.queries) for part in self.parts):
                raise ValueError("an episode's queries must be its parts' queries, in order")


class Codec(Protocol):
    def encode(self, text: str) -> list[int]: ...


def text_query(codec: Codec, question: str, answer: str) -> Query:
    """A query that reads `question` and is scored on predicting `answer`'s tokens (teacher-forced)."""
    q, a = codec.encode(question), codec.encode(answer)
    if not q or not a:
        raise ValueError(f"empty question or answer after tokenization: {question!r} / {answer!r}")
    return token_query(torch.tensor(q), torch.tensor(a))


def token_query(question: torch.Tensor, answer: torch.Tensor) -> Query:
    """text_query from token ids: reads `question` (L,), scored on predicting `answer` (n,) after it."""
    ids = torch.cat([question, answer])
    scored = torch.zeros(len(ids), dtype=torch.bool)
    scored[len(question):] = True
    return Query(inputs=ids[:-1], targets=ids[1:], mask=scored[1:])


# ------------------------------------------------------------------------------------------- registry

SOURCES: Registry[type["EpisodeSource"]] = Registry("task", known="tasks with episodes")


class EpisodeSource(ABC):
    """Makes seeded episodes; subclasses set `name`, `description`, `metric`, `config_class`, and either
    `needs_tokenizer = True` (text) or `task_name` (the training task a model must know)."""

    name: ClassVar[str]
    description: ClassVar[str]
    metric: ClassVar[str]
    config_class: ClassVar[type]
    needs_tokenizer: ClassVar[bool] = False
    task_name: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # defining a source registers it (a base class without a name does not)
            SOURCES.register(cls.name, cls)

    def __init__(self, config: Any | None = None):
        self.config = config if config is not None else self.config_class()

    @abstractmethod
    def episodes(self, n: int, seed: int = 0, *, tokenizer: Codec | None = None, task: Task | None = None) -> list[Episode]:
        """n episodes, every draw from `seed`."""

    @property
    def higher_is_better(self) -> bool:
        return get_metric(self.metric).higher_is_better


def get_episode_source(name: str, **options: Any) -> EpisodeSource:
    cls = SOURCES.get(name)
    return cls(from_dict(cls.config_class, options, where=f"task '{name}': {cls.config_class.__name__}"))


def _need(value, what: str, name: str):
    if value is None:
        raise ValueError(f"task {name!r} needs {what}")
    return value


def _positive(config, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(config).__name__}.{name} must be a positive integer, got {value!r}")


# ------------------------------------------------------------------------------------------- text sources


@dataclass
class FactsConfig:
    people: int = 3  # invented people per prompt (4 facts each; one is the worked example)
    format: Literal["plain", "chat"] = "plain"  # chat: the facts and questions as chat turns (Instruct models)
    # documents > 1: the people are split over that many documents (each with its own worked example), concatenated
    # into the prompt; composing methods also absorb each document alone (plain format only)
    documents: int = 1
    # training questions for the methods that learn from queries (distill-lora, kv-prefix), written for the facts that
    # will be asked (a labelled setting, never the default): none (the document alone), cloze (each asked fact's
    # statement cut before its answer) or paraphrases:N (the cloze and the question in N other wordings, 1 to 6;
    # never the evaluation question's wording)
    questions: str = "none"
    # chat format only: where the document goes. system: as the chat template places a document (a system turn, or
    # the first user turn where the template has no system role); user: a user turn "Remember these facts:" with the
    # assistant's acknowledgement (the placement before the option existed)
    placement: Literal["system", "user"] = "system"

    def __post_init__(self):
        _positive(self, "people", "documents")
        if self.people > MAX_PEOPLE:  # refused with the options, before a model loads (make_people refuses too)
            raise ValueError(f"FactsConfig.people={self.people}: a facts prompt holds at most {MAX_PEOPLE} people")
        question_setting(self.questions)
        check_choices(self)
        if self.documents > self.people:
            raise ValueError(f"FactsConfig.documents={self.documents} exceeds people={self.people}: every document needs a person")
        if self.documents > 1 and self.format != "plain":
            raise ValueError("FactsConfig.documents > 1 needs format=plain")


QUESTION_SETTINGS = "none | cloze | paraphrases:N"


def question_setting(value) -> tuple[bool, int] | None:
    """A facts `questions` value read: None (none: the document alone), or (cloze, wordings): (True, 0) for cloze,
    (True, N) for paraphrases:N. One-line ValueError otherwise."""
    text = str(value).strip()
    if text == "none":
        return None
    if text == "cloze":
        return True, 0
    kind, sep, count = text.partition(":")
    if kind == "paraphrases" and sep and count.isdigit() and 1 <= int(count) <= PARAPHRASES:
        return True, int(count)
    if kind == "paraphrases" and sep and count.isdigit():
        raise ValueError(f"FactsConfig.questions={text}: the task has {PARAPHRASES} wordings of each question (1 to {PARAPHRASES})")
    raise ValueError(f"FactsConfig.questions={value!r}: give one of {QUESTION_SETTINGS} (e.g. paraphrases:3)")


def questions_label(task_options: dict) -> str | None:
    """What training questions a run's task gave the methods that learn from queries (None: the document alone)."""
    value = task_options.get("questions", "none")
    if value in (None, "none"):
        return None
    if value == "cloze":
        return "training questions: each asked fact's statement cut before its answer"
    return (f"training questions: each asked fact's statement cut before its answer and its question in "
            f"{str(value).partition(':')[2]} other wordings")


class Facts(EpisodeSource):
    name = "facts"
    description = "invented people's facts in the prompt; questions ask each fact back (exact match of the greedy answer)"
    metric = "exact"
    config_class = FactsConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        if self.config.format == "chat" and not hasattr(codec, "chat"):
            raise ValueError("facts format=chat needs a tokenizer with a chat template")
        rng = random.Random(f"facts-{seed}")
        out = []
        for _ in range(n):
            people = make_people(self.config.people, rng)
            if self.config.documents > 1:
                out.append(self._split(codec, people, rng))
                continue
            text, pairs, example = facts_prompt(people, rng)
            if self.config.format == "plain":
                prompt_text = text
                queries = [text_query(codec, *person.question(a)) for person, a in pairs]
            else:
                prompt_text, queries = self._chat(codec, text, pairs, example, self.config.placement)
            groups = self._train_groups(pairs)
            out.append(Episode(prompt=torch.tensor(codec.encode(prompt_text)), queries=queries,
                               train_queries=self._train_queries(codec, pairs), train_groups=groups,
                               query_groups=None if groups is None else list(range(len(pairs)))))
        return out

    def _train_queries(self, codec, pairs) -> list[torch.Tensor]:
        """For methods that learn from queries (distillation), only with `questions` set: the statements cut before
        their answer and the questions in N other wordings; never the evaluation questions. None: no queries."""
        setting = question_setting(self.config.questions)
        if setting is None:
            return []
        return [torch.tensor(codec.encode(text)) for person, a in pairs
                for text in (person.cloze(a), *(person.paraphrase(a, form) for form in range(setting[1])))]

    def _train_groups(self, pairs, first: int = 0) -> list[int] | None:
        """_train_queries' question ids: the statement and its paraphrases ask one question (ids from `first`);
        None without training questions."""
        setting = question_setting(self.config.questions)
        if setting is None:
            return None
        return [first + i for i in range(len(pairs)) for _ in range(1 + setting[1])]

    def _split(self, codec, people, rng) -> Episode:
        """The people dealt over `documents` documents in order (sizes differ by at most one), each a facts prompt
        of its own; the episode is their concatenation with the parts kept."""
        k = self.config.documents
        groups = [people[i * len(people) // k:(i + 1) * len(people) // k] for i in range(k)]
        parts, asked = [], 0
        for group in groups:
            text, pairs, _ = facts_prompt(group, rng)
            groups = self._train_groups(pairs, asked)
            parts.append(Episode(prompt=torch.tensor(codec.encode(text)),
                                 queries=[text_query(codec, *person.question(a)) for person, a in pairs],
                                 train_queries=self._train_queries(codec, pairs), train_groups=groups,
                                 query_groups=None if groups is None else list(range(asked, asked + len(pairs)))))
            asked += len(pairs)
        groups = None if parts[0].train_groups is None else [g for part in parts for g in part.train_groups]
        return Episode(prompt=torch.cat([part.prompt for part in parts]), queries=[q for part in parts for q in part.queries],
                       train_queries=[t for part in parts for t in part.train_queries], train_groups=groups,
                       query_groups=None if groups is None else [g for part in parts for g in part.query_groups],
                       parts=parts)

    @staticmethod
    def _chat(codec, text: str, pairs, example, placement: str = "system") -> tuple[str, list[Query]]:
        """The facts as a chat (chat_document): the facts without the plain prompt's worked example, which becomes
        the chat's first exchange; each query asks one pair."""
        return chat_document(codec, text[: text.index("\n\nQ:")], example[0].question(example[1]),
                             [person.question(attribute) for person, attribute in pairs], placement)


def _bare(question: str) -> str:
    """A plain-format question ("Q: ...\nA:") as a chat user's message."""
    return question_of(question)


def chat_document(codec, document: str, example: tuple[str, str], asked: list[tuple[str, str]],
                  placement: str = "system", remember: tuple[str, str] = ("Remember these facts:", "I will remember them.")
                  ) -> tuple[str, list[Query]]:
    """(prompt text, queries) of a document as a chat, for the text sources' format=chat: the document placed as the
    template places one (system: a system turn, which the template folds into the first user turn where it has no
    system role; user: a `remember[0]` turn and its acknowledgement `remember[1]`), then the worked example (a
    plain-format (question, answer) pair) as a user/assistant exchange; each query is the next user question (an
    `asked` pair's) and the assistant's turn, scored on the answer."""
    question, answer = example
    placed = ([{"role": "system", "content": document}] if placement == "system" else
              [{"role": "user", "content": f"{remember[0]}\n{document}"}, {"role": "assistant", "content": remember[1]}])
    turns = placed + [{"role": "user", "content": _bare(question)}, {"role": "assistant", "content": answer.strip()}]
    prompt = codec.chat(turns, add_generation_prompt=False)
    queries = []
    for q, a in asked:
        full = codec.chat(turns + [{"role": "user", "content": _bare(q)}], add_generation_prompt=True)
        if not full.startswith(prompt):
            raise ValueError("the chat template does not extend a conversation by appending to it")
        queries.append(text_query(codec, full[len(prompt):], a.strip()))
    return prompt, queries


@dataclass
class TopicsConfig:
    shots: int = 4  # labelled demonstrations in the prompt
    queries: int = 8  # articles to classify per episode
    excerpt_words: int = 16
    label_loss: bool = False  # training methods learn only the demonstrations' label tokens
    # bbc: the held-out articles of the default bbc-news split, with the given tokenizer; task: those of the
    # bbc-news task the model was trained on (its split and tokenizer; pass task=)
    articles: Literal["bbc", "task"] = "bbc"
    # random: each episode draws shots + queries articles; validation / test: the held-out articles of each topic
    # are cut in order into validation_per_topic, test_per_topic and a demonstration pool, and every episode asks
    # the whole validation or test set after shots demonstrations drawn from the pool (`queries` is unused)
    query_set: Literal["random", "validation", "test"] = "random"
    validation_per_topic: int = 10
    test_per_topic: int = 30

    def __post_init__(self):
        _positive(self, "shots", "queries", "excerpt_words", "validation_per_topic", "test_per_topic")
        check_choices(self)


class Topics(EpisodeSource):
    name = "topics"
    description = "few-shot BBC News topic classification: k labelled articles in the prompt, label-word scoring"
    metric = "choice"
    config_class = TopicsConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        from .bbc_news import TOPICS, BBCNewsConfig, excerpt, format_example, split_articles

        c = self.config
        if c.articles == "task":
            task = _need(task, "a model trained on the bbc-news task (articles=task)", self.name)
            if not hasattr(task, "heldout_articles"):
                raise ValueError(f"topics articles=task needs the bbc-news task; got {task.name!r}")
            heldout, codec = task.heldout_articles(), tokenizer or task
        else:
            _, heldout = split_articles(BBCNewsConfig())  # never in the training split of the BBC task
            codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        labels = [codec.encode(" " + topic)[0] for topic in TOPICS]
        if len(set(labels)) != len(labels):
            raise ValueError(f"the label words {TOPICS} share first tokens under this tokenizer: {labels}")
        if c.query_set != "random":
            pool, fixed = self._fixed_split(heldout)
        rng = random.Random(f"topics-{seed}")
        content_free = torch.tensor(codec.encode(format_example("")))
        out = []
        for i in range(n):
            if c.query_set == "random":
                chosen = rng.sample(heldout, c.shots + c.queries)
            else:  # one draw per episode, the same for both query sets (as tint-classification's seeds)
                chosen = random.Random(f"{seed}-demos-{i}").sample(pool, c.shots) + fixed
            ids, label_mask = [], []
            for topic, _, body in chosen[: c.shots]:
                part = codec.encode(format_example(excerpt(body, c.excerpt_words)))
                ids += part + [labels[TOPICS.index(topic)]]
                label_mask += [False] * len(part) + [True]
                sep = codec.encode("\n\n")
                ids += sep
                label_mask += [False] * len(sep)
            queries = []
            for topic, _, body in chosen[c.shots:]:
                q = torch.tensor(codec.encode(format_example(excerpt(body, c.excerpt_words))))
                queries.append(self._choice(q, labels, labels[TOPICS.index(topic)]))
            out.append(Episode(prompt=torch.tensor(ids), queries=queries,
                               prompt_loss_mask=torch.tensor(label_mask) if c.label_loss else None,
                               calibration=self._choice(content_free, labels, labels[0])))
        return out

    def _fixed_split(self, heldout: list) -> tuple[list, list]:
        """(demonstration pool, the validation or test articles): per topic, in the held-out order."""
        from .bbc_news import TOPICS

        c = self.config
        v, t = c.validation_per_topic, c.test_per_topic
        by_topic = {topic: [a for a in heldout if a[0] == topic] for topic in TOPICS}
        if any(len(rows) <= v + t for rows in by_topic.values()):
            raise ValueError(f"validation_per_topic + test_per_topic = {v + t} leave no demonstration pool "
                             f"in {min(len(r) for r in by_topic.values())} held-out articles per topic")
        fixed = [a for rows in by_topic.values() for a in (rows[:v] if c.query_set == "validation" else rows[v:v + t])]
        pool = [a for rows in by_topic.values() for a in rows[v + t:]]
        if len(pool) < c.shots:
            raise ValueError(f"the demonstration pool has {len(pool)} articles, fewer than shots={c.shots}")
        return pool, fixed

    @staticmethod
    def _choice(ids: torch.Tensor, labels: list[int], target: int) -> Query:
        targets = torch.zeros_like(ids)
        targets[-1] = target
        mask = torch.zeros(len(ids), dtype=torch.bool)
        mask[-1] = True
        return Query(inputs=ids, targets=targets, mask=mask, choices=torch.tensor(labels))


@dataclass
class ContinuationConfig:
    prompt_tokens: int = 256  # the first part of a held-out passage
    query_tokens: int = 64  # the tokens that follow it, scored by cross-entropy
    # plays: passages of the held-out Shakespeare plays, encoded by the tokenizer; task: windows of the held-out
    # stream of the text task a model was trained on (its own tokenizer and split: `task.validation_windows`)
    passages: Literal["plays", "task"] = "plays"

    def __post_init__(self):
        _positive(self, "prompt_tokens", "query_tokens")
        if self.query_tokens < 2:
            raise ValueError("ContinuationConfig.query_tokens must be >= 2 (one scored prediction)")
        check_choices(self)


_CONTINUATION_DRAWS = 50  # draws of a held-out passage per episode before a too-long passage is an error


class Continuation(EpisodeSource):
    name = "continuation"
    description = "long-document continuation on held-out Shakespeare plays: prompt = a passage, queries = what follows (CE)"
    metric = "ce"
    config_class = ContinuationConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        from .corpora import shakespeare_plays
        from .text import ShakespeareConfig, split_plays

        c = self.config
        if c.passages == "task":
            return self._task_episodes(n, seed, task)
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        plays = shakespeare_plays()
        _, heldout = split_plays(ShakespeareConfig(), plays)  # never in the Shakespeare task's training plays
        need = c.prompt_tokens + c.query_tokens
        def too_long(why: str) -> ValueError:
            return ValueError(f"continuation: no held-out passage holds prompt_tokens + query_tokens = {need} tokens "
                              f"({why}); lower prompt_tokens or query_tokens")

        longest_play = max(len(plays[h]) for h in heldout)
        if need > longest_play:  # a token holds at least one character: no draw could succeed
            raise too_long(f"the longest held-out play has {longest_play} characters")
        rng = random.Random(f"continuation-{seed}")
        out, draws, longest = [], 0, 0
        while len(out) < n:
            if draws >= _CONTINUATION_DRAWS * n:  # never a passage that long: say so, not spin
                raise too_long(f"the longest drawn held {longest}")
            draws += 1
            text = plays[rng.choice(heldout)]
            start = rng.randrange(max(1, len(text) - 12 * need))
            ids = codec.encode(text[start: start + 12 * need])[1:need + 1]  # the first token may be cut
            longest = max(longest, len(ids))
            if len(ids) < need:
                continue
            out.append(self._episode(torch.tensor(ids)))
        return out

    def _episode(self, ids: torch.Tensor) -> Episode:
        query = ids[self.config.prompt_tokens:]
        return Episode(prompt=ids[: self.config.prompt_tokens],
                       queries=[Query(inputs=query[:-1], targets=query[1:], mask=torch.ones(len(query) - 1, dtype=torch.bool))])

    def _task_episodes(self, n: int, seed: int, task) -> list[Episode]:
        task = _need(task, "a model trained on a text task (passages=task)", self.name)
        if not hasattr(task, "validation_windows"):
            raise ValueError(f"continuation passages=task needs a text task with held-out windows; got {task.name!r}")
        need = self.config.prompt_tokens + self.config.query_tokens
        if need > task.sequence_length + 1:
            raise ValueError(f"prompt_tokens + query_tokens = {need} exceed the task's windows ({task.sequence_length + 1} tokens)")
        windows = task.validation_windows(n, torch.Generator().manual_seed(seed))[:, :need]
        return [self._episode(ids) for ids in windows]


# ------------------------------------------------------------------------------------------- task sources


@dataclass
class SplitConfig:
    prompt_fraction: float = 0.5  # share of each sampled sequence that becomes the prompt

    def __post_init__(self):
        if not 0.0 < self.prompt_fraction < 1.0:
            raise ValueError(f"prompt_fraction must lie in (0, 1), got {self.prompt_fraction}")


class TaskSplit(EpisodeSource):
    """Sequences of a training task cut in two: the prompt, then one query scored at the task's own masked
    positions (the model must have been trained on the task)."""

    config_class = SplitConfig

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        task = _need(task, f"a model trained on the {self.task_name!r} task", self.name)
        if task.name != self.task_name:
            raise ValueError(f"task {self.name!r} needs a model trained on {self.task_name!r}; this one knows {task.name!r}")
        generator = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(100):  # draws until n sequences have a scored position in their query
            batch = task.sample(n, generator)
            length = batch.inputs.shape[1]
            cut = self.cut(max(1, min(length - 1, round(self.config.prompt_fraction * length))))
            scored = self.scored(batch, cut)
            for i in range(n):
                if bool(scored[i].any()) and len(out) < n:
                    out.append(Episode(prompt=batch.inputs[i, :cut],
                                       queries=[Query(batch.inputs[i, cut:], batch.targets[i, cut:], scored[i])]))
            if len(out) == n:
                return out
        raise ValueError(f"task {self.name!r}: too few sequences have a scored position after the prompt; "
                         "lower prompt_fraction")

    def cut(self, cut: int) -> int:
        return cut

    def scored(self, batch, cut: int) -> torch.Tensor:
        return batch.mask[:, cut:]


class InductionEpisodes(TaskSplit):
    name = "induction"
    description = "induction heads (ICLCA Table 2): triggers committed in the prompt, scored where only the prompt tells the next token"
    metric = "accuracy"
    task_name = "induction"

    def scored(self, batch, cut):
        from .induction import split_prompt

        return split_prompt(batch, cut)[2]


class RegressionEpisodes(TaskSplit):
    name = "linear_regression"
    description = "in-context linear regression: (x, y) pairs in the prompt, later x's scored by squared error"
    metric = "mse"
    task_name = "linear_regression"

    def cut(self, cut):
        return cut - cut % 2  # whole (x, y) pairs in the prompt


class ArithmeticEpisodes(TaskSplit):
    name = "arithmetic"
    description = "CGT's arithmetic sequences: the first part in the prompt, the rest scored by token accuracy"
    metric = "accuracy"
    task_name = "arithmetic"


