import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from incontext.tasks import ArithmeticConfig, Batch, get_task
from incontext.tasks.arithmetic import VOCAB, decode, encode, to_strings

PAPER_EXAMPLE = "154*709=+07058|648*011=+05920|526*187=+06230|893*495=+11997#"


def sample(seed: int = 0, batch_size: int = 4, **overrides):
    task = get_task("arithmetic", **overrides)
    return task, task.sample(batch_size, torch.Generator().manual_seed(seed))


def parse(text: str, digits: int) -> list[re.Match]:
    """Independent parser: the whole string must be a run of examples 'A*B=sC' followed by '|' or '#'."""
    example = rf"(\d{{{digits}}})\*(\d{{{digits}}})=([+-])(\d{{{digits + 2}}})([|#])"
    assert re.fullmatch(rf"(?:{example})+", text), text
    return list(re.finditer(example, text))


def perfect_logits(batch: Batch) -> torch.Tensor:
    return F.one_hot(batch.targets.clamp(min=0), len(VOCAB)).float() * 10.0


def test_vocab_and_paper_example_round_trip():
    assert VOCAB == "0123456789*=+-|#" and len(VOCAB) == 16
    assert encode("0123456789*=+-|#") == list(range(16))
    ids = encode(PAPER_EXAMPLE)
    assert decode(ids) == PAPER_EXAMPLE
    assert decode(torch.tensor(ids)) == PAPER_EXAMPLE
    assert to_strings(torch.tensor([ids, ids])) == [PAPER_EXAMPLE] * 2
    assert len(parse(PAPER_EXAMPLE, 3)) == 4 and len(PAPER_EXAMPLE) == 60


def check_against_independent_parse(task, batch: Batch) -> None:
    cfg, d = task.config, task.config.digits
    a, b = batch.info["a"].tolist(), batch.info["b"].tolist()
    A, B, C = batch.info["A"].tolist(), batch.info["B"].tolist(), batch.info["C"].tolist()
    for row, text in enumerate(to_strings(batch.inputs)):
        assert len(text) == cfg.n_tasks * cfg.n_ex * (2 * d + d + 2 + 3 + 1) == task.sequence_length
        matches = parse(text, d)
        assert len(matches) == cfg.n_tasks * cfg.n_ex
        for number, match in enumerate(matches):
            i, j = divmod(number, cfg.n_ex)
            A_text, B_text, sign, C_text, separator = match.groups()
            assert separator == ("#" if j == cfg.n_ex - 1 else "|")
            assert (int(A_text), int(B_text)) == (A[row][i][j], B[row][i][j])
            # The answer, recomputed in Python from the task's coefficients.
            expected = math.trunc(a[row][i] * int(A_text) + b[row][i] * int(B_text))
            assert C[row][i][j] == expected
            assert sign == ("+" if expected >= 0 else "-")
            assert int(C_text) == abs(expected)


def test_sequences_parse_and_answers_match_the_coefficients():
    task, batch = sample(batch_size=16)
    assert batch.inputs.shape == (16, 240) and batch.inputs.dtype == torch.int64
    assert task.sequence_length == 240 and task.model_io() == {"vocab_size": 16}
    check_against_independent_parse(task, batch)
    # Real coefficients in [0, 10) and (-10, 10); operands in [0, 1000) with zero padding in use.
    a, b, A = batch.info["a"], batch.info["b"], batch.info["A"]
    assert a.dtype == torch.float64 and a.shape == (16, 4)
    assert torch.all((0 <= a) & (a < 10)) and torch.all((-10 < b) & (b < 10))
    assert torch.any(a != a.round()) and torch.any(b < 0)
    assert A.min() >= 0 and A.max() < 1000 and torch.any(A < 100)
    assert torch.any(batch.info["C"] < 0)  # negative answers occur and get a '-'


def test_separator_positions():
    task, batch = sample(n_tasks=3, n_ex=2, digits=2)
    L = 3 * 2 + 6
    text = to_strings(batch.inputs)[0]
    bars = [t for t, c in enumerate(text) if c == "|"]
    hashes = [t for t, c in enumerate(text) if c == "#"]
    assert bars == [L - 1, 3 * L - 1, 5 * L - 1]
    assert hashes == [2 * L - 1, 4 * L - 1, 6 * L - 1]


def test_integer_coefficients():
    task, batch = sample(batch_size=200, integer_coefficients=True)
    a, b = batch.info["a"], batch.info["b"]
    assert torch.all(a == a.round()) and torch.all(b == b.round())
    assert set(a.long().unique().tolist()) == set(range(0, 10))
    assert set(b.long().unique().tolist()) == set(range(-9, 10))
    check_against_independent_parse(task, batch)


def test_targets_are_inputs_shifted():
    _, batch = sample()
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    assert torch.all(batch.targets[:, -1] == -100)


