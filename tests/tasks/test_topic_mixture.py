"""Topic mixtures: two documents of known topics joined at a cut drawn from cut_range."""

import pytest
import torch

from incontext.tasks import get_task


def test_mixtures_join_two_documents_at_the_cut(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path))
    task = get_task("topic_mixture", vocab_size=300, seq_len=48, cut_range=[10, 20], max_docs=20)
    assert task.topics == ("business", "entertainment", "politics", "sport", "tech", "shakespeare")
    docs = task.documents("train")
    assert {t for t, _ in docs} == set(range(6)) and len(task.documents("validation")) == 6 * 2
    batch = task.sample(8, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (8, 48) and torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    assert ((batch.info["join"] >= 10) & (batch.info["join"] <= 20)).all()
    for row in range(8):  # the sequence starts with a training document of topic_1, cut at the join
        j = int(batch.info["join"][row])
        assert any(t == batch.info["topic_1"][row] and torch.equal(tokens[:j], batch.inputs[row, :j]) for t, tokens in docs)
    again = task.sample(8, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, batch.inputs)
    with pytest.raises(ValueError, match="cut_range"):
        get_task("topic_mixture", seq_len=48, cut_range=[10, 60])
