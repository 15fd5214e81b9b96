"""The absorb harness: every method on the same model and episodes, one table.

    rows = compare(model, source, episodes, {"keep-prompt": {}, "drop-prompt": {}, "iclca": {}})

For each method and episode: absorb the prompt (timed), run each query alone (timed), score it with the
source's metric and compare its logits with the prompted model's (keep-prompt, always computed as the
reference). Per method the result holds:

- `score`: the task score (the source's metric, `tasks/metrics.py`) as a mean over episodes with a 95% t-interval (`score_calibrated` too for "choice";
  `answer_logprob` for "exact"; `f1` and `answer_logprob` for "generated", the one metric that also generates each
  query's greedy answer from the adapted model, untimed); for the per-position metrics (accuracy, ce, mse) also `score_pooled`, the
  score over all scored positions of all episodes (episodes weighted by their positions, as token accuracy
  and perplexity are usually reported);
- `agreement` with the prompted model on the scored query positions: top-1 agreement, mean
  KL(prompted || method) in nats, and the relative Frobenius error of the query's logits (mean over queries,
  and its standard deviation);
- costs: `absorb_ms` per prompt and `query_ms` per query (medians of CPU time per thread, i.e. process CPU
  time / torch threads, which a shared machine's load distorts far less than wall-clock; CUDA events on a
  GPU), `kept_bytes` per prompt (what the method stores beyond the base model: a K/V cache, a state, a
  weight copy, factors) and `peak_bytes` (the largest memory growth seen while absorbing: sampled resident
  memory on CPU, the allocator's peak on CUDA).

Methods run interleaved (episode i starts with method i mod k), so load on the machine spreads over all of
them. A method that does not apply reports "n/a" with its reason; one that fails on an episode reports the
error instead of stopping the comparison.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..stats import t_interval95
from ..tasks.episodes import Episode, EpisodeSource, Query
from ..tasks.metrics import choice_scores, get_metric
from .base import get_absorb_method
from .generation import greedy_answers

REFERENCE = "keep-prompt"


# ------------------------------------------------------------------------------------------- measuring


class CostTimer:
    """Times a call as CPU time per thread (CPU) or with CUDA events (GPU), in milliseconds."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return out, start.elapsed_time(end)
        threads = max(1, torch.get_num_threads())
        start = time.process_time()
        out = fn()
        return out, 1000 * (time.process_time() - start) / threads


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class PeakMemory:
    """Largest memory growth during a block: CUDA allocator peak, or resident memory sampled every 2 ms
    (Linux; None elsewhere). Sampling can miss a spike shorter than the interval."""

    def __init__(self, device: torch.device):
        self.cuda, self.peak = device.type == "cuda", None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            self.start = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return self
        self.start = _resident_bytes()
        self.highest, self.stop = self.start, threading.Event()
        if self.start is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        while not self.stop.wait(0.002):
            now = _resident_bytes()
            if now is not None and now > self.highest:
                self.highest = now

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        elif self.start is not None:
            self.stop.set()
            self.thread.join()
            now = _resident_bytes()
            self.peak = max(self.highest, now if now is not None else 0) - self.start
        return False


# ------------------------------------------------------------------------------------------- agreement


def agreement(out: torch.Tensor, reference: torch.Tensor, query: Query, tokens: bool) -> dict[str, float]:
    """Top-1 agreement and KL(reference || out) summed over the scored positions (with their count), and the
    relative Frobenius error of the whole query's outputs."""
    relative = float((out.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-300))
    if not tokens:
        return {"relative": relative}
    mask = query.mask
    p, q = F.log_softmax(reference[mask].double(), -1), F.log_softmax(out[mask].double(), -1)
    kl = float((p.exp() * (p - q)).sum())
    top1 = float((reference[mask].argmax(-1) == out[mask].argmax(-1)).sum())
    return {"relative": relative, "kl_sum": kl, "top1_sum": top1, "positions": int(mask.sum())}


# ------------------------------------------------------------------------------------------- the harness


