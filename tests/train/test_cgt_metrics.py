"""CGT Table 1 metrics (train/cgt_metrics.py) against plain references written here, in float64."""

import math

import pytest
import torch

from incontext.absorb import get_absorb_method
from incontext.models import CGT, CGTConfig, Transformer, TransformerConfig
from incontext.tasks import get_task
from incontext.tasks.arithmetic import CHAR_TO_ID
from incontext.tasks.base import Batch
from incontext.train.cgt_metrics import (
    TaskSpans,
    base_accuracy,
    cgt_arithmetic_metrics,
    dot_product_map,
    join_transition,
    linear_fit,
    probe_r2,
    representation_variation,
    specialized_accuracy,
    y_spread,
)


def arithmetic(seed=0, batch=8, **options):
    task = get_task("arithmetic", **{"digits": 1, "n_tasks": 2, "n_ex": 4, **options})
    return task, task.sample(batch, torch.Generator().manual_seed(seed))


def random_cgt(seed, vocab_size, max_seq_len):
    torch.manual_seed(seed)
    model = CGT(CGTConfig(n_layer=3, split_layer=1, d_x=16, n_head_x=2, d_y=8, n_head_y=2, rank=2, n_templates=3,
                          vocab_size=vocab_size, max_seq_len=max_seq_len)).double()
    with torch.no_grad():  # non-trivial T (the left templates start at zero)
        for name, p in model.named_parameters():
            if name.endswith((".left", ".right")):
                p.normal_(0.0, 1.5)
    return model.eval()


@pytest.mark.parametrize("digits,n_tasks,n_ex,n_prompt", [(1, 2, 4, 2), (2, 3, 5, 1), (1, 1, 3, 2)])
def test_task_spans_match_the_sequences(digits, n_tasks, n_ex, n_prompt):
    task, batch = arithmetic(digits=digits, n_tasks=n_tasks, n_ex=n_ex)
    spans = TaskSpans.of(task.config, n_prompt)
    assert spans.task(n_tasks - 1)[2] == batch.inputs.shape[1]
    for k in range(n_tasks):
        start, cut, end = spans.task(k)
        assert (batch.inputs[:, end - 1] == CHAR_TO_ID["#"]).all()  # the task's closing separator
        assert (batch.inputs[:, cut - 1] == CHAR_TO_ID["|"]).all()  # the last prompt example's separator
        # every answer position of the task's measured examples lies in [cut, end), none of its prompt examples'
        measured = batch.mask & (batch.info["task_index"] == k) & (batch.info["example_index"] >= n_prompt)
        where = measured.nonzero()[:, 1]
        assert where.numel() > 0 and where.min() >= cut and where.max() < end
    with pytest.raises(ValueError, match="n_prompt"):
        TaskSpans.of(task.config, n_ex)


def reference_variation(y, spans):
    """Eq. (4) by loops: per sequence and task, centre y over the task, divide by the root mean squared norm,
    and average ||n_s - n_(s-1)|| over the measured positions s."""
    totals = []
    for k in range(spans.n_tasks):
        start, cut, end = spans.task(k)
        per_sequence = []
        for b in range(y.shape[0]):
            piece = [y[b, t] for t in range(start, end)]
            mean = sum(piece) / len(piece)
            rms = math.sqrt(sum(float((v - mean) @ (v - mean)) for v in piece) / len(piece))
            n = [(v - mean) / rms for v in piece]
            steps = [float(torch.linalg.norm(n[s - start] - n[s - start - 1])) for s in range(cut, end)]
            per_sequence.append(sum(steps) / len(steps))
        totals.append(sum(per_sequence) / len(per_sequence))
    return sum(totals) / len(totals)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_representation_variation_matches_a_loop_reference(seed):
    task, _ = arithmetic(n_tasks=3, n_ex=4)
    spans = TaskSpans.of(task.config)
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(3, spans.task(2)[2], 5, generator=g, dtype=torch.float64)
    assert representation_variation(y, spans) == pytest.approx(reference_variation(y, spans), rel=1e-12)
    # invariant to a per-task shift and scale of y; zero for a y constant over each task
    shift, scale = torch.randn(5, generator=g, dtype=torch.float64), 3.7
    assert representation_variation(scale * y + shift, spans) == pytest.approx(representation_variation(y, spans), rel=1e-10)
    constant = torch.zeros_like(y)
    for k in range(spans.n_tasks):
        start, _, end = spans.task(k)
        constant[:, start:end] = torch.randn(3, 1, 5, generator=g, dtype=torch.float64)
    assert representation_variation(constant, spans) == 0.0


