import json

import pytest
import torch

from incontext.models import Transformer, TransformerConfig
from incontext.train import checkpoint as ckpt
from incontext.train.checkpoint import latest_checkpoint, load_training_state, load_weights, save_checkpoint


def small_model(**options):
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=11, d_model=16, n_head=2, n_layer=1, **options))


def trained_optimizer(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 11, (2, 5))).sum().backward()
    optimizer.step()
    return optimizer


def test_round_trip_restores_weights_optimizer_and_rng(tmp_path):
    model = small_model()
    optimizer = trained_optimizer(model)
    torch.manual_seed(123)
    path = save_checkpoint(tmp_path, 7, model, optimizer, {"hello": 1})
    expected_draw = torch.rand(3)
    fresh = small_model()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    torch.manual_seed(999)
    state = load_training_state(path, fresh, fresh_optimizer)
    assert state["step"] == 7 and state["config"] == {"hello": 1}
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored
    for a, b in zip(model.state_dict().values(), fresh.state_dict().values()):
        assert torch.equal(a, b)
    for p, q in zip(model.parameters(), fresh.parameters()):
        assert optimizer.state[p].keys() == fresh_optimizer.state[q].keys()
        for key in optimizer.state[p]:
            assert torch.equal(optimizer.state[p][key], fresh_optimizer.state[q][key])
    assert fresh.lm_head.weight is fresh.tok_emb.weight  # tying survives
    assert not any(p.suffix == ".pkl" for p in path.iterdir())


def test_crash_while_writing_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = small_model()
    optimizer = trained_optimizer(model)
    first = save_checkpoint(tmp_path, 1, model, optimizer, {})

    def broken_save(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "save_file", broken_save)
    with torch.no_grad():
        model.tok_emb.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model, optimizer, {})
    assert latest_checkpoint(tmp_path) == first
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_00000001"]
    reloaded = small_model()
    load_weights(first, reloaded)
    assert not torch.equal(reloaded.tok_emb.weight, model.tok_emb.weight)  # the old weights, not the new ones


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    model = small_model()
    optimizer = trained_optimizer(model)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, optimizer, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_00000003", "step_00000004"]
    assert json.loads((tmp_path / "checkpoints" / "step_00000004" / "state.json").read_text())["step"] == 4


def test_loading_into_a_different_model_fails_clearly(tmp_path):
    path = save_checkpoint(tmp_path, 1, small_model(), None, {})
    with pytest.raises(ValueError, match="does not fit this model"):
        load_weights(path, Transformer(TransformerConfig(vocab_size=11, d_model=32, n_head=2, n_layer=1)))
    with pytest.raises(ValueError, match="does not fit this model"):
        load_weights(path, Transformer(TransformerConfig(vocab_size=11, d_model=16, n_head=2, n_layer=2)))