@dataclass
class MethodRecord:
    name: str
    options: dict[str, Any]
    status: str = "ok"  # ok | n/a | failed
    reason: str = ""
    episode_scores: list[dict[str, float]] = field(default_factory=list)
    episode_positions: list[int] = field(default_factory=list)
    agreements: list[dict[str, float]] = field(default_factory=list)
    absorb_ms: list[float] = field(default_factory=list)
    query_ms: list[float] = field(default_factory=list)
    kept_bytes: list[int] = field(default_factory=list)
    peak_bytes: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    part_scores: list[list[float]] = field(default_factory=list)  # composed rows: per episode, the score per part
    alone_scores: list[list[float]] = field(default_factory=list)  # ... and each part's score absorbed alone

    def failed(self, index: int, error: Exception, max_failures: int) -> None:
        """An episode's error noted; the method is marked failed after max_failures, or when the first fails."""
        self.errors.append(f"episode {index}: {type(error).__name__}: {error}")
        if len(self.errors) >= max_failures or (index == 0 and not self.episode_scores):
            self.status, self.reason = "failed", self.errors[0]

    def summary(self, metric: str, per_episode: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {"method": self.name, "options": self.options, "status": self.status, "reason": self.reason}
        if self.status != "ok":
            return row
        if per_episode:  # for paired statistics across methods (episodes that failed are left out)
            row["episode_scores"], row["episode_positions"] = list(self.episode_scores), list(self.episode_positions)
        for key in self.episode_scores[0]:
            row[key] = t_interval95([s[key] for s in self.episode_scores])
        if get_metric(metric).pooled:
            weights = self.episode_positions
            row["score_pooled"] = sum(s["score"] * w for s, w in zip(self.episode_scores, weights)) / sum(weights)
        positions = sum(a.get("positions", 0) for a in self.agreements)
        row["agreement"] = None if not self.agreements else {
            "top1": sum(a["top1_sum"] for a in self.agreements) / positions if positions else None,
            "kl": sum(a["kl_sum"] for a in self.agreements) / positions if positions else None,
            "relative_logits_error": statistics.fmean(a["relative"] for a in self.agreements),
            "relative_logits_error_std": statistics.stdev(a["relative"] for a in self.agreements) if len(self.agreements) > 1 else 0.0,
        }
        row["absorb_ms"] = statistics.median(self.absorb_ms)
        row["query_ms"] = statistics.median(self.query_ms)
        row["kept_bytes"] = int(statistics.median(self.kept_bytes))
        peaks = [p for p in self.peak_bytes if p is not None]
        row["peak_bytes"] = max(peaks) if peaks else None
        if self.part_scores:
            composed = [statistics.fmean(s) for s in zip(*self.part_scores)]
            alone = [statistics.fmean(s) for s in zip(*self.alone_scores)]
            row["composition"] = {"composed": composed, "alone": alone,
                                  "ratio": [c / a if a else None for c, a in zip(composed, alone)]}
        if self.errors:
            row["failed_episodes"] = len(self.errors)
            row["first_error"] = self.errors[0]
        return row


def _model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _as_model_input(x: torch.Tensor, model: nn.Module) -> torch.Tensor:
    p = next(model.parameters())
    x = x.to(p.device)
    return x.to(p.dtype) if x.is_floating_point() else x


def method_name(label: str) -> str:
    """A row label is a method name, optionally with a variant after a colon ("iclca-approx:m64")."""
    return label.split(":", 1)[0]


def _on_model(query: Query, model: nn.Module) -> Query:
    """The query on the model's device, its inputs in the model's dtype."""
    device = _model_device(model)
    choices = None if query.choices is None else query.choices.to(device)
    return dataclasses.replace(query, inputs=_as_model_input(query.inputs, model), targets=query.targets.to(device),
                               mask=query.mask.to(device), choices=choices)


def compare(model: nn.Module, source: EpisodeSource, episodes: list[Episode], methods: dict[str, dict[str, Any]], *,
            progress: bool = True, max_failures: int = 3, references: bool = True,
            per_episode: bool = False, codec=None) -> list[dict[str, Any]]:
    """Runs every method on every episode; returns one summary row per method, in the order given, after
    keep-prompt and drop-prompt (always included unless `references=False`, which also skips agreement).
    `per_episode` adds each episode's scores and scored positions to the rows. `codec` (the model's tokenizer) goes
    to every absorb (`absorb(..., codec=)`: a data stage writes questions with it), as `incontext absorb`
    gives it, so both run the same algorithm.
    `methods` maps a row label (a method name, or "name:variant" for several settings of one method) to the
    method's options. See the module docstring for the fields."""
    if not episodes:
        raise ValueError("no episodes to compare on")
    if not (hasattr(codec, "encode") and hasattr(codec, "decode")):
        codec = None  # a model without a tokenizer (or a task's vector codec): no data stage writes text
    if references:
        methods = {REFERENCE: methods.get(REFERENCE, {}), "drop-prompt": methods.get("drop-prompt", {}),
                   **{k: v for k, v in methods.items() if k not in (REFERENCE, "drop-prompt")}}
    model.eval()
    metric = get_metric(source.metric)
    device = _model_device(model)
    tokens = getattr(model.config, "tokens", True)
    timer = CostTimer(device)
    records = {label: MethodRecord(label, options) for label, options in methods.items()}
    instances = {}
    for label, options in methods.items():
        method = get_absorb_method(method_name(label), **options)  # unknown names and options fail here, before any work
        reason = method.unsupported(model)
        if reason is not None:
            records[label].status, records[label].reason = "n/a", reason
        else:
            instances[label] = method
        if method.needs_train_groups and any(e.train_groups is None for e in episodes):  # before any work
            raise ValueError(f"{label}: wording_ensemble=true groups the training queries by question, and task "
                             f"{source.name!r} gives no groups")
    from tqdm.auto import tqdm

    names = list(instances)
    # methods that compose (kv-prefix, distill-lora) on episodes made of parts: a "composed" row each
    composed = {name: f"{name} (composed)" for name in names
                if callable(getattr(instances[name], "compose", None)) and any(e.parts for e in episodes)}
    for name, label in composed.items():
        records[label] = MethodRecord(label, dict(methods[name]))
    if not names:
        reasons = "; ".join(f"{label}: {records[label].reason}" for label in methods)
        raise ValueError(f"no compared method applies to this model ({reasons})")
    for index, episode in enumerate(tqdm(episodes, desc=f"{source.name} episodes", disable=not progress)):
        prompt = _as_model_input(episode.prompt, model)
        loss_mask = None if episode.prompt_loss_mask is None else episode.prompt_loss_mask.to(device)
        queries = [_on_model(q, model) for q in episode.queries]
        calibration_query = None if episode.calibration is None else _on_model(episode.calibration, model)
        train = [_as_model_input(t, model) for t in episode.train_queries]
        order = names[index % len(names):] + names[: index % len(names)]
        outputs: dict[str, list[torch.Tensor]] = {}
        for name in order:
            record = records[name]
            if record.status != "ok":
                continue
            adapted = None
            try:
                with PeakMemory(device) as peak:
                    adapted, absorb_ms = timer(lambda: instances[name].absorb(
                        model, prompt, loss_mask=loss_mask, train_queries=train, codec=codec,
                        train_groups=episode.train_groups))
                adapted.eval()
                with torch.no_grad():
                    if index == 0:
                        adapted(queries[0].inputs[None])  # warm-up, untimed (first calls allocate and dispatch)
                    outs = _answer(adapted, queries, timer, record)
                    answers = greedy_answers(adapted, queries, codec) if metric.generates else None  # untimed
                    calibration = None if calibration_query is None else \
                        choice_scores(adapted(calibration_query.inputs[None])[0], calibration_query)
                record.absorb_ms.append(absorb_ms)
                record.kept_bytes.append(adapted.kept_bytes(instances[name].runs_on(model)))
                record.peak_bytes.append(peak.peak)
                scores = [metric.score_query(out, q, calibration) for out, q in zip(outs, queries)] if answers is None \
                    else [metric.score_answer(out, q, a) for out, q, a in zip(outs, queries, answers)]
                record.episode_scores.append(metric.episode_score(scores))
                record.episode_positions.append(sum(s.total for s in scores))
                outputs[name] = outs
            except (ValueError, RuntimeError, FloatingPointError, NotImplementedError) as error:
                record.failed(index, error, max_failures)
            adapted = None  # free the adapted weights before the next method
        for name, label in composed.items():
            if records[label].status == "ok" and episode.parts:
                _composed_episode(records[label], instances[name], model, episode, queries, metric, timer,
                                  device, outputs, index, max_failures, codec)
        if not references:
            continue
        reference = outputs.get(REFERENCE)
        if reference is None:
            if records[REFERENCE].status == "n/a":  # e.g. a CGT run: no prompted reference, no agreement columns
                continue
            raise ValueError(f"the reference method {REFERENCE} failed on {records[REFERENCE].errors[-1]}")
        for name, outs in outputs.items():
            records[name].agreements += [agreement(o, r, q, tokens) for o, r, q in zip(outs, reference, queries)]
    labels = [label for name in methods for label in (name, composed.get(name)) if label is not None]
    return [records[label].summary(source.metric, per_episode) for label in labels]


def _answer(adapted, queries: list[Query], timer: CostTimer, record: MethodRecord) -> list[torch.Tensor]:
    """Each query run alone through the adapted model (timed into the record); non-finite outputs refused."""
    outs = []
    for q in queries:
        out, ms = timer(lambda: adapted(q.inputs[None])[0])
        if not bool(torch.isfinite(out).all()):
            raise FloatingPointError("non-finite outputs")
        outs.append(out)
        record.query_ms.append(ms)
    return outs


def _composed_episode(record: MethodRecord, method, model: nn.Module, episode: Episode, queries: list[Query],
                      metric, timer: CostTimer, device: torch.device, outputs: dict, index: int,
                      max_failures: int, codec=None) -> None:
    """Each part of the episode absorbed alone (timed together with composing them), every query answered by the
    parts composed; each part's own queries also answered by that part absorbed alone, the reference of
    composition (a composed part should recall what it recalls alone)."""
    try:
        with PeakMemory(device) as peak:
            alone, absorb_ms = [], 0.0
            for part in episode.parts:
                train = [_as_model_input(t, model) for t in part.train_queries]
                adapted, ms = timer(lambda: method.absorb(model, _as_model_input(part.prompt, model),
                                                          train_queries=train, codec=codec,
                                                          train_groups=part.train_groups))
                alone.append(adapted.eval())
                absorb_ms += ms
            combined, ms = timer(lambda: method.compose(alone))
            absorb_ms += ms
        combined.eval()
        with torch.no_grad():
            outs = _answer(combined, queries, timer, record)
            scores = [metric.score_query(out, q) for out, q in zip(outs, queries)]
            part_scores, alone_scores, start = [], [], 0
            for part, adapted in zip(episode.parts, alone):
                own = [_on_model(q, model) for q in part.queries]
                part_scores.append(metric.episode_score(scores[start:start + len(own)])["score"])
                alone_scores.append(metric.episode_score([metric.score_query(adapted(q.inputs[None])[0], q)
                                                           for q in own])["score"])
                start += len(own)
        record.absorb_ms.append(absorb_ms)
        record.kept_bytes.append(combined.kept_bytes(method.runs_on(model)))
        record.peak_bytes.append(peak.peak)
        record.episode_scores.append(metric.episode_score(scores))
        record.episode_positions.append(sum(s.total for s in scores))
        record.part_scores.append(part_scores)
        record.alone_scores.append(alone_scores)
        outputs[record.name] = outs
    except (ValueError, RuntimeError, FloatingPointError, NotImplementedError) as error:
        record.failed(index, error, max_failures)
