import json

from incontext.experiments import get_experiment
from incontext.experiments.residual_bursty import ResidualBurstyConfig


def test_residual_bursty_smoke(tmp_path):
    config = ResidualBurstyConfig(seeds=[0, 1], dim=8, max_pairs=8, n_classes=64, n_labels=8, steps=30,
                                  eval_every=10, eval_size=64, batch_size=16, progress=False)
    results = get_experiment("residual-bursty").run(config, tmp_path)
    assert [r["step"] for r in results["curves"]] == [0, 10, 20, 30]
    assert len(results["runs"]) == 8 and results["parameters_per_run_paper_scale"] == 207_303
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["crossing_summary"]) == {f"{t}/{k}" for t in ("0.5", "0.9", "0.95") for k in ("ic", "ic2")}
    # accuracies are fractions, and the table and plot exist
    for record in saved["curves"]:
        for kind in ("test", "ic", "ic2", "iw"):
            assert all(0.0 <= a <= 1.0 for a in record["accuracy"][kind]) and len(record["accuracy"][kind]) == 8
    table = (tmp_path / "table.md").read_text()
    assert "| > 0.95 | IC |" in table and "V-stream (paper)" in table
    assert (tmp_path / "accuracy.png").stat().st_size > 0
    assert (tmp_path / "train" / "runs.safetensors").is_file()