def test_mask_covers_exactly_the_answer_characters():
    d = 3
    task, batch = sample(batch_size=3, digits=d)
    assert torch.equal(batch.mask, batch.info["answer_mask"])
    for row, text in enumerate(to_strings(batch.inputs)):
        expected = torch.zeros(len(text), dtype=torch.bool)
        for match in parse(text, d):
            expected[match.start(3) - 1 : match.end(4) - 1] = True  # logits one before each answer char
        assert torch.equal(batch.mask[row], expected)
        assert int(expected.sum()) == 16 * (d + 3)
        answers = decode(batch.targets[row][batch.mask[row]])
        assert answers == "".join(m.group(3) + m.group(4) for m in parse(text, d))


def test_task_and_example_indices_follow_targets():
    task, batch = sample(batch_size=2, n_tasks=3, n_ex=2, digits=2)
    task_index, example_index = batch.info["task_index"], batch.info["example_index"]
    for row, text in enumerate(to_strings(batch.inputs)):
        for number, match in enumerate(parse(text, 2)):
            i, j = divmod(number, 2)
            # Position t is labelled by the example of its target, the character at t + 1.
            for t in range(max(match.start() - 1, 0), match.start(5) - 1):
                assert (task_index[row, t], example_index[row, t]) == (i, j), (number, t)
            separator_target = match.start(5) - 1
            assert (task_index[row, separator_target], example_index[row, separator_target]) == (-1, -1)
    # -1 marks exactly the positions whose target is a separator or ignored.
    separator_ids = torch.tensor(encode("|#"))
    targets_outside = torch.isin(batch.targets, separator_ids) | (batch.targets < 0)
    assert torch.equal(task_index == -1, targets_outside)
    assert torch.equal(example_index == -1, targets_outside)


def test_perfect_and_corrupted_predictions():
    task, batch = sample(batch_size=4)
    logits = perfect_logits(batch)
    metrics = task.evaluate(logits, batch)
    assert metrics == {"char_accuracy": 1.0, "exact_match": 1.0, "char_accuracy_by_example": [1.0] * 4}
    assert task.loss(logits, batch).item() < 1e-3

    # Getting non-answer characters wrong costs nothing.
    unmasked_wrong = logits.clone()
    unmasked_wrong[~batch.mask] = logits[~batch.mask].roll(1, dims=-1)
    assert task.evaluate(unmasked_wrong, batch) == metrics

    # One wrong digit in one answer of example index 2.
    positions = torch.nonzero(batch.mask[0] & (batch.info["example_index"][0] == 2)).flatten()
    corrupted = logits.clone()
    corrupted[0, positions[-1]] = corrupted[0, positions[-1]].roll(1)
    metrics = task.evaluate(corrupted, batch)
    n_answers, n_chars = 4 * 16, 4 * 16 * 6
    assert metrics["exact_match"] == pytest.approx(1 - 1 / n_answers)
    assert metrics["char_accuracy"] == pytest.approx(1 - 1 / n_chars)
    assert metrics["char_accuracy_by_example"][2] == pytest.approx(1 - 1 / (n_chars / 4))
    assert metrics["char_accuracy_by_example"][:2] == [1.0, 1.0] and metrics["char_accuracy_by_example"][3] == 1.0

    # Uniform logits: loss log(16), accuracy from argmax ties (always '0').
    uniform = torch.zeros_like(logits)
    assert task.loss(uniform, batch).item() == pytest.approx(math.log(16))
    assert task.evaluate(uniform, batch)["exact_match"] == 0.0  # the sign is never '0'


def test_seeds_reproduce():
    _, first = sample(seed=7)
    _, again = sample(seed=7)
    _, other = sample(seed=8)
    assert torch.equal(first.inputs, again.inputs)
    for key in first.info:
        assert torch.equal(first.info[key], again.info[key]), key
    assert not torch.equal(first.inputs, other.inputs)


def test_answer_bound_validation():
    with pytest.raises(ValueError, match="digits"):
        ArithmeticConfig(a_range=(0.0, 60.0), b_range=(-50.0, 50.0))  # 110 * 999 >= 10^5
    ArithmeticConfig(a_range=(0.0, 50.0), b_range=(-49.0, 49.0))  # 99 * 999 < 10^5: fits
    with pytest.raises(ValueError):
        ArithmeticConfig(digits=1, a_range=(-600.0, 0.0), b_range=(-500.0, 500.0))


@settings(max_examples=10, deadline=None)
@given(
    n_tasks=st.integers(1, 3),
    n_ex=st.integers(1, 4),
    digits=st.integers(1, 5),
    integer_coefficients=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_configurations_parse(n_tasks, n_ex, digits, integer_coefficients, seed):
    task, batch = sample(
        seed=seed, batch_size=2, n_tasks=n_tasks, n_ex=n_ex, digits=digits, integer_coefficients=integer_coefficients
    )
    check_against_independent_parse(task, batch)
    assert int(batch.mask.sum()) == 2 * n_tasks * n_ex * (digits + 3)
    assert task.evaluate(perfect_logits(batch), batch)["exact_match"] == 1.0