def test_linear_fit_recovers_linear_codes_and_not_noise():
    task, batch = arithmetic(batch=64, n_tasks=2)
    spans = TaskSpans.of(task.config)
    g = torch.Generator().manual_seed(3)
    T = batch.inputs.shape[1]
    mix = torch.randn(2, 6, generator=g, dtype=torch.float64)
    y = torch.randn(64, T, 6, generator=g, dtype=torch.float64)
    params = {"a": batch.info["a"].double(), "b": batch.info["b"].double()}
    for k in range(spans.n_tasks):  # measured positions hold an affine code of (a, b)
        _, cut, end = spans.task(k)
        code = torch.stack([params["a"][:, k], params["b"][:, k]], -1) @ mix + 0.5
        y[:, cut:end] = code[:, None]
    fit = linear_fit(y, params, spans)
    assert fit["r2_a"] > 1 - 1e-9 and fit["r2_b"] > 1 - 1e-9 and fit["mean_abs_error"] < 1e-6
    noise = torch.randn(64, T, 6, generator=g, dtype=torch.float64)
    unrelated = linear_fit(noise, params, spans)
    assert unrelated["r2_a"] < 0.2 and unrelated["r2_b"] < 0.2
    with pytest.raises(ValueError, match="at least 4"):
        linear_fit(y[:3], {k: v[:3] for k, v in params.items()}, spans)


