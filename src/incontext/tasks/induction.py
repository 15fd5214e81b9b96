"""The induction-head task of Bietti et al. 2023 ("Birth of a transformer: a memory viewpoint"), as used by
the ICLCA paper (Table 2).

Sequences are over 52 "letters" (ids 0..51, shown as a..z A..Z). A fixed set of trigger tokens (default
a, b, c, d, e) each get an "output" token per sequence: a trigger's successor is random at its first
occurrence, then fixed for the rest of the sequence. A sequence is drawn position by position:

- a position that follows a trigger is forced: it holds that trigger's output (drawn once per sequence,
  uniformly among the non-trigger tokens, so an output is never itself a trigger);
- any other position is, with probability `trigger_prob`, a trigger drawn uniformly among the triggers,
  and otherwise a non-trigger token drawn uniformly.

Bietti et al. draw the non-trigger tokens from a bigram model of Shakespeare; here they are i.i.d. uniform,
so the only structure a model can learn is the induction rule. Since forced positions are never triggers,
about trigger_prob / (1 + trigger_prob) of all positions are triggers.

    cdaXqbrTcdxa... -> after the second 'c' the model must predict 'd' (copied from "cd" earlier)

The positions scored by `evaluate` (the batch mask) are the later occurrences of triggers, the "committed"
triggers whose next token is determined by the context. The training loss is, by default
(train_loss="all"), the ordinary language-model cross-entropy over all positions: the model has to learn the
induction mechanism from the full sequences, as in Bietti et al. With train_loss="committed" it is the
cross-entropy at the committed triggers only (the scored positions): the loss then carries only the induction
signal, not the noise of predicting the i.i.d. filler tokens. Evaluation is the same either way. For the ICLCA experiment, `split_prompt` cuts sequences into a prompt and
a query and marks the query positions that only the prompt makes predictable.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from ..config import check_choices
from .base import Batch, Predictor, TokenTask, check_positive_int
from .registry import register_task

VOCAB = string.ascii_lowercase + string.ascii_uppercase  # id i <-> VOCAB[i]
CHAR_TO_ID = {char: i for i, char in enumerate(VOCAB)}
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index
TrainLoss = Literal["all", "committed"]  # "all": next-token loss at every position; "committed": at committed triggers only
TRAIN_LOSSES = get_args(TrainLoss)
IMPOSSIBLE_LOGIT = -1e9  # what the Bayes-optimal baseline gives tokens of probability 0 (finite: no NaN in CE)


def encode(text: str) -> list[int]:
    return [CHAR_TO_ID[char] for char in text]


def decode(ids: list[int] | torch.Tensor) -> str:
    """Token ids -> letters (ids must be < 52; a larger vocab_size has no letters for its extra ids)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    for i in ids:
        if not 0 <= i < len(VOCAB):
            raise ValueError(f"token id {i} has no letter (VOCAB has {len(VOCAB)} letters)")
    return "".join(VOCAB[i] for i in ids)


def to_strings(inputs: torch.Tensor) -> list[str]:
    """(B, T) token ids -> B strings."""
    return [decode(row) for row in inputs.tolist()]


