"""The divergence guard of kv-prefix's and distill-lora's training (distill_lora.Rollback): it snapshots the trained
tensors and the optimizer's state at the lowest windowed loss, and where the loss blows up (or the tensors turn
non-finite) it restores them and halves the learning rate; a run that never diverges trains exactly as without it."""

import math

import pytest
import torch

pytest.importorskip("peft")

from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.distill import Rollback  # noqa: E402
from incontext.absorb.distill import _Steps  # noqa: E402
from test_kv_prefix import FAST, tiny  # noqa: E402  (the same tiny float64 Transformer)

def prompt(seed=1, m=20):
    return torch.randint(0, 61, (m,), generator=torch.Generator().manual_seed(seed))


def adam_step(param, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    optimizer.zero_grad()
    param.grad = torch.randn(param.shape, generator=g, dtype=param.dtype)
    optimizer.step()


def test_a_blow_up_restores_the_snapshot_and_its_optimizer_state_and_halves_the_rate():
    param = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
    optimizer = torch.optim.Adam([param], lr=0.1)
    guard = Rollback([param], optimizer, window=3)
    losses = []
    for i, loss in enumerate([3.0, 2.0, 1.0, 0.5, 0.4]):  # windows 2.0, 1.17, 0.63: a new lowest each step
        adam_step(param, optimizer, i)
        losses.append(loss)
        assert not guard.update(losses)
    for i, loss in enumerate([0.6, 2.0, 4.0]):  # windows 0.5 (the lowest), 1.0 (not above 2 x 0.5), 2.2: diverged
        adam_step(param, optimizer, 10 + i)
        losses.append(loss)
        rolled = guard.update(losses)
        assert rolled == (i == 2)
        if i == 0:
            saved = param.detach().clone()
            state = {k: v.clone() for k, v in optimizer.state[param].items()}
    assert torch.equal(param.detach(), saved) and guard.scale == 0.5 and guard.rollbacks == 1
    assert all(torch.equal(optimizer.state[param][k], v) for k, v in state.items())
    assert guard.record()["best_window_loss"] == pytest.approx(0.5)
    losses.append(5.0)  # windows never reach back past the rollback: one loss is not yet a window
    assert not guard.update(losses) and guard.rollbacks == 1


def test_the_rollbacks_are_bounded_and_finish_returns_the_snapshot_of_a_run_that_ends_diverged():
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = torch.optim.Adam([param], lr=0.1)
    guard = Rollback([param], optimizer, window=2, max_rollbacks=1)
    losses = [1.0, 1.0]
    adam_step(param, optimizer, 0)
    guard.update(losses)
    best = param.detach().clone()
    for i in range(6):
        adam_step(param, optimizer, i + 1)
        losses.append(10.0)
        guard.update(losses)
    assert guard.rollbacks == 1 and not torch.equal(param.detach(), best)  # spent: the run went on diverged
    assert guard.finish(losses) and torch.equal(param.detach(), best)
    quiet = Rollback([param], optimizer, window=2)
    assert not quiet.finish([1.0, 1.0]) and not quiet.rollback([1.0])  # no snapshot yet: nothing to return


def blow_up(monkeypatch, at: int, how):
    """kv-prefix's eager step, with the prefix spoilt (`how`) right after step `at`."""
    calls = {"n": 0}
    real = _Steps.__call__

    def step(self, batch):
        loss, finite = real(self, batch)
        calls["n"] += 1
        if calls["n"] == at:
            with torch.no_grad():
                for t in self.params:
                    how(t)
            return real(self, batch)[0], bool(all(torch.isfinite(t).all() for t in self.params))
        return loss, finite

    monkeypatch.setattr(_Steps, "__call__", step)


OPTIONS = dict(FAST, prefix_tokens=5, steps=48, learning_rate=0.2, patience=4)


@pytest.fixture(autouse=True)
def no_plateau(monkeypatch):
    """Every run trains all its steps (the plateau test would stop these short ones early)."""
    monkeypatch.setattr("incontext.absorb.distill.plateau", lambda *args: False)


@pytest.mark.parametrize("backend", ["incontext", "hf"])
def test_kv_prefix_rolls_back_a_blown_up_prefix_and_ends_near_its_best(monkeypatch, backend):
    """On both backends: our Transformer, and transformers' LlamaForCausalLM with the same weights."""
    from incontext.interop.hf import to_hf_llama
    from incontext.models.hf_backend import HFCausalLM

    model, document = tiny(), prompt()
    if backend == "hf":
        model = HFCausalLM(to_hf_llama(model).eval()).eval()
    clean = get_absorb_method("kv-prefix", **OPTIONS).absorb(model, document)
    assert clean.history["rollbacks"] == 0
    blow_up(monkeypatch, 32, lambda t: t.mul_(50.0))
    spoilt = get_absorb_method("kv-prefix", **OPTIONS).absorb(model, document)
    assert spoilt.history["rollbacks"] >= 1 and spoilt.history["steps"] == 48
    kl = spoilt.history["loss"]
    assert max(kl[32:]) > 2 * spoilt.history["best_window_loss"]  # the blow-up happened
    assert sum(kl[-4:]) / 4 < 2 * spoilt.history["best_window_loss"] + 0.25  # and training recovered from it
    scale = max(k.abs().max().item() for k, _ in clean._tensors())
    assert max(k.abs().max().item() for k, _ in spoilt._tensors()) < 5 * scale


def test_a_non_finite_prefix_rolls_back_and_one_before_any_snapshot_is_an_error(monkeypatch):
    model, document = tiny(), prompt()
    blow_up(monkeypatch, 20, lambda t: t.fill_(math.nan))
    trained = get_absorb_method("kv-prefix", **OPTIONS).absorb(model, document)
    assert trained.history["rollbacks"] == 1 and all(torch.isfinite(k).all() for k, _ in trained._tensors())
    blow_up(monkeypatch, 1, lambda t: t.fill_(math.nan))
    with pytest.raises(FloatingPointError, match="non-finite"):
        get_absorb_method("kv-prefix", **OPTIONS).absorb(model, document)


@pytest.mark.parametrize("method", ["kv-prefix", "distill-lora"])
def test_a_run_that_never_diverges_trains_exactly_as_without_the_guard(monkeypatch, method):
    model, document = tiny(), prompt()
    options = dict(OPTIONS) if method == "kv-prefix" else dict(FAST, steps=30, patience=4)
    guarded = get_absorb_method(method, **options).absorb(model, document)
    assert guarded.history["rollbacks"] == 0
    monkeypatch.setattr(Rollback, "update", lambda self, losses: False)
    monkeypatch.setattr(Rollback, "finish", lambda self, losses: False)
    plain = get_absorb_method(method, **options).absorb(model, document)
    assert guarded.history["loss"] == plain.history["loss"]
    def tensors(adapted):
        if method == "distill-lora":
            return dict(adapted.state_dict())
        return dict(enumerate(t for kv in adapted._tensors() for t in kv))

    ours, theirs = tensors(guarded), tensors(plain)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_after_a_rollback_the_plateau_test_sees_only_the_losses_since(monkeypatch):
    """The blown-up stretch would otherwise look like a plateau (windows before and after it about equal) and stop
    training on the restored prefix at once."""
    seen = []
    monkeypatch.setattr("incontext.absorb.distill.plateau", lambda losses, *args: seen.append(list(losses)) or False)
    blow_up(monkeypatch, 32, lambda t: t.mul_(50.0))
    trained = get_absorb_method("kv-prefix", **OPTIONS).absorb(tiny(), prompt())
    assert trained.history["rollbacks"] == 1
    restart = next(i for i in range(1, len(seen)) if len(seen[i]) < len(seen[i - 1]))
    assert len(seen[restart]) == 1 and seen[restart] == trained.history["loss"][-len(seen[-1]):][:1]
    assert max(seen[-1]) < 2 * trained.history["best_window_loss"] + 0.25  # none of the blown-up losses


def test_kv_prefix_guards_windows_of_patience_steps_inside_a_long_stages_first_pass(monkeypatch):
    """kv-prefix's guard windows are `patience` steps even where a pass over the data stage is longer (the plateau
    test's windows): a long document's stage can diverge before its first pass ends (lr 0.1 did, on a 1,035-token
    document, within 50 steps of an 81-step pass), with no snapshot to return to if the guard waited for a pass."""
    windows = []
    real = Rollback.__init__
    monkeypatch.setattr(Rollback, "__init__", lambda self, params, optimizer, window, **kw:
                        windows.append(window) or real(self, params, optimizer, window, **kw))
    g = torch.Generator().manual_seed(5)
    queries = [torch.randint(0, 61, (1, 4), generator=g) for _ in range(80)]
    trained = get_absorb_method("kv-prefix", **dict(OPTIONS, batch_size=2)).absorb(tiny(), prompt(), train_queries=queries)
    n = sum(v for k, v in trained.history["pool"].items() if k != "cached")
    assert windows == [4] and -(-n // 2) > 40  # a pass is over 40 steps
