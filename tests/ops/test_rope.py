import torch

from incontext.ops.rope import apply_rope, rope_cos_sin


def rotate(x, position, theta=10000.0):
    cos, sin = rope_cos_sin(torch.tensor([position]), x.shape[-1], theta, x.dtype)
    return apply_rope(x, cos, sin)


def test_rotations_compose_and_invert():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64)
    assert torch.allclose(rotate(rotate(x, 3), 5), rotate(x, 8), atol=1e-12)  # R_a R_b = R_{a+b}
    assert torch.allclose(rotate(rotate(x, 7), -7), x, atol=1e-12)  # R_m^T = R_{-m}
    assert torch.allclose(rotate(x, 11).norm(), x.norm(), atol=1e-12)


def test_scores_depend_on_relative_position_only():
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64) for _ in range(2))
    a = (rotate(q, 9) * rotate(k, 4)).sum()
    b = (rotate(q, 105) * rotate(k, 100)).sum()
    assert torch.allclose(a, b, atol=1e-12)
    assert not torch.allclose(a, (rotate(q, 9) * rotate(k, 5)).sum())


def test_rotate_half_layout_pairs_i_with_i_plus_half():
    x = torch.zeros(1, 1, 1, 4, dtype=torch.float64)
    x[..., 0] = 1.0
    y = rotate(x, 1)
    angle = torch.tensor(1.0, dtype=torch.float64)
    assert torch.allclose(y[..., 0], angle.cos()) and torch.allclose(y[..., 2], angle.sin())
    assert y[..., 1].abs().item() < 1e-15 and y[..., 3].abs().item() < 1e-15
