import math

import pytest
import torch

from incontext.models.amicl import AMICL, AMICLModelConfig, similarity
from incontext.tasks import get_task


def test_sequences_follow_the_construction():
    task = get_task("amicl", n_classes=30, dim=16, seq_len=12, eps=0.1)
    batch = task.sample(64, torch.Generator().manual_seed(0))
    x, classes = batch.inputs, batch.info["classes"]
    assert x.shape == (64, 12, 16) and classes.shape == (64, 6)
    labels = x[:, 1::2]
    assert torch.equal(labels[:, :-1], task.labels[classes[:, :-1]])  # label tokens are the class labels, no noise
    assert torch.equal(labels[:, -1], torch.zeros(64, 16))  # the final label is zeroed
    assert torch.equal(batch.targets[:, -1], task.labels[classes[:, -1]])
    for row in classes.tolist():  # the query's class appeared earlier; context classes are distinct
        assert row[-1] in row[:-1] and len(set(row[:-1])) == len(row[:-1])
    noise = x[:, 0::2] * math.sqrt(1 + 0.01) - task.object_means[classes]  # = eps * eta
    assert abs(float(noise.std()) - 0.1 / math.sqrt(16)) < 0.01
    again = task.sample(64, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, x)


def test_argmax_retrieval_copies_the_right_label_when_a_is_large():
    task = get_task("amicl", n_classes=50, dim=100)
    batch = task.sample(200, torch.Generator().manual_seed(1))
    assert task.evaluate(AMICL(AMICLModelConfig(a=2.0))(batch.inputs), batch)["accuracy"] == 1.0
    assert task.evaluate(AMICL(AMICLModelConfig(a=0.0))(batch.inputs), batch)["accuracy"] < 0.05
    # a mixture of values (softmax separation) is never exactly a label
    assert task.evaluate(AMICL(AMICLModelConfig(separation="softmax"))(batch.inputs), batch)["accuracy"] == 0.0


def test_keys_mix_the_previous_token_with_wraparound():
    x = torch.arange(12, dtype=torch.float64).reshape(1, 4, 3)
    keys = AMICL(AMICLModelConfig(a=2.0)).keys(x)
    assert torch.allclose(keys[0, 1], (2 * x[0, 0] + x[0, 1]) / 3)
    assert torch.allclose(keys[0, 0], (2 * x[0, 3] + x[0, 0]) / 3)  # x_0 := x_s


@pytest.mark.parametrize("kind", ["dot", "pearson", "manhattan", "euclidean"])
def test_similarities_rank_an_identical_key_first(kind):
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(3, 7, 10, generator=g, dtype=torch.float64)
    query = keys[:, 4] * (1.0 if kind in ("manhattan", "euclidean") else 3.0)
    scores = similarity(keys, query, kind)
    assert (scores.argmax(-1) == 4).all()


def test_invalid_configs():
    with pytest.raises(ValueError, match="even"):
        get_task("amicl", seq_len=7)
    with pytest.raises(ValueError, match="similarity"):
        AMICLModelConfig(similarity="cosine")
