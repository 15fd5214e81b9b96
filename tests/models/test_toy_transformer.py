import pytest
import torch

from incontext.models.toy_transformer import STREAMS, ToyTransformer, ToyTransformerConfig, parameter_count


def reference(params: dict[str, torch.Tensor], stream: str, x: torch.Tensor) -> torch.Tensor:
    """One run, loops over positions, full second layer at every position: logits (B, L) of the last token."""
    d = x.shape[-1]
    wq1, wk1, wv1 = params["attn1"].split(d, dim=-1)
    wq2, wk2, wv2 = params["attn2"].split(d, dim=-1)
    out = []
    for seq in x:  # (T, d)
        q1, k1, v1 = seq @ wq1, seq @ wk1, seq @ wv1
        x2 = torch.stack([seq[t] + torch.softmax(k1[: t + 1] @ q1[t], 0) @ v1[: t + 1] for t in range(len(seq))])
        q2 = x2 @ wq2 + (q1 if stream == "q" else 0)
        k2 = x2 @ wk2 + (k1 if stream == "k" else 0)
        v2 = x2 @ wv2 + (v1 if stream == "v" else 0)
        x3 = torch.stack([x2[t] + torch.softmax(k2[: t + 1] @ q2[t], 0) @ v2[: t + 1] for t in range(len(seq))])
        h = x3[-1]
        for i in range(3):
            h = torch.relu(h @ params["mlp_weight"][i] + params["mlp_bias"][i])
        out.append(h @ params["readout"])
    return torch.stack(out)


def test_parameter_count_matches_the_paper():
    config = ToyTransformerConfig()
    assert parameter_count(config) == 207_303
    model = ToyTransformer(config, list(STREAMS))
    assert sum(p.numel() for p in model.parameters()) == 4 * 207_303  # zero extra parameters per stream


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_runs_match_the_reference_per_run(seed):
    torch.manual_seed(seed)
    d, length = 12, 7
    streams = ["none", "q", "k", "v"]
    model = ToyTransformer(ToyTransformerConfig(d_model=d, n_labels=5, init_dim=6), streams).double()
    x = torch.randn(len(streams), 3, length, d, dtype=torch.float64)
    logits = model(x)
    for r, stream in enumerate(streams):
        expected = reference(model.run_state(r), stream, x[r])
        assert torch.allclose(logits[r], expected, rtol=1e-12, atol=1e-12), stream


def test_runs_do_not_mix_gradients():
    torch.manual_seed(0)
    model = ToyTransformer(ToyTransformerConfig(d_model=10, n_labels=4, init_dim=5), ["v", "none", "k"]).double()
    x = torch.randn(3, 4, 5, 10, dtype=torch.float64)
    model(x)[1].sum().backward()
    for p in model.parameters():
        assert p.grad[0].abs().max() == 0 and p.grad[2].abs().max() == 0 and p.grad[1].abs().max() > 0


def test_streams_change_only_what_they_name():
    torch.manual_seed(0)
    model = ToyTransformer(ToyTransformerConfig(d_model=8, n_labels=3, init_dim=4), ["none", "v"]).double()
    with torch.no_grad():
        model.attn1[1].copy_(model.attn1[0])
        for p in (model.attn2, model.mlp_weight, model.mlp_bias, model.readout):
            p[1].copy_(p[0])
    x = torch.randn(1, 2, 5, 8, dtype=torch.float64).expand(2, -1, -1, -1)
    out = model(x)
    assert not torch.allclose(out[0], out[1])
    with torch.no_grad():  # with layer 1's values zero, the value stream adds nothing
        model.attn1[:, :, 16:].zero_()
    out = model(x)
    assert torch.allclose(out[0], out[1], rtol=0, atol=1e-14)


def test_seeded_init_is_shared_across_variants():
    gens = [torch.Generator().manual_seed(5) for _ in range(2)]
    model = ToyTransformer(ToyTransformerConfig(d_model=8, n_labels=3, init_dim=4), ["none", "q"], gens)
    for p in model.parameters():
        assert torch.equal(p[0], p[1])


def test_bad_input_is_named():
    model = ToyTransformer(ToyTransformerConfig(d_model=8, n_labels=3, init_dim=4), ["none"])
    with pytest.raises(ValueError, match="inputs must be"):
        model(torch.randn(2, 1, 3, 8))
    with pytest.raises(ValueError, match="streams"):
        ToyTransformer(ToyTransformerConfig(), ["w"])
