"""BBC News topic classification as language modelling (the offline stand-in for TinT's Table 1 tasks).

The corpus: the BBC News articles of tasks/corpora.py (2,089 after dropping repeated bodies; 5 topics: business,
entertainment, politics, sport, tech). Per topic, the
articles (sorted by file name, then shuffled with `split_seed`) are split: the first `heldout_per_topic`
are held out (never seen in training: the few-shot demonstrations and the evaluation queries come from
them), the rest are for training.

Prompt format (the label word is one BPE token after "Topic:"):

    Article: <first `excerpt_words` words of the body>
    Topic: sport

The training stream is the training articles (title and body), a `labelled_fraction` of them preceded by
their labelled example in the format above, so the label words mean something to a model trained on it;
<|endoftext|> joins the documents. The validation stream (for the trainer's evaluation) is the held-out
articles without labels. A byte-level BPE (`text.train_tokenizer`) is trained on the training stream.

    task = get_task("bbc-news", vocab_size=2048, seq_len=256)
    articles = task.heldout_articles()          # [(topic, title, body), ...]
    ids = task.encode(task.prompt(articles[0]))  # "Article: ...\nTopic:"
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

import torch

from .base import check_positive_int
from .corpora import BBC_TOPICS, bbc_articles
from .registry import register_task
from .text import TokenStreamTask, cached_tokenizer, encode_plays

TOPICS = BBC_TOPICS  # label words


@dataclass
class BBCNewsConfig:
    vocab_size: int = 2048
    seq_len: int = 256  # training windows; also the longest prompt a model trained on it can read
    heldout_per_topic: int = 60  # articles per topic never seen in training (demonstrations and queries)
    excerpt_words: int = 16  # words of the body shown after "Article:"
    labelled_fraction: float = 0.5  # training articles preceded by their labelled example
    split_seed: int = 0
    max_train_per_topic: int = 0  # 0: every remaining article; > 0: at most this many (small tests)

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "heldout_per_topic", "excerpt_words"):
            check_positive_int(self, name)
        if self.max_train_per_topic < 0:
            raise ValueError(f"max_train_per_topic must be >= 0 (0: all), got {self.max_train_per_topic}")
        if not 0.0 <= self.labelled_fraction <= 1.0:
            raise ValueError(f"labelled_fraction must lie in [0, 1], got {self.labelled_fraction}")


def split_articles(config: BBCNewsConfig) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(training, held-out) lists of (topic, title, body); held-out ordered topic by topic."""
    train, heldout = [], []
    for topic, rows in bbc_articles().items():
        if config.heldout_per_topic >= len(rows):
            raise ValueError(f"heldout_per_topic={config.heldout_per_topic} leaves no training article of topic {topic!r} ({len(rows)})")
        order = list(range(len(rows)))
        random.Random(f"{config.split_seed}-{topic}").shuffle(order)
        chosen = [(topic, rows[i][1], rows[i][2]) for i in order]
        heldout += chosen[: config.heldout_per_topic]
        rest = chosen[config.heldout_per_topic :]
        train += rest[: config.max_train_per_topic] if config.max_train_per_topic > 0 else rest
    return train, heldout


def excerpt(body: str, words: int) -> str:
    return " ".join(body.split()[:words])


def format_example(text: str, topic: str | None = None) -> str:
    """"Article: <text>\\nTopic: <topic>", or the query prompt ending in "Topic:" when topic is None."""
    return f"Article: {text}\nTopic:" + ("" if topic is None else f" {topic}")


def training_documents(config: BBCNewsConfig) -> list[str]:
    train, _ = split_articles(config)
    rng = random.Random(f"{config.split_seed}-labelled")
    docs = []
    for topic, title, body in train:
        doc = f"{title}\n{body}"
        if rng.random() < config.labelled_fraction:
            doc = format_example(excerpt(body, config.excerpt_words), topic) + "\n\n" + doc
        docs.append(doc)
    random.Random(f"{config.split_seed}-order").shuffle(docs)  # topics interleaved in the stream
    return docs


@functools.lru_cache(maxsize=4)
def _tokenizer_and_streams(config_key: tuple):
    config = BBCNewsConfig(*config_key)
    docs = training_documents(config)
    tokenizer = cached_tokenizer(None, lambda: docs, config.vocab_size, "BBCNewsConfig")  # in memory: a few seconds
    _, heldout = split_articles(config)
    streams = {"train": encode_plays(tokenizer, docs), "validation": encode_plays(tokenizer, [f"{t}\n{b}" for _, t, b in heldout])}
    return tokenizer, streams


@register_task("bbc-news")
class BBCNews(TokenStreamTask):
    """Next-token prediction on BBC News articles (some preceded by a labelled "Article: ... Topic: x"
    example); `sample` draws training windows, `sample_validation` held-out article text. The tokenizer is
    trained in memory on first use (deterministic, a few seconds)."""

    config_class = BBCNewsConfig
    config: BBCNewsConfig
    topics = TOPICS

    def _key(self) -> tuple:
        c = self.config
        return (c.vocab_size, c.seq_len, c.heldout_per_topic, c.excerpt_words, c.labelled_fraction, c.split_seed, c.max_train_per_topic)

    def load_tokenizer(self):
        return _tokenizer_and_streams(self._key())[0]

    def load_streams(self) -> dict[str, torch.Tensor]:
        return _tokenizer_and_streams(self._key())[1]

    def heldout_articles(self) -> list[tuple[str, str, str]]:
        """The held-out (topic, title, body) triples, `heldout_per_topic` per topic, topic by topic."""
        return split_articles(self.config)[1]

    def prompt(self, article: tuple[str, str, str] | None, with_label: bool = False) -> str:
        """The query prompt of an article (or the content-free prompt "Article: \\nTopic:" for None);
        with_label appends its topic word (a demonstration)."""
        if article is None:
            return format_example("")
        topic, _, body = article
        return format_example(excerpt(body, self.config.excerpt_words), topic if with_label else None)

    def label_token_ids(self) -> list[int]:
        """The first BPE token of " <topic>" per topic (the token scored after "Topic:"); must differ."""
        ids = [self.encode(" " + topic)[0] for topic in TOPICS]
        if len(set(ids)) != len(ids):
            raise ValueError(f"the label words {TOPICS} share first tokens {ids}; use a larger vocab_size")
        return ids
