import pytest

from incontext.tasks.bbc_news import (
    TOPICS,
    BBCNewsConfig,
    format_example,
    split_articles,
    training_documents,
)


def test_split_holds_out_articles_per_topic_and_never_trains_on_them():
    config = BBCNewsConfig(heldout_per_topic=7, max_train_per_topic=40)
    train, heldout = split_articles(config)
    assert [sum(a[0] == t for a in heldout) for t in TOPICS] == [7] * 5
    assert [sum(a[0] == t for a in train) for t in TOPICS] == [40] * 5
    full_train, full_heldout = split_articles(BBCNewsConfig(heldout_per_topic=60))
    assert not {a[2] for a in full_train} & {a[2] for a in full_heldout}  # the corpus's repeated articles are dropped
    assert split_articles(config) == (train, heldout)  # deterministic
    _other_train, other_heldout = split_articles(BBCNewsConfig(heldout_per_topic=7, split_seed=1))
    assert other_heldout != heldout


def test_training_documents_label_a_fraction_in_the_prompt_format():
    config = BBCNewsConfig(heldout_per_topic=5, max_train_per_topic=30, labelled_fraction=0.5, excerpt_words=4)
    docs = training_documents(config)
    labelled = [d for d in docs if d.startswith("Article: ")]
    assert len(docs) == 150 and 40 < len(labelled) < 110
    head = labelled[0].split("\n\n")[0]
    assert head.split("\nTopic: ")[1] in TOPICS and len(head.split("\n")[0].split()) == 5  # "Article:" + 4 words
    assert all(not d.startswith("Article: ") for d in training_documents(BBCNewsConfig(heldout_per_topic=5, max_train_per_topic=30, labelled_fraction=0.0)))
    assert format_example("a b") == "Article: a b\nTopic:" and format_example("a", "tech") == "Article: a\nTopic: tech"


@pytest.mark.parametrize("bad", [{"labelled_fraction": 1.5}, {"excerpt_words": 0}, {"max_train_per_topic": -1}])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        BBCNewsConfig(**bad)


def test_too_many_heldout_articles_is_an_error():
    with pytest.raises(ValueError, match="leaves no training article"):
        split_articles(BBCNewsConfig(heldout_per_topic=10_000))
