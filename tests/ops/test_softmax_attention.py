import pytest
import torch

from incontext.ops.softmax_attention import causal_mask, softmax_attention_reference, softmax_attention_sdpa


@pytest.mark.parametrize("n_cached", [0, 1, 5])
@pytest.mark.parametrize("n_queries", [1, 3, 17])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_sdpa_matches_reference_float64(n_cached, n_queries, scale):
    g = torch.Generator().manual_seed(n_cached * 100 + n_queries)
    q = torch.randn(2, 3, n_queries, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, n_cached + n_queries, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, n_cached + n_queries, 5, generator=g, dtype=torch.float64)
    ref = softmax_attention_reference(q, k, v, scale=scale)
    fast = softmax_attention_sdpa(q, k, v, scale=scale)
    assert float((fast - ref).norm() / ref.norm()) < 1e-10


def test_causal_mask_with_cache_aligns_queries_to_the_last_keys():
    mask = causal_mask(2, 5, "cpu")
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_reference_is_causal():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    out = softmax_attention_reference(q, k, v, scale=0.5)
    v2 = v.clone()
    v2[..., 4:, :] += 10.0  # changing the future must not change the past
    out2 = softmax_attention_reference(q, k, v2, scale=0.5)
    assert torch.equal(out[..., :4, :], out2[..., :4, :])
    assert not torch.allclose(out[..., 4:, :], out2[..., 4:, :])


@pytest.mark.parametrize("heads, kv_heads, t, p", [(4, 2, 5, 0), (9, 3, 1, 7), (6, 1, 3, 4), (8, 8, 2, 3)])
def test_grouped_kv_heads_match_the_expanded_reference(heads, kv_heads, t, p):
    """Fewer K/V heads than query heads: the fast path shares them (no copy), the reference expands them."""
    g = torch.Generator().manual_seed(heads * 10 + t)
    q = torch.randn(2, heads, t, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, kv_heads, p + t, 8, generator=g, dtype=torch.float64) for _ in range(2))
    expanded = [x.repeat_interleave(heads // kv_heads, dim=1) for x in (k, v)]
    reference = softmax_attention_reference(q, *expanded, scale=0.3)
    assert (softmax_attention_sdpa(q, k, v, scale=0.3) - reference).abs().max() < 1e-12
    assert (softmax_attention_reference(q, k, v, scale=0.3) - reference).abs().max() == 0


@pytest.mark.parametrize("n_cached", [0, 5])
def test_under_cpu_autocast_attention_stays_float32(n_cached):
    """Within torch.autocast on a CPU (bf16 matmuls), the fast path computes attention in float32 from bf16 inputs:
    its output is float32 and equals float32 attention of the same (rounded) inputs."""
    g = torch.Generator().manual_seed(n_cached)
    q = torch.randn(2, 4, 6, 8, generator=g).bfloat16()
    k, v = (torch.randn(2, 2, n_cached + 6, 8, generator=g).bfloat16() for _ in range(2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = softmax_attention_sdpa(q, k, v, scale=0.35)
    expected = softmax_attention_reference(q.double(), k.double(), v.double(), scale=0.35)
    assert out.dtype == torch.float32 and (out.double() - expected).abs().max() < 1e-5
