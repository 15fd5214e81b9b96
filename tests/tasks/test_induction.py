import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from incontext.tasks import Batch, InductionConfig, get_task, list_tasks, split_prompt
from incontext.tasks.induction import IGNORE_INDEX, VOCAB, decode, encode, to_strings


def sample(seed: int = 0, batch_size: int = 8, **overrides):
    task = get_task("induction", **overrides)
    return task, task.sample(batch_size, torch.Generator().manual_seed(seed))


def trigger_letters(task) -> set[str]:
    return {VOCAB[i] for i in task.config.trigger_ids}


def committed_positions(text: str, triggers: set[str]) -> list[bool]:
    """Independent reference: t is scored iff text[t] is a trigger seen before t, and t is not the last position."""
    return [c in triggers and c in text[:t] and t < len(text) - 1 for t, c in enumerate(text)]


def rule_logits(batch: Batch, triggers: set[str], vocab_size: int) -> torch.Tensor:
    """A predictor built from the rule in plain Python: at a trigger seen before, predict what followed it first."""
    logits = torch.zeros(*batch.inputs.shape, vocab_size)
    for b, text in enumerate(to_strings(batch.inputs)):
        successor: dict[str, str] = {}
        for t, c in enumerate(text[:-1]):
            if c in triggers:
                if c in successor:
                    logits[b, t, VOCAB.index(successor[c])] = 20.0
                else:
                    successor[c] = text[t + 1]
    return logits


def test_vocab_round_trip_and_registration():
    assert VOCAB == "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" and len(VOCAB) == 52
    assert encode("abzAZ") == [0, 1, 25, 26, 51]
    assert decode(torch.tensor(encode("cdaXqb"))) == "cdaXqb"
    with pytest.raises(ValueError):
        decode([52])
    assert "induction" in list_tasks()
    task = get_task("induction")
    assert task.name == "induction" and isinstance(task.config, InductionConfig)
    assert task.model_io() == {"vocab_size": 52} and task.sequence_length == 256
    assert task.config.trigger_ids == (0, 1, 2, 3, 4)
    assert {VOCAB[i] for i in task.config.trigger_ids} == set("abcde")
    assert len(task.config.non_trigger_ids) == 47 and not set(task.config.non_trigger_ids) & {0, 1, 2, 3, 4}


@pytest.mark.parametrize(
    "overrides",
    [{}, {"trigger_prob": 0.4, "seq_len": 64}, {"n_triggers": 3, "triggers": [10, 30, 51], "seq_len": 50}],
)
def test_generator_semantics_against_python_loops(overrides):
    task, batch = sample(seed=1, batch_size=16, **overrides)
    T = task.config.seq_len
    triggers = trigger_letters(task)
    assert batch.inputs.shape == (16, T) and batch.inputs.dtype == torch.int64
    outputs = batch.info["outputs"].tolist()
    n_later_occurrences = 0
    for b, text in enumerate(to_strings(batch.inputs)):
        assert len(text) == T
        successor: dict[str, str] = {}
        for t, c in enumerate(text[:-1]):
            if c in triggers:
                assert text[t + 1] not in triggers  # an output is never a trigger
                if c in successor:
                    assert text[t + 1] == successor[c]  # fixed after the first occurrence
                    n_later_occurrences += 1
                else:
                    successor[c] = text[t + 1]
        for k, trigger_id in enumerate(task.config.trigger_ids):
            letter = VOCAB[trigger_id]
            if letter in successor:
                assert outputs[b][k] == VOCAB.index(successor[letter])
            elif letter in text:  # only at the last position: the output exists but is not shown
                assert text.index(letter) == T - 1 and outputs[b][k] in task.config.non_trigger_ids
            else:
                assert outputs[b][k] == -1
    assert n_later_occurrences > 20  # the check above was exercised
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    assert torch.all(batch.targets[:, -1] == IGNORE_INDEX)


def test_outputs_are_fresh_per_sequence_and_uniform_over_non_triggers():
    task, batch = sample(seed=2, batch_size=2000, seq_len=64)
    outputs = batch.info["outputs"]
    present = outputs[outputs >= 0]
    counts = torch.bincount(present, minlength=52).double()
    assert counts[:5].sum() == 0
    expected = len(present) / 47
    assert torch.all((counts[5:] - expected).abs() < 5 * math.sqrt(expected))
    # different sequences get different outputs for the same trigger
    assert len(set(outputs[:, 0].tolist())) > 30


