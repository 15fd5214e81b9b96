import json

from incontext.cli.commands import main


def test_tint_table3_runs_at_toy_size(tmp_path):
    assert main(["run", "tint-table3", "--set", "d_model=48", "--set", "n_layer=1", "--set", "n_head=2",
                 "--set", "vocab_size=100", "--set", "t_aux=64", "--set", "run_tokens=8", "--set", "run_train=5",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["gpt2_small_built_meta"] == results["gpt2_small_formula"]
    assert results["step"]["logits_rel_error_vs_r_approx"] < 1e-7
    assert results["formula_billions"]["OPT-1.3B"]["total_sum"] == 10.824
    assert (tmp_path / "table.md").is_file()


def test_tint_perplexity_runs_at_toy_size(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert main(["run", "tint-perplexity", "--set", "steps=2", "--set", "documents=2", "--set", "tune_documents=1",
                 "--set", "n_layer=1", "--set", "vocab_size=300", "--set", "seq_len=24", "--set", "d_model=48",
                 "--set", "n_head=2", "--set", "inner_lrs=[0.001]", "--set", "batch_size=4", "--set", "fractions=[0.5]", "--set", "exact_documents=1",
                 "--out", str(tmp_path / "out")]) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["perplexity"]) == {"vanilla", "dynamic eval", "TinT"}
    assert all(len(v) == 1 and v[0] > 1 for v in results["perplexity"].values())
    assert results["vs_r_exact"]["0.5"]["update_cosine"] > 0.9
    from incontext.experiments.tint_perplexity import SUBSETS

    assert set(results["gain_share"]) == {"TinT", *SUBSETS} and set(results["subset_perplexity"]) == set(SUBSETS)
    assert "| + LM head (untied copy) (`tint,head`; lr 0.001) |" in (tmp_path / "out" / "table.md").read_text()


def test_gain_shares_are_paired_ratios_with_bootstrap_intervals():
    """A row whose per-document loss sits a fixed share s of the way from vanilla to dynamic eval has share s
    in every resample; one that is vanilla plus noise has share 0 inside a wide interval."""
    import torch

    from incontext.experiments.tint_perplexity import PerplexityConfig, gain_shares

    g = torch.Generator().manual_seed(0)
    vanilla = 300 + 10 * torch.rand(2, 40, generator=g, dtype=torch.float64)
    dynamic = vanilla - torch.rand(2, 40, generator=g, dtype=torch.float64)
    noisy = vanilla + 0.5 * torch.randn(2, 40, generator=g, dtype=torch.float64)
    noisy -= (noisy - vanilla).sum(-1, keepdim=True) / 40  # summed gain exactly 0
    losses = {"vanilla": vanilla.tolist(), "dynamic eval": dynamic.tolist(),
              "fixed": (vanilla - 0.3 * (vanilla - dynamic)).tolist(), "noise": noisy.tolist()}
    shares = gain_shares(losses, PerplexityConfig(fractions=[0.3, 0.7], bootstrap=500))
    assert set(shares) == {"fixed", "noise"}
    for s in [*shares["fixed"]["per_fraction"], shares["fixed"]["pooled"]]:
        assert abs(s["share"] - 0.3) < 1e-12 and abs(s["low"] - 0.3) < 1e-12 and abs(s["high"] - 0.3) < 1e-12
    for s in [*shares["noise"]["per_fraction"], shares["noise"]["pooled"]]:
        assert abs(s["share"]) < 1e-9 and s["low"] < -0.05 and s["high"] > 0.05
