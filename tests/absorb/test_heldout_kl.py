"""The held-out readout of kv-prefix's and distill-lora's training (distill.heldout_kl): the full KL(teacher || student)
on fresh teacher continuations of the document that training never sees, before and after training. It is a true
KL (checked against a plain float64 computation from the prompted model), and it changes nothing trained."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("peft")

from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.distill import Student, heldout_kl  # noqa: E402
from incontext.absorb.study import StudyOptions, heldout_sequences  # noqa: E402
from test_kv_prefix import FAST, tiny  # noqa: E402  (the same tiny float64 Transformer)


def prompt(seed=1, m=20):
    return torch.randint(0, 61, (m,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("seed", [0, 3])
def test_the_heldout_targets_are_the_prompted_models_full_distributions(seed):
    model, ids = tiny(seed=seed), prompt(seed)
    held = heldout_sequences(model, ids, StudyOptions(continuation_tokens=7), torch.Generator().manual_seed(seed), 3)
    assert len(held) == 3
    for tokens, log_p in held:
        assert tokens.shape == (7,) and log_p.shape == (7, 61)
        plain = F.log_softmax(model(torch.cat([ids, tokens])[None])[0, ids.shape[0]:].double(), -1)
        torch.testing.assert_close(log_p, plain, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 5])
def test_heldout_kl_is_the_full_kl_of_the_student(seed):
    model, ids = tiny(seed=seed), prompt(seed)
    held = heldout_sequences(model, ids, StudyOptions(continuation_tokens=5), torch.Generator().manual_seed(seed), 2)
    student = tiny(seed=seed + 1)  # another model as the student: a KL well above 0
    kl = heldout_kl(Student(params=[], module=student), held)
    total, positions = 0.0, 0
    for tokens, log_p in held:
        log_q = F.log_softmax(student(tokens[None])[0].double(), -1)
        total += float((log_p.exp() * (log_p - log_q)).sum())
        positions += tokens.shape[0]
    assert kl == pytest.approx(total / positions, rel=1e-9) and kl > 0.01
    assert heldout_kl(Student(params=[], module=model), []) is None


@pytest.mark.parametrize("method", ["kv-prefix", "distill-lora"])
def test_the_readout_is_recorded_and_changes_nothing_trained(method):
    model, ids = tiny(), prompt()
    options = {**FAST, "steps": 6}
    read = get_absorb_method(method, **options).absorb(model, ids[None])
    plain = get_absorb_method(method, **options, heldout=0).absorb(model, ids[None])
    record = read.history["heldout_kl"]
    assert record["sequences"] == 2 and record["positions"] == 2 * FAST["study.continuation_tokens"]
    assert record["before"] >= 0 and record["after"] >= 0
    assert "heldout_kl" not in plain.history and read.history["loss"] == plain.history["loss"]
    for a, b in zip(read.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)
    # at the start (0 steps) nothing is trained and nothing is read out
    assert "heldout_kl" not in get_absorb_method(method, **{**options, "steps": 0}).absorb(model, ids[None]).history


@pytest.mark.parametrize("method", ["kv-prefix", "distill-lora"])
@pytest.mark.parametrize("rate", [3.0, 1e-3])
def test_keep_start_undoes_exactly_the_training_that_raised_the_heldout_kl(method, rate):
    """keep_start: where the held-out KL after training is above the KL before, the start (0 steps) comes back bit
    for bit; else the trained state stays, equal to a run without keep_start."""
    model, ids = tiny(), prompt()
    options = {**FAST, "steps": 6, "learning_rate": rate}
    kept = get_absorb_method(method, **options, keep_start=True).absorb(model, ids[None])
    trained = get_absorb_method(method, **options).absorb(model, ids[None])
    start = get_absorb_method(method, **{**options, "steps": 0}).absorb(model, ids[None])
    record = kept.history["heldout_kl"]
    assert kept.history["kept_start"] == (record["after"] > record["before"])
    # both branches run: on this tiny model the kv-prefix's rate 3 and distill-lora's 1e-3 raise the held-out KL
    assert kept.history["kept_start"] == ((method, rate) in (("kv-prefix", 3.0), ("distill-lora", 1e-3)))
    assert trained.history["heldout_kl"] == record and "kept_start" not in trained.history
    reference = start if kept.history["kept_start"] else trained
    for a, b in zip(kept.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)


def test_keep_start_without_a_heldout_readout_is_one_line():
    with pytest.raises(ValueError, match="keep_start .* needs heldout > 0"):
        get_absorb_method("kv-prefix", **FAST, keep_start=True, heldout=0).absorb(tiny(), prompt()[None])