@pytest.mark.parametrize("trigger_prob", [0.1, 0.35])
def test_trigger_frequency(trigger_prob):
    task, batch = sample(seed=3, batch_size=400, seq_len=256, trigger_prob=trigger_prob)
    triggers = trigger_letters(task)
    free = n_trigger = 0
    per_trigger = dict.fromkeys(triggers, 0)
    non_trigger_free = [0] * 52
    for text in to_strings(batch.inputs):
        previous_is_trigger = False
        for c in text:
            if not previous_is_trigger:  # a position not forced to be an output
                free += 1
                if c in triggers:
                    n_trigger += 1
                    per_trigger[c] += 1
                else:
                    non_trigger_free[VOCAB.index(c)] += 1
            previous_is_trigger = c in triggers
    rate = n_trigger / free
    assert abs(rate - trigger_prob) < 5 * math.sqrt(trigger_prob * (1 - trigger_prob) / free)
    for count in per_trigger.values():  # uniform among triggers
        assert abs(count - n_trigger / 5) < 5 * math.sqrt(n_trigger / 5)
    expected = (free - n_trigger) / 47
    assert all(abs(count - expected) < 5 * math.sqrt(expected) for count in non_trigger_free[5:])
    # overall fraction of trigger positions: p / (1 + p)
    overall = sum(text.count(c) for text in to_strings(batch.inputs) for c in triggers) / batch.inputs.numel()
    assert abs(overall - trigger_prob / (1 + trigger_prob)) < 0.01


def test_mask_is_exactly_the_later_occurrences_and_excludes_the_last_position():
    task, batch = sample(seed=4, batch_size=300, seq_len=24, trigger_prob=0.45)
    triggers = trigger_letters(task)
    texts = to_strings(batch.inputs)
    expected = torch.tensor([committed_positions(text, triggers) for text in texts])
    assert batch.mask.dtype == torch.bool
    assert torch.equal(batch.mask, expected)
    assert torch.equal(batch.info["committed"], expected)
    # the excluded case (a repeated trigger at the last position) does occur in this batch
    assert any(text[-1] in triggers and text[-1] in text[:-1] for text in texts)
    assert not batch.mask[:, -1].any()
    expected_position = torch.tensor([[text.index(c) if c in triggers else -1 for c in text] for text in texts])
    assert batch.info["trigger_position"].dtype == torch.int64
    assert torch.equal(batch.info["trigger_position"], expected_position)
    # every masked target is the trigger's output
    outputs = batch.info["outputs"]
    rows, cols = batch.mask.nonzero(as_tuple=True)
    trigger_index = batch.inputs[rows, cols]  # default triggers are ids 0..4
    assert torch.equal(batch.targets[rows, cols], outputs[rows, trigger_index])


def test_seeds_reproduce_and_differ():
    _, first = sample(seed=5)
    _, again = sample(seed=5)
    _, other = sample(seed=6)
    for key in ("inputs", "targets", "mask"):
        assert torch.equal(getattr(first, key), getattr(again, key))
    for key in first.info:
        assert torch.equal(first.info[key], again.info[key])
    assert not torch.equal(first.inputs, other.inputs)
    assert not torch.equal(first.info["outputs"], other.info["outputs"])


def test_perfect_predictor_scores_one_and_random_predictor_chance():
    task, batch = sample(seed=7, batch_size=200, seq_len=128)
    triggers = trigger_letters(task)
    metrics = task.evaluate(rule_logits(batch, triggers, 52), batch)
    assert metrics["accuracy"] == 1.0
    assert metrics["n_scored"] == float(batch.mask.sum()) > 1000
    assert metrics["loss_committed"] < 1e-6
    assert all(isinstance(value, float) for value in metrics.values())

    uniform = task.evaluate(torch.zeros(200, 128, 52), batch)
    assert uniform["loss_committed"] == pytest.approx(math.log(52), rel=1e-6)
    # random guesses among the 47 non-triggers: chance 1/47
    guesses = torch.randint(5, 52, (200, 128), generator=torch.Generator().manual_seed(0))
    metrics = task.evaluate(F.one_hot(guesses, 52).float(), batch)
    n = metrics["n_scored"]
    assert abs(metrics["accuracy"] - 1 / 47) < 5 * math.sqrt(1 / 47 / n)


def test_evaluate_on_a_batch_without_committed_triggers():
    task, batch = sample(seed=8, batch_size=2, seq_len=2)
    assert batch.mask.sum() == 0
    metrics = task.evaluate(torch.zeros(2, 2, 52), batch)
    assert metrics["n_scored"] == 0.0 and math.isnan(metrics["accuracy"])


