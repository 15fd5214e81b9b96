"""cgt-moving-average and cgt-three-excerpts (CGT App. C Fig. 14, App. B.4 Fig. 13b) on a toy size: the moving
average follows its formula, gamma = 1 is the dynamic y itself, the switch offset finds a planted switch, and both
experiments run end to end."""

import json

import torch

from incontext.cli.commands import main
from incontext.experiments.cgt_text_followups import moving_average, switch_offset

TINY = ["--set", "n_layer=2", "--set", "split_layer=1", "--set", "d_x=16", "--set", "n_head_x=2", "--set", "d_y=8",
        "--set", "n_head_y=2", "--set", "rank=2", "--set", "n_templates=2", "--set", "steps=2", "--set", "batch_size=2",
        "--set", "vocab_size=300", "--set", "seq_len=64", "--set", "cut_lo=20", "--set", "cut_hi=40",
        "--set", "prefix=16", "--set", "eval_sequences=6", "--set", "corpus_docs=30"]


def test_the_moving_average_follows_its_formula():
    g = torch.Generator().manual_seed(0)
    y0, y = torch.randn(2, 3, generator=g, dtype=torch.float64), torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    used = moving_average(y0, y, 0.25)
    reference = y0
    for i in range(5):
        reference = 0.75 * reference + 0.25 * y[:, i]
        assert torch.allclose(used[:, i], reference, rtol=0, atol=1e-15)
    assert torch.equal(moving_average(y0, y, 1.0), y)


def test_the_switch_offset_finds_a_planted_switch():
    a, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    y = torch.stack([a] * 10 + [a + 0.1 * b] * 3 + [b] * 7)[None]  # boundary at 10, switches 3 tokens later
    assert switch_offset(y, 10, 20) == [3]
    assert switch_offset(torch.stack([a] * 20)[None] + torch.tensor([0.0, 1e-3]), 10, 20) == [None]


def test_both_run_at_toy_size(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert main(["run", "cgt-moving-average", *TINY, "--out", str(tmp_path / "ma")]) == 0
    results = json.loads((tmp_path / "ma" / "results.json").read_text())
    informed = next(k for k in results["curves"] if k.startswith("informed"))
    assert len(results["curves"][informed]) == 48 and informed in results["difference_vs_uninformed"]
    assert (tmp_path / "ma" / "moving_average.png").is_file()
    assert main(["run", "cgt-three-excerpts", *TINY, "--set", "sequences=4", "--set", f"model_from={tmp_path / 'ma'}",
                 "--out", str(tmp_path / "three")]) == 0
    assert not (tmp_path / "three" / "regularised").exists()  # the moving-average study's CGT read, not trained again
    results = json.loads((tmp_path / "three" / "results.json").read_text())
    assert results["boundaries"] == [21, 42] and all(len(v) == 4 for v in results["offsets"].values())
    assert (tmp_path / "three" / "dot_map_three.png").is_file()


def test_a_model_from_folder_without_that_training_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert main(["run", "cgt-three-excerpts", *TINY, "--set", f"model_from={tmp_path / 'none'}", "--out",
                 str(tmp_path / "three")]) == 2
    assert "holds no finished training of these settings" in capsys.readouterr().err


def test_the_vae_runs_at_toy_size_and_its_spectrum_measure_tells_smooth_from_rough(tmp_path, monkeypatch):
    from incontext.experiments.cgt_text_followups import spectrum_low_share

    positions = torch.arange(64, dtype=torch.float64)
    smooth = torch.sin(2 * torch.pi * positions / 64)[None, :, None]
    rough = torch.sin(2 * torch.pi * 25 * positions / 64)[None, :, None]
    assert spectrum_low_share(smooth) > 0.99 and spectrum_low_share(rough) < 0.01
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert main(["run", "cgt-vae", *TINY, "--set", "sequences=4", "--set", "betas=[0.5]", "--set", "docs_per_topic=6",
                 "--out", str(tmp_path / "vae")]) == 0
    results = json.loads((tmp_path / "vae" / "results.json").read_text())
    assert [r["beta"] for r in results["runs"]] == [0.5] and 0 <= results["runs"][0]["low_frequency_share"] <= 1
    assert (tmp_path / "vae" / "dot_map_beta0.5.png").is_file() and (tmp_path / "vae" / "table.md").is_file()
