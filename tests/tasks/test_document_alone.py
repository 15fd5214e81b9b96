"""Every task gives the methods the document alone unless asked: at its default options no episode of any
registered task carries a training query (questions written for what is asked are a labelled setting of `facts`)."""

import re
from pathlib import Path

import pytest

from conftest import ByteCodec
from incontext.tasks import get_task
from incontext.tasks.episodes import SOURCES, get_episode_source

QA = Path(__file__).resolve().parents[1] / "data" / "qa_small.jsonl"
OPTIONS = {"jsonl": {"path": str(QA)}, "continuation": {"prompt_tokens": 32, "query_tokens": 8}}
TRAINED = {"arithmetic": {}, "induction": {"seq_len": 32}, "linear_regression": {}}  # tasks a model is trained on


class WordCodec:
    """A word (with its leading space) a token: the topics' label words then start with different tokens."""

    def __init__(self):
        self.ids = {}

    def encode(self, text):
        return [self.ids.setdefault(w, len(self.ids)) for w in re.findall(r"\s*\S+|\s+", text)]


@pytest.mark.parametrize("name", SOURCES.names())
def test_no_task_gives_a_training_query_by_default(name):
    source = get_episode_source(name, **OPTIONS.get(name, {}))
    cls = SOURCES.get(name)
    if cls.needs_tokenizer:
        episodes = source.episodes(2, seed=0, tokenizer=WordCodec() if name == "topics" else ByteCodec())
    else:
        episodes = source.episodes(2, seed=0, task=get_task(cls.task_name, **TRAINED[name]))
    assert episodes and all(e.train_queries == [] and e.train_groups is None and e.query_groups is None for e in episodes)
    assert all(not part.train_queries for e in episodes for part in e.parts)


def test_facts_gives_training_questions_only_when_asked():
    codec = ByteCodec()
    asked = get_episode_source("facts", questions="paraphrases:1").episodes(1, seed=0, tokenizer=codec)[0]
    assert len(asked.train_queries) == 2 * len(asked.queries) and asked.query_groups == list(range(len(asked.queries)))