def test_loss_is_cross_entropy_over_all_positions_not_just_the_mask():
    task, batch = sample(seed=9, batch_size=6, seq_len=40, trigger_prob=0.3)
    logits = torch.randn(6, 40, 52, generator=torch.Generator().manual_seed(1))
    by_hand = []
    for b in range(6):
        for t in range(39):
            by_hand.append(-torch.log_softmax(logits[b, t], dim=0)[batch.inputs[b, t + 1]])
    expected = torch.stack(by_hand).mean()
    assert torch.allclose(task.loss(logits, batch), expected, atol=1e-6)
    # perfect at the committed positions only: the training loss stays far from zero
    perfect_masked = logits.clone()
    perfect_masked[batch.mask] = rule_logits(batch, trigger_letters(task), 52)[batch.mask]
    assert task.evaluate(perfect_masked, batch)["loss_committed"] < 1e-6
    assert task.loss(perfect_masked, batch) > 1.0
    # half-precision logits give a float32 loss
    assert task.loss(logits.bfloat16(), batch).dtype == torch.float32


@pytest.mark.parametrize("seed", [0, 11, 12])
def test_committed_train_loss_is_cross_entropy_at_the_committed_triggers_only(seed):
    task, batch = sample(seed=seed, batch_size=6, seq_len=40, trigger_prob=0.3, train_loss="committed")
    assert task.config.train_loss == "committed" and batch.mask.any()
    logits = torch.randn(6, 40, 52, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    triggers = trigger_letters(task)
    by_hand = []  # positions from the plain-Python rule (a trigger seen before, not the last position)
    for b, text in enumerate(to_strings(batch.inputs)):
        for t, scored in enumerate(committed_positions(text, triggers)):
            if scored:
                by_hand.append(-torch.log_softmax(logits[b, t], dim=0)[batch.inputs[b, t + 1]])
    assert len(by_hand) == int(batch.mask.sum())
    assert torch.allclose(task.loss(logits, batch), torch.stack(by_hand).mean(), rtol=1e-12)
    # the other positions do not enter: changing their logits leaves the loss unchanged
    changed = torch.where(batch.mask[..., None], logits, logits + 5 * torch.randn_like(logits))
    assert torch.equal(task.loss(changed, batch), task.loss(logits, batch))
    # perfect at the committed positions: loss ~0 (while the default loss over all positions stays large)
    perfect = logits.clone()
    perfect[batch.mask] = rule_logits(batch, triggers, 52)[batch.mask].double()
    assert task.loss(perfect, batch) < 1e-6
    assert get_task("induction", seq_len=40, trigger_prob=0.3).loss(perfect, batch) > 1.0
    # the same batches are drawn and evaluated either way: the option only changes the training loss
    _, default_batch = sample(seed=seed, batch_size=6, seq_len=40, trigger_prob=0.3)
    assert torch.equal(default_batch.inputs, batch.inputs) and torch.equal(default_batch.mask, batch.mask)
    assert task.evaluate(logits, batch) == get_task("induction", seq_len=40, trigger_prob=0.3).evaluate(logits, batch)


def test_committed_train_loss_without_committed_triggers_is_zero_with_a_gradient():
    task = get_task("induction", seq_len=4, train_loss="committed")
    batch = Batch(inputs=torch.tensor([[0, 10, 1, 11]]), targets=torch.tensor([[10, 1, 11, IGNORE_INDEX]]),
                  mask=torch.zeros(1, 4, dtype=torch.bool))
    logits = torch.randn(1, 4, 52, requires_grad=True)
    loss = task.loss(logits, batch)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))


def test_bad_train_loss_is_refused():
    with pytest.raises(ValueError, match="train_loss"):
        get_task("induction", train_loss="masked")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counting_baseline_matches_a_loop(seed):
    """At every position, the most frequent non-trigger token so far (ties: the one seen first; none seen yet: the
    first trigger), against a Counter loop."""
    from collections import Counter

    task, batch = sample(seed=seed, batch_size=6, seq_len=48, trigger_prob=0.3)
    logits = task.baselines()["counting"](batch.inputs)
    triggers = set(task.config.trigger_ids)
    for b, row in enumerate(batch.inputs.tolist()):
        for t in range(len(row)):
            counts = Counter(x for x in row[: t + 1] if x not in triggers)  # insertion order: ties go to the first seen
            expected = counts.most_common(1)[0][0] if counts else task.config.trigger_ids[0]
            assert int(logits[b, t].argmax()) == expected and int((logits[b, t] == 0).sum()) == 1


