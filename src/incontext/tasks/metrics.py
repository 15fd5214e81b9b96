"""How an episode's queries are scored: one registered object per metric, named by an episode source's `metric`.

A metric scores one query's outputs at its masked positions (`score_query` -> `QueryScore`, sums over the
positions), pools an episode's queries (`episode_score` -> {"score": ..., and extra keys}), and says how it
reads: `higher_is_better`, its table `label`, whether it prints as a percentage, whether the harness also
reports `score_pooled` (over all positions of all episodes), and which episode key `--tune` compares.

    metric = get_metric("exact")
    scores = [metric.score_query(out, query) for out, query in zip(outputs, episode.queries)]
    metric.episode_score(scores)   # {"score": ..., "answer_logprob": ...}

A metric that `generates` (`generated`: the greedy answer contains the gold one) is given each query's greedy
answer by the harness and scores it with `score_answer(out, query, answer)` instead of `score_query`.

A new metric: subclass `Metric`, set the class attributes, implement the two methods and call
`register_metric(MyMetric())` (guide: docs/guides/add-episode-task.md).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F

from ..registry import Registry


class Query(Protocol):
    """What a metric reads of a query (tasks/episodes.py's `Query`, which imports this module)."""

    targets: torch.Tensor  # (N,) next-token ids, or (N, d_output)
    mask: torch.Tensor  # (N,) bool: the scored positions
    choices: torch.Tensor | None  # (C,) candidate token ids (metric "choice")
    answers: tuple[str, ...]  # gold answers as text (metric "generated")
    match: str  # metric "ruler": "all" (the share of the answers present) or "part" (any of them)


@dataclass
class QueryScore:
    """Sums over one query's scored positions; an episode's score pools its queries."""

    correct: float = 0.0  # exact / accuracy / choice
    total: int = 0
    calibrated: float = 0.0  # choice, calibrated
    loss: float = 0.0  # ce (nats) or mse
    logprob: float = 0.0  # exact: log-probability of the whole answer
    exact: float = 0.0  # exact / squad: the answer is right (squad: normalised equal to a gold answer)
    f1: float = 0.0  # generated / squad: token F1 of the greedy answer against the best gold answer
    contains: float = 0.0  # squad: the normalised answer contains a gold answer


class Metric:
    name: ClassVar[str]
    higher_is_better: ClassVar[bool]
    label: ClassVar[str]  # the score column's name in tables and plots
    percent: ClassVar[bool] = False  # a share, printed as a percentage
    pooled: ClassVar[bool] = False  # per-position: the harness also reports score_pooled
    tune_by: ClassVar[str] = "score"  # the episode key --tune compares on validation episodes
    calibrated: ClassVar[bool] = False  # episodes also carry score_calibrated (a table column)
    columns: ClassVar[dict[str, str]] = {}  # other episode keys shown as table columns (percentages): key -> label
    # the harness also generates each query's greedy answer (decoded text) and scores with score_answer
    generates: ClassVar[bool] = False
    description: ClassVar[str] = ""

    @property
    def tune_higher_is_better(self) -> bool:
        return self.higher_is_better if self.tune_by == "score" else True  # log-probabilities: higher is better

    def score_query(self, out: torch.Tensor, query: Query, calibration: torch.Tensor | None = None) -> QueryScore:
        """One query's (N, V) logits or (N, d) predictions scored at its masked positions."""
        raise NotImplementedError

    def score_answer(self, out: torch.Tensor, query: Query, answer: str) -> QueryScore:
        """A metric that `generates`: one query's logits and its greedy answer (text) scored."""
        raise NotImplementedError

    def episode_score(self, scores: list[QueryScore]) -> dict[str, float]:
        """An episode's queries pooled: {"score": ...} and any extra keys (the same keys for every episode)."""
        raise NotImplementedError


def token_scores(out: torch.Tensor, query: Query) -> QueryScore:
    """Hits, summed negative log-likelihood and whether every masked position is right (token outputs)."""
    mask = query.mask
    targets = query.targets[mask]
    log_probs = F.log_softmax(out[mask].double(), -1)
    hits = out[mask].argmax(-1) == targets
    loss = float(-log_probs.gather(-1, targets[:, None]).sum())
    return QueryScore(correct=float(hits.sum()), total=int(mask.sum()), loss=loss, logprob=-loss,
                      exact=float(bool(hits.all())))


def choice_scores(logits: torch.Tensor, query: Query) -> torch.Tensor:
    """Log-probabilities of the query's candidate tokens at its last masked position."""
    position = int(query.mask.nonzero().max())
    return F.log_softmax(logits[position].double(), -1)[query.choices]


class ExactMatch(Metric):
    name = "exact"
    higher_is_better = True
    label = "exact match %"
    percent = True
    tune_by = "answer_logprob"  # exact match is mostly 0/1 ties on a few episodes
    description = "1 if the greedy answer is the target (teacher-forced argmax at every masked position)"

    def score_query(self, out, query, calibration=None):
        return token_scores(out, query)

    def episode_score(self, scores):
        return {"score": sum(s.exact for s in scores) / len(scores),
                "answer_logprob": sum(s.logprob for s in scores) / len(scores)}


class Accuracy(Metric):
    name = "accuracy"
    higher_is_better = True
    label = "accuracy %"
    percent = True
    pooled = True
    description = "share of masked positions whose argmax is the target"

    def score_query(self, out, query, calibration=None):
        return token_scores(out, query)

    def episode_score(self, scores):
        return {"score": sum(s.correct for s in scores) / sum(s.total for s in scores)}


class Choice(Metric):
    name = "choice"
    higher_is_better = True
    label = "accuracy %"
    percent = True
    calibrated = True
    description = "the candidate token with the highest log-probability (calibrated: minus a content-free query's)"

    def score_query(self, out, query, calibration=None):
        scores = choice_scores(out, query)
        truth = int((query.choices == int(query.targets[int(query.mask.nonzero().max())])).nonzero()[0])
        s = QueryScore(correct=float(int(scores.argmax()) == truth), total=1)
        if calibration is not None:
            s.calibrated = float(int((scores - calibration).argmax()) == truth)
        return s

    def episode_score(self, scores):
        total = sum(s.total for s in scores)
        return {"score": sum(s.correct for s in scores) / total,
                "score_calibrated": sum(s.calibrated for s in scores) / total}


class CrossEntropy(Metric):
    name = "ce"
    higher_is_better = False
    label = "CE (nats)"
    pooled = True
    description = "mean cross-entropy of the masked targets"

    def score_query(self, out, query, calibration=None):
        return token_scores(out, query)

    def episode_score(self, scores):
        return {"score": sum(s.loss for s in scores) / sum(s.total for s in scores)}


class MeanSquaredError(CrossEntropy):
    name = "mse"
    label = "MSE"
    description = "mean squared error at the masked positions (vector tasks)"

    def score_query(self, out, query, calibration=None):
        mask = query.mask
        loss = float(((out[mask].double() - query.targets[mask].double()) ** 2).mean(-1).sum())
        return QueryScore(total=int(mask.sum()), loss=loss)


_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, no punctuation, no articles (a, an, the), whitespace collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def answer_contains(prediction: str, gold: str) -> bool:
    """Whether the normalised gold answer is a run of whole words of the normalised prediction ("1950" is not
    in "19500"); an answer that normalises to nothing is never contained."""
    gold = normalize_answer(gold)
    return bool(gold) and f" {gold} " in f" {normalize_answer(prediction)} "


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD's token F1 of the normalised words (1 when both are empty, 0 when one is)."""
    p, g = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = sum((Counter(p) & Counter(g)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(g)
    return 2 * precision * recall / (precision + recall)


class Generated(Metric):
    name = "generated"
    higher_is_better = True
    label = "contains %"
    percent = True
    columns = {"f1": "token F1 %"}
    generates = True
    tune_by = "answer_logprob"  # contains is 0/1 per question: log-probabilities separate settings on few episodes
    description = ("the greedy answer (to a newline, the end of the turn or max_answer_tokens) contains a gold answer, "
                   "both normalised as SQuAD's (lowercase, no punctuation or articles); also token F1")

    def score_query(self, out, query, calibration=None):
        raise ValueError("metric 'generated' scores a generated answer: the harness calls score_answer")

    def score_answer(self, out, query, answer):
        s = token_scores(out, query)  # teacher-forced: the first gold answer's log-probability
        s.correct = float(any(answer_contains(answer, gold) for gold in query.answers))
        s.f1 = max((token_f1(answer, gold) for gold in query.answers), default=0.0)
        s.total = 1
        return s

    def episode_score(self, scores):
        return {"score": sum(s.correct for s in scores) / len(scores), "f1": sum(s.f1 for s in scores) / len(scores),
                "answer_logprob": sum(s.logprob for s in scores) / len(scores)}


class SquadScore(Generated):
    name = "squad"
    label = "F1 %"
    columns = {"em": "EM %", "contains": "contains %"}
    description = ("SQuAD's official scoring of the greedy answer: token F1 and exact match, each the best over the gold "
                   "answers after normalising (lowercase, no punctuation or articles, whitespace collapsed); also the "
                   "share of answers that contain a gold answer")

    def score_answer(self, out, query, answer):
        s = super().score_answer(out, query, answer)
        s.contains, s.exact = s.correct, float(any(exact_match(answer, gold) for gold in query.answers))
        return s

    def episode_score(self, scores):
        n = len(scores)
        return {"score": sum(s.f1 for s in scores) / n, "em": sum(s.exact for s in scores) / n,
                "contains": sum(s.contains for s in scores) / n,
                "answer_logprob": sum(s.logprob for s in scores) / n}


def exact_match(prediction: str, gold: str) -> bool:
    """SQuAD's exact match: the normalised strings are equal."""
    return normalize_answer(prediction) == normalize_answer(gold)


def string_match(prediction: str, references: tuple[str, ...], match: str = "all") -> float:
    """RULER's string match (its eval/synthetic/constants.py): "all", the share of the references that occur in the
    prediction (case-insensitive substrings; niah, vt); "part", 1 when any does (qa)."""
    found = [r.lower() in prediction.lower() for r in references]
    if match == "part":
        return float(any(found))
    return sum(found) / len(found)


class RulerScore(Generated):
    name = "ruler"
    label = "string match %"
    columns = {}
    description = ("RULER's string match of the greedy answer: the share of the expected values it contains "
                   "(case-insensitive; qa tasks: 1 when it contains any gold answer)")

    def score_answer(self, out, query, answer):
        s = token_scores(out, query)
        s.correct, s.total = string_match(answer, query.answers, query.match), 1
        return s

    def episode_score(self, scores):
        n = len(scores)
        return {"score": sum(s.correct for s in scores) / n, "answer_logprob": sum(s.logprob for s in scores) / n}


METRICS: Registry[Metric] = Registry("metric")


def register_metric(metric: Metric) -> Metric:
    """Register `metric` under its name (ValueError where the name holds another metric)."""
    return METRICS.register(metric.name, metric)


def get_metric(name: str) -> Metric:
    return METRICS.get(name)


for _metric in (ExactMatch(), Accuracy(), Choice(), CrossEntropy(), MeanSquaredError(), Generated(), SquadScore(),
                RulerScore()):
    register_metric(_metric)
