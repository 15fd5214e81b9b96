"""Text mixtures with known topics (CGT paper sec. 4.1/4.4, offline): two documents joined in one sequence.

Documents: the BBC News articles of tasks/corpora.py (5 topics, 2,089 articles after dropping repeated ones) and, optionally, passages of the Shakespeare plays (tasks/corpora.py) as a
sixth topic. Every 10th document of each topic (sorted by name) is held out for validation. A byte-level BPE
(tasks/text.py's trainer) is trained on the training documents and cached.

A training sequence: document 1 cut at a position drawn from U[cut_range], then document 2 (another document,
any topic; continued with further documents of its topic if it is short), truncated to seq_len + 1 tokens
(inputs and next-token targets). `info` holds the join position and both topics.

    task = get_task("topic_mixture", seq_len=256, cut_range=[128, 192])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .base import Batch, TokenTask, check_positive_int
from .corpora import bbc_articles, shakespeare_plays
from .registry import register_task
from .text import cache_root, cached_tokenizer

def topic_documents(shakespeare: bool, passage_chars: int, max_passages: int, max_docs: int = 0) -> dict[str, list[str]]:
    """Topic -> documents: BBC News articles ("title\nbody", each topic sorted by file name, repeated bodies
    dropped) and Shakespeare passages (consecutive passages of the modern plays); max_docs > 0 keeps the first
    max_docs of each topic."""
    docs = {topic: [f"{title}\n{body}" for _, title, body in rows[: max_docs or None]] for topic, rows in bbc_articles().items()}
    if shakespeare:
        passages = []
        for name, text in shakespeare_plays().items():
            if not name.endswith("_f"):  # the modern edition only
                passages += [text[i : i + passage_chars] for i in range(0, len(text) - passage_chars, passage_chars)]
        step = max(1, len(passages) // max_passages)  # spread over all plays
        docs["shakespeare"] = passages[::step][: min(max_passages, max_docs or max_passages)]
    return docs


@dataclass
class TopicMixtureConfig:
    vocab_size: int = 2048  # BPE vocabulary (paper: 8000)
    seq_len: int = 256  # paper: 512
    cut_range: tuple[int, int] = (128, 192)  # document 1 is cut at U[lo, hi] tokens (paper: 256..384)
    shakespeare: bool = True  # add Shakespeare passages as a sixth topic
    passage_chars: int = 2500
    max_passages: int = 500
    max_docs: int = 0  # documents per topic; 0 = all (small values make quick tests)
    tokenizer_dir: str = ""  # "" -> <cache_root>/tokenizers/topic-mixture-...

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "passage_chars", "max_passages"):
            check_positive_int(self, name)
        if self.max_docs < 0:
            raise ValueError(f"TopicMixtureConfig.max_docs must be >= 0, got {self.max_docs}")
        lo, hi = (int(v) for v in self.cut_range)
        if not 1 <= lo <= hi < self.seq_len:
            raise ValueError(f"TopicMixtureConfig.cut_range={self.cut_range} must satisfy 1 <= lo <= hi < seq_len={self.seq_len}")
        self.cut_range = (lo, hi)
        if self.vocab_size < 257:
            raise ValueError(f"TopicMixtureConfig.vocab_size must be >= 257 (bytes and <|endoftext|>), got {self.vocab_size}")


@functools.lru_cache(maxsize=4)
def _corpus(vocab_size: int, shakespeare: bool, passage_chars: int, max_passages: int, max_docs: int, tokenizer_dir: str):
    """(topics, {split: [(topic id, token ids)]}), the tokenizer trained and cached on the training documents."""
    docs = topic_documents(shakespeare, passage_chars, max_passages, max_docs)
    topics = tuple(docs)
    split = {"train": [], "validation": []}
    for t, topic in enumerate(topics):
        for i, text in enumerate(docs[topic]):
            split["validation" if i % 10 == 9 else "train"].append((t, text))
    # "bbc2": the corpus with repeated articles dropped (a tokenizer cached for the older corpus is not reused)
    folder = Path(tokenizer_dir) if tokenizer_dir else cache_root() / "tokenizers" / (
        f"topic-mixture-bbc2-v{vocab_size}-s{int(shakespeare)}-p{passage_chars}-m{max_passages}-d{max_docs}")
    tokenizer = cached_tokenizer(folder, lambda: [text for _, text in split["train"]], vocab_size, "TopicMixtureConfig")
    encoded = {}
    for name, items in split.items():
        encodings = tokenizer.encode_batch([text for _, text in items], add_special_tokens=False)
        encoded[name] = [(t, torch.tensor(e.ids, dtype=torch.int64)) for (t, _), e in zip(items, encodings) if len(e.ids) > 8]
    return topics, encoded, tokenizer


@register_task("topic_mixture")
class TopicMixture(TokenTask):
    config_class = TopicMixtureConfig
    config: TopicMixtureConfig

    def _load(self):
        c = self.config
        return _corpus(c.vocab_size, c.shakespeare, c.passage_chars, c.max_passages, c.max_docs, c.tokenizer_dir)

    @property
    def topics(self) -> tuple[str, ...]:
        return self._load()[0]

    def documents(self, split: str) -> list[tuple[int, torch.Tensor]]:
        """(topic id, token ids) of every document of a split ("train" or "validation")."""
        return self._load()[1][split]

    def decode(self, ids) -> str:
        return self._load()[2].decode(list(ids))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self.mixtures("train", batch_size, generator)

    def mixtures(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        docs = self.documents(split)
        by_topic: dict[int, list[int]] = {}
        for i, (t, _) in enumerate(docs):
            by_topic.setdefault(t, []).append(i)
        lo, hi = self.config.cut_range
        need = self.config.seq_len + 1
        rows, joins, first, second = [], [], [], []
        for _ in range(batch_size):
            a, b = torch.randperm(len(docs), generator=generator)[:2].tolist()
            cut = min(int(torch.randint(lo, hi + 1, (1,), generator=generator)), len(docs[a][1]))
            pieces, length = [docs[a][1][:cut], docs[b][1]], cut + len(docs[b][1])
            same_topic = by_topic[docs[b][0]]
            while length < need:  # a short second document continues with more of its topic
                extra = docs[same_topic[int(torch.randint(len(same_topic), (1,), generator=generator))]][1]
                pieces.append(extra)
                length += len(extra)
            rows.append(torch.cat(pieces)[:need])
            joins.append(cut)
            first.append(docs[a][0])
            second.append(docs[b][0])
        tokens = torch.stack(rows).to(generator.device)
        info = {"join": torch.tensor(joins), "topic_1": torch.tensor(first), "topic_2": torch.tensor(second)}
        return Batch(tokens[:, :-1], tokens[:, 1:], torch.ones_like(tokens[:, 1:], dtype=torch.bool), info)

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        logits = outputs[batch.mask]
        return F.cross_entropy(logits.float(), batch.targets[batch.mask])

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        return {"cross_entropy": self.loss(outputs, batch).item()}