def test_bayes_optimal_baseline():
    task, batch = sample(seed=10, batch_size=32, seq_len=64, trigger_prob=0.2)
    logits = task.baselines()["bayes_optimal"](batch.inputs)
    assert logits.shape == (32, 64, 52)
    assert task.evaluate(logits, batch)["accuracy"] == 1.0
    # its loss, recomputed in Python from the generating process
    p, triggers = 0.2, trigger_letters(task)
    total, count = 0.0, 0
    for text in to_strings(batch.inputs):
        for t, c in enumerate(text[:-1]):
            nxt = text[t + 1]
            if c in triggers and c in text[:t]:
                total += 0.0
            elif c in triggers:
                total += math.log(47)
            else:
                total += -math.log(p / 5) if nxt in triggers else -math.log((1 - p) / 47)
            count += 1
    assert task.loss(logits, batch).item() == pytest.approx(total / count, rel=1e-5)


def brute_force_query_mask(text: str, prompt_len: int, triggers: set[str]) -> list[bool]:
    mask = []
    for i in range(len(text) - prompt_len):
        g = prompt_len + i
        c = text[g]
        mask.append(c in triggers and c in text[:prompt_len] and c not in text[prompt_len:g] and g < len(text) - 1)
    return mask


@given(
    seed=st.integers(0, 2**31 - 1),
    seq_len=st.integers(2, 48),
    prompt_fraction=st.floats(0, 1, exclude_max=True),
    trigger_prob=st.sampled_from([0.1, 0.3, 0.6]),
)
def test_split_prompt_against_brute_force(seed, seq_len, prompt_fraction, trigger_prob):
    task, batch = sample(seed=seed, batch_size=12, seq_len=seq_len, trigger_prob=trigger_prob)
    prompt_len = 1 + int(prompt_fraction * (seq_len - 1))
    prompt, query, query_mask = split_prompt(batch, prompt_len)
    assert torch.equal(prompt, batch.inputs[:, :prompt_len])
    assert torch.equal(query, batch.inputs[:, prompt_len:])
    triggers = trigger_letters(task)
    expected = [brute_force_query_mask(text, prompt_len, triggers) for text in to_strings(batch.inputs)]
    assert query_mask.tolist() == expected


def test_split_prompt_positions_are_determined_by_the_prompt():
    task, batch = sample(seed=11, batch_size=64, seq_len=128, trigger_prob=0.2)
    P = 64
    _, query, query_mask = split_prompt(batch, P)
    assert query_mask.sum() > 50
    triggers = trigger_letters(task)
    texts = to_strings(batch.inputs)
    for b, i in query_mask.nonzero().tolist():
        text, g = texts[b], P + i
        first = text.index(text[g])
        assert first < P and text[g + 1] == text[first + 1]  # the target is what followed it in the prompt
    # subset of the committed positions
    assert not (query_mask & ~batch.mask[:, P:]).any()
    # the masked positions are exactly the first recurrences in the query of prompt triggers
    assert query_mask.tolist() == [brute_force_query_mask(text, P, triggers) for text in texts]
    with pytest.raises(ValueError):
        split_prompt(batch, 0)
    with pytest.raises(ValueError):
        split_prompt(batch, 128)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"n_triggers": 52}, "n_triggers"),
        ({"n_triggers": 60}, "n_triggers"),
        ({"n_triggers": 0}, "n_triggers"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"seq_len": 1}, "seq_len"),
        ({"seq_len": 2.5}, "seq_len"),
        ({"trigger_prob": 0.0}, "trigger_prob"),
        ({"trigger_prob": 1.0}, "trigger_prob"),
        ({"trigger_prob": -0.1}, "trigger_prob"),
        ({"trigger_prob": float("nan")}, "trigger_prob"),
        ({"trigger_prob": True}, "trigger_prob"),
        ({"triggers": (1, 2, 3)}, "triggers"),  # n_triggers is 5
        ({"triggers": (1, 1, 2, 3, 4)}, "triggers"),
        ({"triggers": (1, 2, 3, 4, 52)}, "triggers"),
        ({"triggers": (1, 2, 3, 4, -1)}, "triggers"),
    ],
)
def test_config_validation(overrides, field):
    with pytest.raises(ValueError, match=field):
        InductionConfig(**overrides)


def test_config_accepts_lists_and_custom_triggers():
    config = InductionConfig(n_triggers=2, triggers=[7, 3], vocab_size=10, seq_len=30)
    assert config.triggers == (7, 3) and config.trigger_ids == (7, 3)
    assert config.non_trigger_ids == (0, 1, 2, 4, 5, 6, 8, 9)
    InductionConfig(n_triggers=51)  # one non-trigger token is enough
