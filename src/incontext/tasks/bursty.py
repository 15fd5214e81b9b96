"""Bursty in-context classification (Reddy 2024), the task of Burns et al.'s residual-stream study (sec. 3).

A sequence is o_1 l_1 ... o_N l_N o_q: N (object, label) pairs and a query object whose label the model must
name (one of L labels). K classes each have a fixed object mean mu_c ~ N(0, 1/D) per component and the label
c mod L; the L label tokens are fixed vectors ~ N(0, 1/D). An object token is (mu_c + eps * eta) / sqrt(1 + eps^2)
with eta ~ N(0, 1/D) fresh per instance; a label token is its label vector. Every token is the concatenation
[one-hot position (2 * Nmax + 1 dims) ; content (D dims)], with the positions shifted by a random offset per
sequence so that absolute position carries no information.

Sequences come in kinds (the notes in specs/residual-streams.md, from the authors' released code):
- "bursty" context (burst B = 2): 4 classes with distinct labels, each twice, shuffled; the query is a fresh
  instance of one of them, so the answer can be copied from the context;
- "iid" context: N classes drawn i.i.d. from the K known ones, and an i.i.d. query class: only memorised
  class -> label knowledge (in-weights learning) answers it.
Training mixture: with p_novel a bursty sequence of NOVEL classes (n_novel fresh class means per batch, each
with a random label), else known classes, bursty with p_bursty, otherwise iid.
Evaluation sets: "test" (the training mixture), "ic" (novel classes, bursty: pure in-context learning), "ic2"
(known classes, bursty, every label in the context and the answer flipped to label + 1 mod L: the context must
override memory), "iw" (known classes, iid context that never holds the query class: pure in-weights learning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Batch, Task, check_positive_int
from .registry import register_task

KINDS = ("test", "ic", "ic2", "iw")


@dataclass
class BurstyConfig:
    n_classes: int = 512  # K known classes
    n_labels: int = 32  # L labels; class c has label c mod L
    n_pairs: int = 8  # N context pairs
    max_pairs: int = 32  # Nmax: positions are one-hot over 2 * Nmax + 1 slots
    dim: int = 85  # D content dimensions
    eps: float = 0.1  # within-class noise
    burst: int = 2  # B: each class in a bursty context appears B times
    p_novel: float = 0.5  # p_C: probability of a sequence of novel classes
    p_bursty: float = 0.5  # p_B: probability that a known-class sequence is bursty
    n_novel: int = 128  # novel class means redrawn per batch
    class_seed: int = 0  # the known class means and the label vectors are drawn from this seed

    def __post_init__(self):
        for name in ("n_classes", "n_labels", "n_pairs", "max_pairs", "dim", "burst", "n_novel"):
            check_positive_int(self, name)
        if self.n_pairs % self.burst:
            raise ValueError(f"BurstyConfig.n_pairs={self.n_pairs} is not a multiple of burst={self.burst}")
        if self.n_pairs // self.burst > self.n_labels:
            raise ValueError(f"BurstyConfig: {self.n_pairs // self.burst} classes with distinct labels need n_labels >= that, got {self.n_labels}")
        if self.n_pairs > self.max_pairs:
            raise ValueError(f"BurstyConfig.n_pairs={self.n_pairs} exceeds max_pairs={self.max_pairs}")
        if self.n_classes % self.n_labels:
            raise ValueError(f"BurstyConfig.n_classes={self.n_classes} must be a multiple of n_labels={self.n_labels}")
        if self.n_novel < self.n_pairs // self.burst:
            raise ValueError(f"BurstyConfig.n_novel={self.n_novel} is fewer than the {self.n_pairs // self.burst} classes of a burst")
        for name in ("p_novel", "p_bursty"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"BurstyConfig.{name} must be a probability, got {getattr(self, name)}")
        if self.eps < 0:
            raise ValueError(f"BurstyConfig.eps must be >= 0, got {self.eps}")

    @property
    def n_positions(self) -> int:
        return 2 * self.max_pairs + 1

    @property
    def seq_len(self) -> int:
        return 2 * self.n_pairs + 1


@register_task("bursty")
class BurstyTask(Task):
    """Targets are label ids at the last position (B, T) with mask on it; outputs are logits (B, T, L)."""

    config_class = BurstyConfig

    def __init__(self, config: BurstyConfig | None = None):
        super().__init__(config)
        c = self.config
        g = torch.Generator().manual_seed(c.class_seed)
        scale = 1.0 / math.sqrt(c.dim)
        self.class_means = torch.randn(c.n_classes, c.dim, generator=g) * scale
        self.label_vectors = torch.randn(c.n_labels, c.dim, generator=g) * scale

    def model_io(self) -> dict[str, int]:
        return {"d_input": self.config.n_positions + self.config.dim, "d_output": self.config.n_labels}

    @property
    def sequence_length(self) -> int:
        return self.config.seq_len

    def known_label(self, classes: torch.Tensor) -> torch.Tensor:
        return classes % self.config.n_labels

    # ------------------------------------------------------------------ sequence kinds, as (means, labels)

    def _burst_slots(self, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Slots 0..k-1 (k = N / B classes per sequence) each B times, shuffled (n, N), and the query slot (n,)."""
        c = self.config
        k = c.n_pairs // c.burst
        order = torch.rand(n, c.n_pairs, generator=g).argsort(dim=1)
        context = torch.arange(k).repeat_interleave(c.burst).expand(n, -1).gather(1, order)
        return context, torch.randint(k, (n,), generator=g)

    def _bursty_known(self, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Context class ids (n, N) and query class ids (n,): N / B known classes with distinct labels."""
        c = self.config
        k = c.n_pairs // c.burst
        labels = torch.rand(n, c.n_labels, generator=g).argsort(dim=1)[:, :k]  # distinct labels
        chosen = labels + c.n_labels * torch.randint(c.n_classes // c.n_labels, (n, k), generator=g)
        context, query = self._burst_slots(n, g)
        return chosen.gather(1, context), chosen.gather(1, query[:, None])[:, 0]

    def _iid(self, n: int, g: torch.Generator, exclude_query: bool):
        c = self.config
        query = torch.randint(c.n_classes, (n,), generator=g)
        if exclude_query:  # draw from the other K - 1 classes
            context = torch.randint(c.n_classes - 1, (n, c.n_pairs), generator=g)
            context = context + (context >= query[:, None]).long()
        else:
            context = torch.randint(c.n_classes, (n, c.n_pairs), generator=g)
        return context, query

    def _tokens(self, means: torch.Tensor, context_labels: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """Assemble (n, T, P + D) inputs from object means (n, N+1, D) and context label ids (n, N)."""
        c = self.config
        n = means.shape[0]
        eta = torch.randn(n, c.n_pairs + 1, c.dim, generator=g) / math.sqrt(c.dim)
        objects = (means + c.eps * eta) / math.sqrt(1 + c.eps**2)
        labels = self.label_vectors[context_labels]  # (n, N, D)
        content = torch.cat([torch.stack([objects[:, :-1], labels], dim=2).reshape(n, 2 * c.n_pairs, c.dim),
                             objects[:, -1:]], dim=1)
        shift = torch.randint(c.n_positions - c.seq_len + 1, (n, 1), generator=g)
        positions = F.one_hot(shift + torch.arange(c.seq_len), c.n_positions).to(content.dtype)
        return torch.cat([positions, content], dim=-1)

    def sample_kind(self, kind: str, batch_size: int, generator: torch.Generator) -> Batch:
        """A batch of one kind: "train"/"test" (the training mixture), "ic", "ic2" or "iw"."""
        c, g, n = self.config, generator, batch_size
        if kind in ("train", "test"):
            draw = torch.rand(n, generator=g)
            novel = draw < c.p_novel
            known_bursty = (~novel) & (torch.rand(n, generator=g) < c.p_bursty)
            parts = {"ic": novel, "known-bursty": known_bursty, "iid": ~(novel | known_bursty)}
            batches = {name: self._kind(name, int(which.sum()), g) for name, which in parts.items()}
            inputs = torch.empty(n, c.seq_len, c.n_positions + c.dim)
            answers = torch.empty(n, dtype=torch.long)
            for name, which in parts.items():
                inputs[which], answers[which] = batches[name]
        elif kind in ("ic", "ic2", "iw"):
            inputs, answers = self._kind(kind, n, g)
        else:
            raise ValueError(f"unknown bursty sequence kind {kind!r}; choose from 'train', {KINDS}")
        targets = torch.zeros(n, c.seq_len, dtype=torch.long)
        targets[:, -1] = answers
        mask = torch.zeros(n, c.seq_len, dtype=torch.bool)
        mask[:, -1] = True
        return Batch(inputs, targets, mask)

    def _kind(self, kind: str, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        if kind == "ic":  # fresh class means for this batch; each sequence gives its k classes distinct random labels
            k = c.n_pairs // c.burst
            means = torch.randn(c.n_novel, c.dim, generator=g) / math.sqrt(c.dim)
            chosen = torch.rand(n, c.n_novel, generator=g).argsort(dim=1)[:, :k]
            labels = torch.rand(n, c.n_labels, generator=g).argsort(dim=1)[:, :k]
            context, query = self._burst_slots(n, g)
            slots = torch.cat([context, query[:, None]], dim=1)
            inputs = self._tokens(means[chosen.gather(1, slots)], labels.gather(1, context), g)
            return inputs, labels.gather(1, query[:, None])[:, 0]
        if kind in ("known-bursty", "ic2"):
            context, query = self._bursty_known(n, g)
        else:
            context, query = self._iid(n, g, exclude_query=kind == "iw")
        shift = 1 if kind == "ic2" else 0  # ic2: every label moved to the next one, the answer too
        ids = torch.cat([context, query[:, None]], dim=1)
        context_labels = (self.known_label(context) + shift) % c.n_labels
        return self._tokens(self.class_means[ids], context_labels, g), (self.known_label(query) + shift) % c.n_labels

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.sample_kind("train", batch_size, generator)

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(outputs[batch.mask], batch.targets[batch.mask])

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float]:
        logits, answers = outputs[batch.mask], batch.targets[batch.mask]
        return {"accuracy": float((logits.argmax(-1) == answers).float().mean()),
                "loss": float(F.cross_entropy(logits, answers))}