def test_linear_fit_gives_the_same_bits_wherever_its_input_sits_in_memory():
    """torch's default CPU lstsq driver (gelsy) gave 4 different results over these 12 placements."""
    task, batch = arithmetic(batch=64, n_tasks=2)
    spans = TaskSpans.of(task.config)
    y = torch.randn(64, batch.inputs.shape[1], 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    params = {"a": batch.info["a"].double(), "b": batch.info["b"].double()}
    results, held = set(), []
    for offset in range(12):
        held.append(torch.empty(1 + 7 * offset, dtype=torch.float64))  # moves where the allocator puts the next tensors
        placed = torch.empty(y.numel() + offset, dtype=torch.float64)[offset:].view_as(y)
        placed.copy_(y)
        results.add(tuple(linear_fit(placed, params, spans).values()))
    assert len(results) == 1


def test_dot_product_map_matches_a_loop_reference():
    y = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    expected = torch.zeros(7, 7, dtype=torch.float64)
    for b in range(3):
        for s in range(7):
            for t in range(7):
                expected[s, t] += float(y[b, s] @ y[b, t] / (y[b, s].norm() * y[b, t].norm())) / 3
    assert torch.allclose(dot_product_map(y), expected, rtol=0, atol=1e-13)
    assert torch.allclose(dot_product_map(y).diagonal(), torch.ones(7, dtype=torch.float64), atol=1e-13)


def reference_scores(logits, targets, mask, answer_chars):
    chars, exact = [], []
    for b in range(logits.shape[0]):
        positions = [t for t in range(logits.shape[1]) if mask[b, t]]
        hits = [bool(logits[b, t].argmax() == targets[b, t]) for t in positions]
        chars += hits
        exact += [all(hits[i:i + answer_chars]) for i in range(0, len(hits), answer_chars)]
    return sum(chars) / len(chars), sum(exact) / len(exact)


@pytest.mark.parametrize("seed", [0, 1])
def test_accuracies_match_references_and_the_folded_model(seed):
    task, batch = arithmetic(seed=seed, batch=4)
    spans, answer_chars = TaskSpans.of(task.config), task.config.digits + 3
    model = random_cgt(seed, vocab_size=16, max_seq_len=batch.inputs.shape[1])
    # base accuracy: the measured examples' answers, the whole sequence in context
    measured = batch.mask & (batch.info["example_index"] >= spans.n_prompt)
    with torch.no_grad():
        char, exact = reference_scores(model(batch.inputs), batch.targets, measured, answer_chars)
    base = base_accuracy(model, batch, spans, answer_chars)
    assert base == {"char_accuracy": pytest.approx(char, abs=1e-12), "exact_match": pytest.approx(exact, abs=1e-12)}
    # specialised accuracy: each task's measured examples run by the model folded at the end of its prompt
    # examples (the absorb method, another code path). With the folded model's own argmax as targets every
    # answer character must count as right, and with one target changed per task exactly that one as wrong.
    fold = get_absorb_method("cgt-fold")
    targets = batch.targets.clone()
    for b in range(batch.inputs.shape[0]):
        for k in range(spans.n_tasks):
            _, cut, end = spans.task(k)
            with torch.no_grad():
                folded = fold.absorb(model, batch.inputs[b : b + 1, :cut])(batch.inputs[b : b + 1, cut:end])[0]
            targets[b, cut:end] = torch.where(batch.mask[b, cut:end], folded.argmax(-1), batch.targets[b, cut:end])
    rigged = Batch(batch.inputs, targets, batch.mask, batch.info)
    assert specialized_accuracy(model, rigged, spans, answer_chars) == {"char_accuracy": 1.0, "exact_match": 1.0}
    first = [spans.task(k)[1] + int(batch.mask[0, spans.task(k)[1]:].nonzero()[0]) for k in range(spans.n_tasks)]
    for t in first:
        targets[0, t] = (targets[0, t] + 1) % 16
    answers = batch.mask[:, spans.task(0)[1]:spans.task(0)[2]].sum().item() // answer_chars * spans.n_tasks
    special = specialized_accuracy(model, Batch(batch.inputs, targets, batch.mask, batch.info), spans, answer_chars)
    chars = answers * answer_chars
    assert special == {"char_accuracy": pytest.approx(1 - spans.n_tasks / chars, abs=1e-12),
                       "exact_match": pytest.approx(1 - spans.n_tasks / answers, abs=1e-12)}


def test_cgt_only_metrics_are_skipped_for_a_transformer():
    task, batch = arithmetic(batch=8)
    torch.manual_seed(0)
    transformer = Transformer(TransformerConfig(n_layer=1, d_model=16, n_head=2, vocab_size=16,
                                                max_seq_len=batch.inputs.shape[1])).eval()
    metrics = cgt_arithmetic_metrics(transformer, batch, task.config)
    assert sorted(metrics) == ["base_char_accuracy", "base_exact_match", "no_prompt_char_accuracy", "no_prompt_exact_match"]
    cgt = random_cgt(0, vocab_size=16, max_seq_len=batch.inputs.shape[1]).float()
    metrics = cgt_arithmetic_metrics(cgt, batch, task.config)
    assert {"specialized_char_accuracy", "variation", "linear_fit_r2_a", "linear_fit_mean_abs_error"} <= set(metrics)


def test_probe_r2_finds_a_linear_code_and_no_code():
    g = torch.Generator().manual_seed(0)
    targets = torch.randn(400, 5, generator=g, dtype=torch.float64)
    mixing = torch.randn(5, 12, generator=g, dtype=torch.float64)
    encoded = targets @ mixing + 3.0 + 1e-3 * torch.randn(400, 12, generator=g, dtype=torch.float64)
    assert probe_r2(encoded, targets, lam=1e-8) > 0.999
    assert probe_r2(torch.randn(400, 12, generator=g, dtype=torch.float64), targets) < 0.1


def test_join_transition_against_a_loop():
    g = torch.Generator().manual_seed(3)
    y = torch.randn(4, 20, 6, generator=g, dtype=torch.float64)
    joins = torch.tensor([5, 9, 12, 3])
    out = join_transition(y, joins, window=4)
    assert out["offsets"] == list(range(-4, 5))

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    for i, d in enumerate(out["offsets"]):
        rows = [(b, int(j) + d) for b, j in enumerate(joins) if 0 <= int(j) + d < 20]
        before = sum(cos(y[b, s], y[b, int(joins[b]) - 1]) for b, s in rows) / len(rows)
        end = sum(cos(y[b, s], y[b, -1]) for b, s in rows) / len(rows)
        assert abs(out["cos_with_before_join"][i] - before) < 1e-12 and abs(out["cos_with_end"][i] - end) < 1e-12


class _FixedContext:
    """A stand-in CGT whose context is a given tensor per document (looked up by its first token)."""

    def __init__(self, ys):
        self.ys = ys

    def context(self, tokens):
        return self.ys[int(tokens[0, 0])][None, : tokens.shape[1]]


def test_y_spread_tells_a_collapsed_y_from_a_spread_one():
    g = torch.Generator().manual_seed(4)
    docs = [(0, torch.full((12,), i)) for i in range(5)]
    direction = torch.randn(8, generator=g, dtype=torch.float64)
    collapsed = {i: direction * (1 + torch.rand(12, 1, generator=g, dtype=torch.float64)) for i in range(5)}
    spread = {i: torch.randn(8, generator=g, dtype=torch.float64) + 0.05 * torch.randn(12, 8, generator=g, dtype=torch.float64)
              for i in range(5)}
    same = y_spread(_FixedContext(collapsed), docs, seq_len=12, skip=2)
    assert same["cos_across"] > 1 - 1e-12 and same["cos_within"] > 1 - 1e-12
    apart = y_spread(_FixedContext(spread), docs, seq_len=12, skip=2)
    assert apart["cos_within"] > 0.99 and apart["cos_across"] < 0.7 and apart["between_share"] > 0.9
    # reference for the shares: variance between document means over the total, computed directly
    ys = torch.stack([spread[i][2:] for i in range(5)])
    flat = ys.reshape(-1, 8)
    total = ((flat - flat.mean(0)) ** 2).sum(-1).mean()
    between = ((ys.mean(1) - flat.mean(0)) ** 2).sum(-1).mean()
    assert abs(apart["between_share"] - float(between / total)) < 1e-12
