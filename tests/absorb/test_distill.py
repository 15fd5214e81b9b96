"""The pipeline's objective: the top-k KL with one bucket for the tail mass is a true divergence of the coarsened
distributions (>= 0, at most the full KL, the full KL at k = V, float64), where the plain top-k term can go below 0."""

import pytest
import torch
import torch.nn.functional as F

from incontext.absorb.distill import distillation_loss


def targets(teacher: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    values, index = F.log_softmax(teacher, -1).topk(k, -1)
    return {"teacher": values, "index": index, "mask": torch.ones(teacher.shape[:2], dtype=torch.bool)}


@pytest.mark.parametrize("seed", range(6))
def test_the_tail_bucket_kl_is_a_divergence_and_the_full_kl_at_k_equal_v(seed):
    g = torch.Generator().manual_seed(seed)
    batch, length, vocab = 1 + seed % 3, 2 + seed, 7 + 9 * seed
    student = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * (1 + seed)
    teacher = torch.randn(batch, length, vocab, generator=g, dtype=torch.float64) * (1 + seed % 2)
    full = distillation_loss(student, {"teacher": F.log_softmax(teacher, -1), "mask": torch.ones(batch, length, dtype=torch.bool)})
    # the same by hand: sum_v p_v (log p_v - log q_v), averaged over positions
    p, log_q = F.softmax(teacher, -1), F.log_softmax(student, -1)
    assert abs(float(full) - float((p * (p.log() - log_q)).sum(-1).mean())) < 1e-12
    coarse = [float(distillation_loss(student, targets(teacher, k), tail=True)) for k in range(1, vocab + 1)]
    assert all(c >= 0 for c in coarse) and all(a <= b + 1e-12 for a, b in zip(coarse, coarse[1:]))  # finer: larger
    assert abs(coarse[-1] - float(full)) < 1e-10 and max(coarse) <= float(full) + 1e-10


def test_the_plain_top_k_term_is_no_divergence():
    """The top-k term alone goes below 0 where the student holds more of the top k than the teacher (the `kl` the
    progress bar showed as -0.15); the tail bucket puts it back above."""
    teacher = torch.tensor([[[2.0, 1.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)
    student = torch.tensor([[[6.0, 5.0, -5.0, -5.0, -5.0]]], dtype=torch.float64)
    assert float(distillation_loss(student, targets(teacher, 2))) < 0
    assert float(distillation_loss(student, targets(teacher, 2), tail=True)) > 0


def test_the_tail_bucket_trains_a_prefix(monkeypatch):
    from test_kv_prefix import FAST, prompt_and_query, tiny

    from incontext.absorb import get_absorb_method

    model = tiny()
    prompt, _ = prompt_and_query()
    trained = get_absorb_method("kv-prefix", prefix_tokens=5, steps=10, learning_rate=0.05, tail=True, patience=50,
                                **FAST).absorb(model, prompt)
    assert all(x >= 0 for x in trained.history["loss"]) and trained.history["loss"][-1] < trained.history["loss"][0]


def test_the_tail_bucket_has_a_finite_gradient_where_the_student_holds_all_the_top_k_mass():
    """A student whose top k hold all its mass (the rest rounds to 0): the loss and its gradient stay finite (the
    documents sweep's first run of tail=true ended non-finite there)."""
    for dtype in (torch.float32, torch.float64):
        teacher = torch.tensor([[[3.0, 2.0, 0.0, -1.0]]], dtype=dtype)
        student = torch.tensor([[[60.0, 59.0, -60.0, -60.0]]], dtype=dtype, requires_grad=True)
        loss = distillation_loss(student, targets(teacher, 2), tail=True)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(student.grad).all() and float(loss) > 0
