"""Smoke runs of the CGT experiments at toy sizes (they must run end to end and write their files)."""

import dataclasses
import json
import shutil

import pytest

from incontext.cli.commands import main
from incontext.experiments.cgt_table1 import recompute

TINY_MODEL = ["--set", "n_layer=2", "--set", "split_layer=1", "--set", "d_x=16", "--set", "n_head_x=2", "--set", "d_y=8",
              "--set", "n_head_y=2", "--set", "n_templates=2"]


def test_cgt_table1_runs_at_toy_size(tmp_path):
    args = ["run", "cgt-table1", *TINY_MODEL, "--set", "steps=3", "--set", "batch_size=4", "--set", "seeds=[0, 1]",
            "--set", "workers=1", "--set", "eval_sequences=8", "--set", "digits=1", "--set", "n_tasks=2",
            "--set", "variants=[baseline, cgt_aux_reg]", "--out", str(tmp_path)]
    assert main(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(r["variant"], r["seed"]) for r in results["runs"]] == [("baseline", 0), ("baseline", 1), ("cgt_aux_reg", 0), ("cgt_aux_reg", 1)]
    reg = results["summary"]["cgt_aux_reg"]
    assert {"base_char_accuracy", "specialized_char_accuracy", "variation", "linear_fit_mean_abs_error"} <= set(reg)
    assert "specialized_char_accuracy" not in results["summary"]["baseline"]
    assert (tmp_path / "table.md").is_file() and (tmp_path / "dot_map_cgt_aux_reg.png").is_file()
    assert (tmp_path / "table1.png").is_file()

    # reuse: finished runs are kept (not retrained); only_finished summarises them without training the rest
    stamp = (tmp_path / "baseline-seed0" / "run.json").stat().st_mtime_ns
    again = ["run", "cgt-table1", *TINY_MODEL, "--set", "steps=3", "--set", "batch_size=4", "--set", "seeds=[0, 1, 2]",
             "--set", "workers=1", "--set", "eval_sequences=8", "--set", "digits=1", "--set", "n_tasks=2",
             "--set", "variants=[baseline, cgt_aux_reg]", "--set", "reuse=true", "--set", "only_finished=true",
             "--out", str(tmp_path)]
    assert main(again) == 0
    assert (tmp_path / "baseline-seed0" / "run.json").stat().st_mtime_ns == stamp
    assert not (tmp_path / "baseline-seed2").exists()
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["baseline"]["seeds"] == [0, 1] and summary["cgt_aux_reg"]["seeds"] == [0, 1]

    # the committed run records alone (no checkpoints) rebuild the same summary and table
    table = (tmp_path / "table.md").read_text()
    for run_dir in tmp_path.glob("*-seed*"):
        shutil.rmtree(run_dir / "train")
    assert recompute(tmp_path)["summary"] == summary and (tmp_path / "table.md").read_text() == table
    (tmp_path / "baseline-seed1" / "record.json").unlink()
    assert recompute(tmp_path)["summary"]["baseline"]["seeds"] == [0]


def test_cgt_regression_runs_at_toy_size(tmp_path):
    args = ["run", "cgt-regression", *TINY_MODEL, "--set", "steps=3", "--set", "batch_size=4", "--set", "d_in=3",
            "--set", "n_points=8", "--set", "freeze_after=[2, 5]", "--set", "eval_sequences=8", "--out", str(tmp_path)]
    assert main(args) == 0
    curves = json.loads((tmp_path / "results.json").read_text())["mse_by_examples"]
    assert set(curves) == {"baseline", "cgt dynamic", "cgt frozen after 2", "cgt frozen after 5", "ridge"}
    assert curves["cgt frozen after 5"][:5] == [None] * 5 and len(curves["cgt frozen after 5"]) == 8
    assert (tmp_path / "cgt_regression.png").is_file()
    probe = json.loads((tmp_path / "results.json").read_text())["y_probe_r2"]
    assert set(probe) == {"2", "5"} and all(r2 <= 1 for r2 in probe.values())