@dataclass
class InductionConfig:
    vocab_size: int = 52
    n_triggers: int = 5
    seq_len: int = 256
    trigger_prob: float = 0.1  # P(a position not forced to be an output holds a trigger)
    triggers: tuple[int, ...] | None = None  # the trigger ids; None: the first n_triggers ids (a, b, c, d, e)
    train_loss: TrainLoss = "all"

    def __post_init__(self):
        for name in ("vocab_size", "n_triggers", "seq_len"):
            check_positive_int(self, name)
        if self.seq_len < 2:
            raise ValueError(f"InductionConfig.seq_len must be >= 2 (a next token to predict), got {self.seq_len}")
        if self.n_triggers >= self.vocab_size:
            raise ValueError(
                f"InductionConfig.n_triggers must be < vocab_size (outputs are non-trigger tokens), "
                f"got n_triggers={self.n_triggers}, vocab_size={self.vocab_size}"
            )
        check_choices(self)
        p = self.trigger_prob
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:  # `not <` also rejects NaN
            raise ValueError(f"InductionConfig.trigger_prob must be a number in (0, 1), got {p!r}")
        self.trigger_prob = float(p)
        if self.triggers is not None:
            triggers = tuple(self.triggers)  # lists (from YAML) become tuples
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab_size for t in triggers):
                raise ValueError(
                    f"InductionConfig.triggers must be token ids in [0, {self.vocab_size}), got {self.triggers!r}"
                )
            if len(set(triggers)) != len(triggers):
                raise ValueError(f"InductionConfig.triggers must be distinct, got {self.triggers!r}")
            if len(triggers) != self.n_triggers:
                raise ValueError(
                    f"InductionConfig.triggers has {len(triggers)} ids but n_triggers={self.n_triggers}; "
                    f"set n_triggers={len(triggers)} too"
                )
            self.triggers = triggers

    @property
    def trigger_ids(self) -> tuple[int, ...]:
        return self.triggers if self.triggers is not None else tuple(range(self.n_triggers))

    @property
    def non_trigger_ids(self) -> tuple[int, ...]:
        triggers = set(self.trigger_ids)
        return tuple(i for i in range(self.vocab_size) if i not in triggers)


@register_task("induction")
class Induction(TokenTask):
    config_class = InductionConfig
    config: InductionConfig

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """Batch with, besides inputs / targets (next token, last = IGNORE_INDEX) / mask, the info:

        - "outputs" (B, n_triggers) int64: each trigger's output in that sequence, -1 if the trigger never
          occurs (a trigger that occurs only at the last position still has its drawn output here);
        - "committed" (B, T) bool, equal to the mask: inputs[t] is a trigger that already occurred before t,
          so targets[t] is its output. The last position is never committed (its target is ignored);
        - "trigger_position" (B, T) int64: where inputs[t] is a trigger, the position of that trigger's first
          occurrence (t itself at the first occurrence); -1 at non-trigger positions.
        """
        cfg, B, T, K = self.config, batch_size, self.config.seq_len, self.config.n_triggers
        device = generator.device
        trigger_ids = torch.tensor(cfg.trigger_ids, device=device)
        non_trigger_ids = torch.tensor(cfg.non_trigger_ids, device=device)
        N = len(non_trigger_ids)

        outputs = non_trigger_ids[torch.randint(0, N, (B, K), generator=generator, device=device)]
        wants_trigger = torch.rand(B, T, generator=generator, device=device, dtype=torch.float64) < cfg.trigger_prob
        choice = torch.randint(0, K, (B, T), generator=generator, device=device)  # which trigger, if one
        filler = non_trigger_ids[torch.randint(0, N, (B, T), generator=generator, device=device)]

        # A position is a trigger iff it wants one and does not follow a trigger. Inside a run of consecutive
        # wanting positions that alternates trigger, forced output, trigger, ...: the positions at even
        # offsets from the run's start are the triggers.
        position = torch.arange(T, device=device)
        last_not_wanting = torch.where(wants_trigger, -1, position).cummax(dim=1).values
        is_trigger = wants_trigger & ((position - last_not_wanting - 1) % 2 == 0)
        forced = torch.zeros_like(is_trigger)
        forced[:, 1:] = is_trigger[:, :-1]
        previous_choice = torch.zeros_like(choice)
        previous_choice[:, 1:] = choice[:, :-1]
        inputs = torch.where(is_trigger, trigger_ids[choice], filler)
        inputs = torch.where(forced, outputs.gather(1, previous_choice), inputs)

        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, :-1] = inputs[:, 1:]

        first = first_occurrences(inputs, trigger_ids)  # (B, K), -1 where absent
        trigger_position = torch.where(is_trigger, first.gather(1, choice), -1)
        committed = is_trigger & (trigger_position < position)
        committed[:, -1] = False

        info = {
            "outputs": torch.where(first >= 0, outputs, -1),
            "committed": committed,
            "trigger_position": trigger_position,
        }
        return Batch(inputs=inputs, targets=targets, mask=committed.clone(), info=info)

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Next-token cross-entropy of the (B, T, V) logits.

        train_loss="all": over ALL positions (all but the ignored last one). Unlike the base protocol (a mean
        over the mask), this is language-model training on the full sequences, as in Bietti et al.: the model
        must learn the induction mechanism from the whole sequence; the mask only selects what `evaluate`
        scores. train_loss="committed": the mean over the committed triggers (the mask) only; 0 (with a
        gradient) for a batch without any.
        """
        logits = outputs.to(torch.promote_types(outputs.dtype, torch.float32))  # half-precision logits: float32 loss
        targets = batch.targets
        if self.config.train_loss == "committed":
            if not batch.mask.any():
                return logits.sum() * 0.0
            targets = torch.where(batch.mask, targets, IGNORE_INDEX)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        """At the committed-trigger positions (the mask): argmax accuracy, their count, and their mean
        cross-entropy. Accuracy and loss are NaN when the batch has no committed trigger."""
        mask = batch.mask
        n_scored = int(mask.sum().item())
        if n_scored == 0:
            return {"accuracy": math.nan, "n_scored": 0.0, "loss_committed": math.nan}
        logits = outputs[mask]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        targets = batch.targets[mask]
        return {
            "accuracy": (logits.argmax(dim=-1) == targets).float().mean().item(),
            "n_scored": float(n_scored),
            "loss_committed": F.cross_entropy(logits, targets).item(),
        }

    def baselines(self) -> dict[str, Predictor]:
        return {"bayes_optimal": BayesOptimal(self.config), "counting": Counting(self.config)}


def first_occurrences(inputs: torch.Tensor, trigger_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) tokens, (K,) trigger ids -> (B, K) int64 position of each trigger's first occurrence, -1 if none."""
    T = inputs.shape[1]
    position = torch.arange(T, device=inputs.device)
    hits = inputs[:, :, None] == trigger_ids.to(inputs.device)  # (B, T, K)
    first = torch.where(hits, position[:, None], T).amin(dim=1)
    return torch.where(first < T, first, -1)


