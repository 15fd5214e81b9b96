"""iclca-bias-scratch (ICLCA Sec. 6.3) on a toy size: both variants train with the same seed, the biased one holds
learned b_KV / b_D that moved from zero, the conversion on top of them stays exact, and the table and plot are written."""

import json


from incontext.cli.commands import main
from incontext.experiments.iclca_bias_scratch import BiasScratchConfig, resolved
from incontext.train import latest_checkpoint, load_for_eval


def test_a_toy_run_trains_both_variants_and_converts_exactly(tmp_path):
    out = tmp_path / "bias"
    assert main(["run", "iclca-bias-scratch", "--set", "steps=20", "--set", "eval_every=10", "--set", "eval_sequences=12",
                 "--set", "n_layer=1", "--set", "d_model=32", "--set", "seeds=[3]", "--set", "workers=1",
                 "--out", str(out)]) == 0
    runs = json.loads((out / "runs.json").read_text())
    assert [(r["variant"], r["seed"]) for r in runs] == [("plain", 3), ("biased", 3)]
    for r in runs:
        assert r["relative_logits_error_converted"] < 1e-4  # float32 toy model: ICLCA on top of the learned biases
        assert r["converted"] == r["with_prompt"] and len(r["curve"]) == 2
    biased, _ = load_for_eval(latest_checkpoint(out / "biased-seed3" / "train"))
    plain, _ = load_for_eval(latest_checkpoint(out / "plain-seed3" / "train"))
    assert biased.blocks[0].attn.bias_kv.abs().sum() > 0 and plain.blocks[0].attn.bias_kv is None
    assert sum(p.numel() for p in biased.parameters()) > sum(p.numel() for p in plain.parameters())
    assert (out / "table.md").read_text().count("| biased | 3 |") == 1 and (out / "curves.png").is_file()


def test_the_paper_preset_sets_only_the_fields_left_at_their_defaults():
    paper = resolved(BiasScratchConfig(preset="paper"))
    assert (paper.n_layer, paper.positions, paper.steps) == (12, "rope", 8000)
    assert resolved(BiasScratchConfig(preset="paper", steps=50)).steps == 50
    assert resolved(BiasScratchConfig()) == BiasScratchConfig()
