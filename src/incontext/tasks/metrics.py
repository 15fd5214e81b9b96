"""How an episode's queries are scored: one registered object per metric, named by an episode source's `metric`.

A metric scores one query's outputs at its masked positions (`score_query` -> `QueryScore`, sums over the
positions), pools an episode's queries (`episode_score` -> {"score": ..., and extra keys}), and says how it
reads: `higher_is_better`, its table `label`, whether it prints as a percentage, whether the harness also
reports `score_pooled` (over all positions of all episodes), and which episode key `--tune` compares.

    metric = get_metric("exact")
    scores = [metric.score_query(out, query) for out, query in zip(outputs, episode.queries)]
    metric.episode_score(scores)   # {"score": ..., "answer_logprob": ...}

A new metric: subclass `Metric`, set the class attributes, implement the two methods and call
`register_metric(MyMetric())` (guide: docs/guides/add-episode-task.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F


class Query(Protocol):
    """What a metric reads of a query (tasks/episodes.py's `Query`, which imports this module)."""

    targets: torch.Tensor  # (N,) next-token ids, or (N, d_output)
    mask: torch.Tensor  # (N,) bool: the scored positions
    choices: torch.Tensor | None  # (C,) candidate token ids (metric "choice")


@dataclass
class QueryScore:
    """Sums over one query's scored positions; an episode's score pools its queries."""

    correct: float = 0.0  # exact / accuracy / choice
    total: int = 0
    calibrated: float = 0.0  # choice, calibrated
    loss: float = 0.0  # ce (nats) or mse
    logprob: float = 0.0  # exact: log-probability of the whole answer
    exact: float = 0.0


class Metric:
    name: ClassVar[str]
    higher_is_better: ClassVar[bool]
    label: ClassVar[str]  # the score column's name in tables and plots
    percent: ClassVar[bool] = False  # a share, printed as a percentage
    pooled: ClassVar[bool] = False  # per-position: the harness also reports score_pooled
    tune_by: ClassVar[str] = "score"  # the episode key --tune compares on validation episodes
    calibrated: ClassVar[bool] = False  # episodes also carry score_calibrated (a table column)
    description: ClassVar[str] = ""

    @property
    def tune_higher_is_better(self) -> bool:
        return self.higher_is_better if self.tune_by == "score" else True  # log-probabilities: higher is better

    def score_query(self, out: torch.Tensor, query: Query, calibration: torch.Tensor | None = None) -> QueryScore:
        """One query's (N, V) logits or (N, d) predictions scored at its masked positions."""
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


METRICS: dict[str, Metric] = {}


def register_metric(metric: Metric) -> Metric:
    if metric.name in METRICS and type(METRICS[metric.name]) is not type(metric):
        raise ValueError(f"metric {metric.name!r} is already registered to {type(METRICS[metric.name]).__name__}")
    METRICS[metric.name] = metric
    return metric


def get_metric(name: str) -> Metric:
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}; registered: {', '.join(sorted(METRICS))}")
    return METRICS[name]


for _metric in (ExactMatch(), Accuracy(), Choice(), CrossEntropy(), MeanSquaredError()):
    register_metric(_metric)
