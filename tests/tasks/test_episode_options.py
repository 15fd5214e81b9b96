"""Episode-source options that let an experiment run the absorb harness on its own model's data: continuation
windows of a text task's held-out stream, and topics episodes on a bbc-news task's own split."""

import pytest
import torch

from incontext.absorb.prompt_update import split_documents
from incontext.tasks.bbc_news import TOPICS, BBCNews, BBCNewsConfig
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.text import Shakespeare, ShakespeareConfig


@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
    pytest.importorskip("tokenizers")
    task = Shakespeare(ShakespeareConfig(vocab_size=300, seq_len=24, tokenizer_dir=str(tmp_path_factory.mktemp("tok"))))
    task.train_tokens
    return task


def test_continuation_task_windows_are_the_held_out_windows_cut_at_the_prompt(shakespeare):
    source = get_episode_source("continuation", prompt_tokens=10, query_tokens=15, passages="task")
    episodes = source.episodes(4, seed=3, task=shakespeare)
    windows = shakespeare.validation_windows(4, torch.Generator().manual_seed(3))
    for episode, ids in zip(episodes, windows):
        (query,) = episode.queries
        assert torch.equal(episode.prompt, ids[:10])
        assert torch.equal(query.inputs, ids[10:24]) and torch.equal(query.targets, ids[11:25]) and bool(query.mask.all())
    with pytest.raises(ValueError, match="exceed the task's windows"):
        get_episode_source("continuation", prompt_tokens=20, query_tokens=6, passages="task").episodes(1, task=shakespeare)
    with pytest.raises(ValueError, match="passages=task"):
        source.episodes(1)
    with pytest.raises(ValueError, match="passages"):
        get_episode_source("continuation", passages="wiki")


@pytest.fixture(scope="module")
def bbc():
    pytest.importorskip("tokenizers")
    return BBCNews(BBCNewsConfig(vocab_size=512, heldout_per_topic=8, max_train_per_topic=20, excerpt_words=6))


def test_topics_fixed_query_sets_on_the_task_split(bbc):
    """query_set: every episode asks the whole validation / test set of the task's held-out split; the
    demonstrations come from the rest (the pool), depend on the seed only, and the loss mask marks labels."""
    options = dict(shots=3, excerpt_words=6, articles="task", validation_per_topic=2, test_per_topic=3)
    test = get_episode_source("topics", query_set="test", label_loss=True, **options).episodes(2, seed=1, task=bbc)
    validation = get_episode_source("topics", query_set="validation", **options).episodes(2, seed=1, task=bbc)
    heldout = bbc.heldout_articles()
    by_topic = {t: [a for a in heldout if a[0] == t] for t in TOPICS}
    expected_test = [torch.tensor(bbc.encode(bbc.prompt(a))) for rows in by_topic.values() for a in rows[2:5]]
    pool = {bbc.prompt(a) for rows in by_topic.values() for a in rows[5:]}
    labels = bbc.label_token_ids()
    for t, v in zip(test, validation):
        assert len(t.queries) == 15 and len(v.queries) == 10
        assert all(torch.equal(q.inputs, e) for q, e in zip(t.queries, expected_test))
        assert torch.equal(t.prompt, v.prompt) and v.prompt_loss_mask is None
        assert t.prompt[t.prompt_loss_mask].tolist() == [int(i) for i in t.prompt[t.prompt_loss_mask] if int(i) in labels]
        demos, masks = split_documents(t.prompt, t.prompt_loss_mask, bbc.encode("\n\n"))
        assert len(demos) == 3 and all(int(m.sum()) == 1 and bool(m[-1]) for m in masks)  # one label, last
        assert {bbc.decode(d[:-1].tolist()) for d in demos} <= pool
    assert not torch.equal(test[0].prompt, test[1].prompt)
    with pytest.raises(ValueError, match="demonstration pool"):
        get_episode_source("topics", query_set="test", **{**options, "test_per_topic": 6}).episodes(1, task=bbc)
    with pytest.raises(ValueError, match="query_set"):
        get_episode_source("topics", query_set="train")


class _CharCodec:
    """One token per character (plus the first, which the source drops as possibly cut)."""

    def encode(self, text):
        return [0] + [ord(c) % 256 for c in text]


def test_continuation_passages_longer_than_any_held_out_play_are_a_one_line_error():
    source = get_episode_source("continuation", prompt_tokens=64, query_tokens=8)
    (episode,) = source.episodes(1, seed=0, tokenizer=_CharCodec())
    assert episode.prompt.shape == (64,) and episode.queries[0].inputs.shape == (7,)
    with pytest.raises(ValueError, match="no held-out passage holds prompt_tokens \\+ query_tokens = 10000008 tokens"):
        get_episode_source("continuation", prompt_tokens=10_000_000, query_tokens=8).episodes(1, tokenizer=_CharCodec())

    class PairCodec(_CharCodec):  # one token per two characters: passages fit by characters, never by tokens
        def encode(self, text):
            return super().encode(text)[::2]

    from incontext.tasks.corpora import shakespeare_plays
    from incontext.tasks.text import ShakespeareConfig, split_plays

    plays = shakespeare_plays()
    longest = max(len(plays[h]) for h in split_plays(ShakespeareConfig(), plays)[1])
    too_long = get_episode_source("continuation", prompt_tokens=longest * 3 // 4, query_tokens=8)
    with pytest.raises(ValueError, match="the longest drawn held"):
        too_long.episodes(1, tokenizer=PairCodec())
