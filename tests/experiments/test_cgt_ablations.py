"""cgt-ablations (CGT Figs 7-9) and cgt-single-task (App. D.1) on a toy size: every point of the three axes gets its
row, the preset's own point is trained once, and the single-task run scores one task of 8 examples."""

import json

from incontext.cli.commands import main
from incontext.experiments.cgt_ablations import AblationConfig, points

TINY = ["--set", "n_layer=3", "--set", "split_layer=2", "--set", "d_x=16", "--set", "n_head_x=2", "--set", "d_y=8",
        "--set", "n_head_y=2", "--set", "rank=2", "--set", "n_templates=2", "--set", "steps=2", "--set", "batch_size=4",
        "--set", "eval_sequences=8", "--set", "seeds=[0]", "--set", "workers=1"]


def test_the_axes_change_one_setting_each():
    axes = points(AblationConfig(split_layers=[2], ranks=[1, 4], weights=[[0.0, 0.0]]))
    assert axes == [("layer l", 2, {"split_layer": 2}), ("rank", 1, {"rank": 1}), ("rank", 4, {"rank": 4}),
                    ("w_C / w_D", "0 / 0", {"w_c": 0.0, "w_d": 0.0})]


def test_a_toy_ablation_trains_each_distinct_point_once(tmp_path):
    out = tmp_path / "ablations"
    assert main(["run", "cgt-ablations", *TINY, "--set", "split_layers=[1, 2]", "--set", "ranks=[2]",
                 "--set", "weights=[[0.08, 0.04], [0.0, 0.0]]", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [(p["axis"], p["value"]) for p in results["points"]] == [("layer l", 1), ("layer l", 2), ("rank", 2),
                                                                    ("w_C / w_D", "0.08 / 0.04"), ("w_C / w_D", "0 / 0")]
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == ["l1-r2-wc0.08-wd0.04", "l2-r2-wc0-wd0", "l2-r2-wc0.08-wd0.04"]  # the preset's point once
    assert all(0 <= p["specialized_char_accuracy"][0] <= 1 for p in results["points"])
    assert (out / "table.md").is_file() and (out / "ablations.png").is_file()


def test_a_toy_single_task_run(tmp_path):
    out = tmp_path / "single"
    assert main(["run", "cgt-single-task", *TINY, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert (results["resolved"]["n_tasks"], results["resolved"]["n_ex"]) == (1, 8)
    assert set(results["summary"]) == {"baseline", "cgt_aux_reg"}
    assert "One task of 8 examples (scored: examples 5-8)" in (out / "table.md").read_text()


def test_a_toy_rp_study(tmp_path):
    out = tmp_path / "rp"
    assert main(["run", "cgt-rp", *TINY, "--set", "w_ps=[0.5]", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [r["model"] for r in results["rows"]] == ["cgt_aux", "cgt_aux_reg", "cgt_aux_rp, w_P 0.5"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["references", "rp-0.5"]
    records = list((out / "rp-0.5").glob("*/record.json"))
    assert len(records) == 1 and json.loads(records[0].read_text())["settings"]["loss"]["w_p"] == 0.5
