"""Smoke runs of the CGT experiments at toy sizes (they must run end to end and write their files)."""

import json

from incontext.cli import main

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