class BayesOptimal:
    """The true next-token distribution given the context, as (B, T, V) log-probability logits.

    After a committed trigger: its output (copied from after its first occurrence) with probability 1. After
    a trigger's first occurrence: uniform over the non-trigger tokens. Elsewhere: each trigger with
    probability trigger_prob / n_triggers, each non-trigger with (1 - trigger_prob) / n_non_triggers.
    Zero probabilities get IMPOSSIBLE_LOGIT. Its `task.loss` is the lowest expected loss any model can reach.
    """

    def __init__(self, config: InductionConfig):
        self.config = config

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        cfg, device = self.config, inputs.device
        B, T = inputs.shape
        V, K = cfg.vocab_size, cfg.n_triggers
        trigger_ids = torch.tensor(cfg.trigger_ids, device=device)
        is_trigger_token = torch.zeros(V, dtype=torch.bool, device=device)
        is_trigger_token[trigger_ids] = True
        N = V - K

        free = torch.where(
            is_trigger_token, math.log(cfg.trigger_prob / K), math.log((1 - cfg.trigger_prob) / N)
        )  # (V,)
        after_new_trigger = torch.where(is_trigger_token, IMPOSSIBLE_LOGIT, math.log(1 / N))  # (V,)
        logits = free.float().expand(B, T, V).clone()

        trigger_index = torch.full((V,), -1, dtype=torch.long, device=device)
        trigger_index[trigger_ids] = torch.arange(K, device=device)
        index = trigger_index[inputs]  # (B, T), -1 at non-triggers
        is_trigger = index >= 0
        first = first_occurrences(inputs, trigger_ids)  # (B, K)
        first_here = torch.where(is_trigger, first.gather(1, index.clamp(min=0)), -1)
        position = torch.arange(T, device=device)
        committed = is_trigger & (first_here < position)
        logits[is_trigger & ~committed] = after_new_trigger.float()

        # A committed trigger's output is the token right after its first occurrence (first < t <= T - 1).
        output = inputs.gather(1, (first_here + 1).clamp(0, T - 1))  # (B, T), meaningful where committed
        copy = torch.full((B, T, V), IMPOSSIBLE_LOGIT, device=device)
        copy.scatter_(2, output[..., None], 0.0)
        return torch.where(committed[..., None], copy, logits)


