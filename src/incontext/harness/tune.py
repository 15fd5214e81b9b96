"""--tune: each candidate value of a method's option run on validation episodes (never the test split), the best by the
metric's tuning key (exact match: the answers' log-probability, which separates settings on few episodes) kept."""

from __future__ import annotations

import math
from typing import Any

from ..tasks.metrics import get_metric
from .compare import compare


def tune(model, source, validation: list, method_options: dict[str, dict[str, Any]], candidates: dict[str, list[Any]],
         *, codec=None, speed=None, writer=None, validation_seed: int | None = None) -> dict[str, Any]:
    """For each "method.option" of `candidates`, every value compared on `validation` (one method at a time, no
    references); the best value is set in `method_options` (in place). Returns the record of each choice."""
    metric = get_metric(source.metric)
    tuning = {}
    for key, values in candidates.items():
        name, option = key.split(".", 1)
        scores = {}
        for value in values:
            row = compare(model, source, validation, {name: {**method_options[name], option: value}}, progress=False,
                          references=False, codec=codec, speed=speed, writer=writer)[-1]
            scores[repr(value)] = row[metric.tune_by]["mean"] if row["status"] == "ok" else None  # e.g. exact: log-prob
        valid = [(s, v) for v, s in zip(values, scores.values()) if s is not None and math.isfinite(s)]
        if valid:
            best = (max if metric.tune_higher_is_better else min)(valid, key=lambda sv: sv[0])[1]
            method_options[name][option] = best
        tuning[key] = {"criterion": metric.tune_by, "validation_scores": scores, "chosen": method_options[name].get(option),
                       "validation_episodes": len(validation), "validation_seed": validation_seed}
    return tuning