def test_cgt_regression_readouts_and_aux_horizon(tmp_path):
    import torch

    from incontext.experiments.cgt_regression import frozen_context

    contexts = torch.arange(2 * 6 * 2, dtype=torch.float64).view(2, 6, 2)  # (B, 2N, d_y): 3 examples
    assert torch.equal(frozen_context(contexts, 2, "y_token"), contexts[:, 3])
    assert torch.equal(frozen_context(contexts, 2, "x_token"), contexts[:, 2])
    assert torch.equal(frozen_context(contexts, 3, "mean"), (contexts[:, 1] + contexts[:, 3] + contexts[:, 5]) / 3)
    args = ["run", "cgt-regression", *TINY_MODEL, "--set", "steps=2", "--set", "batch_size=4", "--set", "d_in=2",
            "--set", "n_points=6", "--set", "freeze_after=[2]", "--set", "eval_sequences=8", "--set", "readout=mean",
            "--set", "aux_horizon=1", "--out", str(tmp_path)]
    assert main(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["readout"] == "mean" and len(results["mse_by_examples"]["cgt frozen after 2"]) == 6
    assert main(["run", "cgt-regression", "--set", "readout=last", "--out", str(tmp_path / "bad")]) == 2


def test_pilot_worth_interpolates_the_dynamic_curve():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "cgt_regression_pilots.py"
    spec = importlib.util.spec_from_file_location("cgt_regression_pilots", path)
    pilots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pilots)
    dynamic = [4.0, 2.0, 1.0, 0.5]
    assert pilots.worth(dynamic, 5.0) == 0.0 and pilots.worth(dynamic, 2.0) == 1.0
    assert pilots.worth(dynamic, 1.5) == 1.5 and pilots.worth(dynamic, 0.1) == 3.0


def test_cgt_text_runs_at_toy_size(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    args = ["run", "cgt-text", *TINY_MODEL, "--set", "steps=2", "--set", "batch_size=2", "--set", "vocab_size=300",
            "--set", "seq_len=64", "--set", "cut_lo=20", "--set", "cut_hi=40", "--set", "prefix=16",
            "--set", "eval_sequences=6", "--set", "docs_per_topic=6", "--set", "corpus_docs=30", "--out", str(tmp_path / "out")]
    assert main(args) == 0
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results["models"]) == {"regularised", "unregularised"}
    assert len(results["models"]["regularised"]["per_position_ce"]["specialised (frozen y, no prefix)"]) == 48
    assert len(results["baseline"]["per_position_ce"]["with prefix"]) == 48
    spread = results["models"]["unregularised"]["y_spread"]
    assert -1 <= spread["cos_across"] <= 1 and 0 <= spread["between_share"] <= 1
    for name in ("tsne_regularised.png", "tsne_unregularised.png", "cgt_text.png", "table.md"):
        assert (tmp_path / "out" / name).is_file()


def test_y_spread_tells_collapsed_from_spread_contexts():
    """y_spread on stand-in models: one y direction for every document (collapsed) vs a direction per document."""
    import torch

    from incontext.experiments.cgt_text import y_spread

    class Stub:
        def __init__(self, per_document):
            self.per_document = per_document

        def context(self, tokens):
            g = torch.Generator().manual_seed(int(tokens[0, 0]))
            base = torch.randn(8, generator=g) if self.per_document else torch.ones(8)
            return (base + 0.01 * torch.randn(tokens.shape[1], 8, generator=g))[None]

    docs = [(0, torch.full((20,), i)) for i in range(6)]
    collapsed, spread = y_spread(Stub(False), docs, 20, 4), y_spread(Stub(True), docs, 20, 4)
    assert collapsed["cos_across"] > 0.99 and collapsed["cos_within"] > 0.99 and collapsed["between_share"] < 0.1
    assert spread["cos_across"] < 0.7 and spread["cos_within"] > 0.99 and spread["between_share"] > 0.9
    uneven = [(0, torch.full((20 - i,), i)) for i in range(6)]  # held-out documents differ in length
    assert y_spread(Stub(True), uneven, 20, 4)["cos_within"] > 0.99
    with pytest.raises(ValueError, match="shortest document"):
        y_spread(Stub(True), uneven, 20, 15)


def test_cgt_options_give_the_trainers_cgt_sections():
    """The shared CGT options become a model section the trainer builds a CGT from, and the loss section."""
    from incontext.experiments.common import CGTOptions
    from incontext.models import CGTConfig, CGTLossConfig

    options = CGTOptions(rank=2, w_c=0.04, w_d=0.02)
    model, loss = options.cgt_sections()
    assert model.pop("kind") == "cgt"
    assert set(model) <= {field.name for field in dataclasses.fields(CGTConfig)}
    assert model["rank"] == 2 and loss == {"eta": 0.5, "aux_cuts": 4, "w_c": 0.04, "w_d": 0.02}
    assert options.cgt_sections(regularised=False)[1] == {"eta": 0.5, "aux_cuts": 4}  # the loss's defaults w_c = w_d = 0
    assert CGTLossConfig(**options.cgt_sections(regularised=False)[1]) == CGTLossConfig(eta=0.5, aux_cuts=4, w_c=0.0, w_d=0.0)