class Counting:
    """A model that counts tokens and never looks at positions: at each position, the most frequent non-trigger
    token of the context so far (ties: the one that appeared first) gets logit 0, every other token
    IMPOSSIBLE_LOGIT; before any non-trigger token, the first trigger id (never an output) does. Outputs recur with
    their triggers, so counting beats chance without induction: what a model on this plateau reaches."""

    def __init__(self, config: InductionConfig):
        self.config = config

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        B, T = inputs.shape
        V = self.config.vocab_size
        non_trigger = torch.zeros(V, dtype=torch.bool, device=inputs.device)
        non_trigger[list(self.config.non_trigger_ids)] = True
        seen = F.one_hot(inputs, V).bool() & non_trigger  # (B, T, V)
        counts = seen.long().cumsum(1)
        position = torch.arange(T, device=inputs.device)[None, :, None]
        first = torch.where(seen, position, T).amin(1, keepdim=True)  # (B, 1, V): first occurrence, T if none
        # most frequent, then seen first (a token counted by t was first seen at its global first occurrence <= t)
        rank = torch.where(counts > 0, counts * (T + 1) - first, -1)
        best = torch.where(rank.amax(-1) >= 0, rank.argmax(-1), self.config.trigger_ids[0])
        logits = torch.full((B, T, V), IMPOSSIBLE_LOGIT, device=inputs.device)
        return logits.scatter_(2, best[..., None], 0.0)


def split_prompt(batch: Batch, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cuts each sequence at `prompt_len` for the ICLCA experiment (prompt -> weights, then run the query).

    Returns (prompt_inputs (B, P), query_inputs (B, T - P), query_mask (B, T - P) bool). query_mask[b, i] is
    True iff the token at global position P + i is a trigger that was committed in the prompt (its first
    occurrence is < P) and that has not recurred in the query before (it occurs nowhere in [P, P + i)), and
    P + i is not the last position (whose target is ignored). These are the positions that the ICLCA spec
    scores: without the prompt the next token is unpredictable (chance ~1 / n_non_triggers), with it it is
    determined. A trigger first seen at P - 1 counts: its output is then the query's first token, which
    only the prompt marks as the output. The targets of query position i are batch.targets[:, P + i].
    """
    inputs = batch.inputs
    T = inputs.shape[1]
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or not 1 <= prompt_len < T:
        raise ValueError(f"prompt_len must be an integer in [1, {T}) for sequences of length {T}, got {prompt_len!r}")
    if "trigger_position" not in batch.info:
        raise KeyError("split_prompt needs batch.info['trigger_position'], as sampled by the induction task")
    P, Q = prompt_len, T - prompt_len
    query = inputs[:, P:]
    first_seen = batch.info["trigger_position"][:, P:]  # (B, Q)
    from_prompt = (first_seen >= 0) & (first_seen < P)
    # First position inside the query of each token id; a trigger has recurred iff its token appeared earlier.
    V = int(inputs.max().item()) + 1
    position = torch.arange(Q, device=inputs.device).expand_as(query)
    first_in_query = torch.full((inputs.shape[0], V), Q, dtype=torch.long, device=inputs.device)
    first_in_query.scatter_reduce_(1, query, position, reduce="amin")
    not_recurred = first_in_query.gather(1, query) == position
    query_mask = from_prompt & not_recurred
    query_mask[:, -1] = False
    return inputs[:, :P], query, query_mask
