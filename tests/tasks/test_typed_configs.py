"""One typed config path (issue #17): task and episode-source configs are built by config.from_dict alone, and
every choice check reads the field's Literal annotation (no second tuple of the allowed values)."""

import pytest

from incontext.config import ConfigError, choices, from_dict
from incontext.models.amicl import AMICLModelConfig
from incontext.models.cgt_adapter import CGTAdapterConfig
from incontext.models.cgt_losses import CGTLossConfig
from incontext.tasks import get_task
from incontext.tasks.episodes import ContinuationConfig, FactsConfig, TopicsConfig, get_episode_source
from incontext.tasks.induction import TRAIN_LOSSES, InductionConfig
from incontext.tasks.registry import build_task
from incontext.tasks.text import EDITIONS, ShakespeareConfig


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert len(message.splitlines()) == 1
    return message


def test_unknown_task_key_is_refused_once_naming_the_key_and_the_allowed_keys():
    with pytest.raises(ConfigError) as error:
        get_task("induction", colour="red")
    assert one_line(error) == ("InductionConfig: unknown key(s) ['colour']; allowed keys: "
                               "['vocab_size', 'n_triggers', 'seq_len', 'trigger_prob', 'triggers', 'train_loss']")
    with pytest.raises(ConfigError) as error:  # the training config's task section: the same loader, its own prefix
        build_task("induction", {"colour": "red"}, where="task")
    assert one_line(error).startswith("task: unknown key(s) ['colour']; allowed keys: ['vocab_size'")
    with pytest.raises(KeyError, match="registered tasks"):
        build_task("no-such-task", {})


def test_unknown_episode_source_key_is_refused_naming_the_key_and_the_allowed_keys():
    with pytest.raises(ConfigError) as error:
        get_episode_source("facts", colour="red")
    assert one_line(error) == "task 'facts': FactsConfig: unknown key(s) ['colour']; allowed keys: ['people', 'format', 'documents', 'questions', 'placement']"


CHOICES = [
    (FactsConfig, "format", ("plain", "chat")),
    (TopicsConfig, "articles", ("bbc", "task")),
    (TopicsConfig, "query_set", ("random", "validation", "test")),
    (ContinuationConfig, "passages", ("plays", "task")),
    (InductionConfig, "train_loss", ("all", "committed")),
    (ShakespeareConfig, "edition", ("modern", "folio", "all")),
    (AMICLModelConfig, "similarity", ("dot", "pearson", "manhattan", "euclidean")),
    (AMICLModelConfig, "separation", ("identity", "softmax", "argmax")),
    (CGTAdapterConfig, "mixing", ("tanh", "softmax")),
    (CGTLossConfig, "profile", ("constant", "linear", "quadratic")),
    (CGTLossConfig, "prior", ("rbf", "icl")),
]


@pytest.mark.parametrize("cls, field, allowed", CHOICES, ids=[f"{cls.__name__}.{field}" for cls, field, _ in CHOICES])
def test_an_unknown_choice_is_refused_naming_the_field_and_the_choices(cls, field, allowed):
    assert choices(cls)[field] == allowed  # read from the Literal annotation, in its order
    for build in (lambda: cls(**{field: "nonesuch"}), lambda: from_dict(cls, {field: "nonesuch"})):
        with pytest.raises(ValueError) as error:
            build()
        message = one_line(error)
        assert f"{cls.__name__}.{field}" in message and "'nonesuch'" in message
        assert all(repr(choice) in message for choice in allowed)
    for choice in allowed:
        assert getattr(from_dict(cls, {field: choice}), field) == choice


def test_episode_sources_refuse_an_unknown_choice():
    with pytest.raises(ConfigError) as error:
        get_episode_source("topics", query_set="train")
    assert "TopicsConfig.query_set" in one_line(error) and "'validation'" in str(error.value)


def test_the_exported_choice_tuples_are_the_literals():
    from incontext.experiments.amicl import SEPARATIONS, SIMILARITIES

    assert TRAIN_LOSSES == ("all", "committed") == choices(InductionConfig)["train_loss"]
    assert EDITIONS == ("modern", "folio", "all") == choices(ShakespeareConfig)["edition"]
    assert SIMILARITIES == ("dot", "pearson", "manhattan", "euclidean")  # the amicl grid's rows, in this order
    assert SEPARATIONS == ("identity", "softmax", "argmax")
