"""Smoke runs of the registered experiments at toy sizes: they must run end to end and write their files."""

import json

import pytest
import torch

from incontext.cli.commands import main
from incontext.experiments import list_experiments


def test_registry_lists_the_experiments():
    names = {e.name for e in list_experiments()}
    assert {"regression-demo", "hf-parity", "iclca-table1", "iclca-table2", "iclca-approx", "iclca-approx-trained", "amicl"} <= names


def test_regression_demo_runs_and_writes_results(tmp_path):
    assert main(["run", "regression-demo", "--set", "steps=4", "--set", "eval_sequences=16", "--set", "n_points=6",
                 "--set", "warmup=2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["mse_by_examples"]) == {"transformer", "least_squares", "ridge"}
    assert len(results["mse_by_examples"]["ridge"]) == 6
    assert (tmp_path / "regression_demo.png").is_file() and (tmp_path / "table.md").is_file()


def test_iclca_table1_runs_at_toy_size(tmp_path):
    assert main(["run", "iclca-table1", "--set", "depths=[1, 2]", "--set", "pairs=3", "--set", "d_model=32",
                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["depth"] for r in rows] == [1, 2] and all(r["mean_rel_error"] < 1e-5 for r in rows)


def test_unknown_experiment_and_bad_override_are_reported(capsys):
    assert main(["run", "no-such-experiment"]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    assert main(["run", "iclca-table1", "--set", "pairs=many"]) == 2
    assert "pairs" in capsys.readouterr().err


def test_amicl_runs_at_toy_size(tmp_path):
    assert main(["run", "amicl", "--set", "trials=50", "--set", "a_values=[0.5, 2.0]", "--set", "dims=[10]",
                 "--set", "seq_lens=[10]", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["a_sweep"]["dot"][1] == 1.0 and results["a_sweep"]["dot"][0] < 0.2
    assert (tmp_path / "amicl.png").is_file()


def test_iclca_table2_runs_at_toy_size(tmp_path):
    assert main(["run", "iclca-table2", "--set", "steps=3", "--set", "eval_sequences=20", "--set", "n_layer=1",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["accuracy"]["converted"] == results["accuracy"]["with prompt"]
    assert results["relative_logits_error_converted"] < 1e-5
    assert 0 < results["counting"] < 1 and not results["reused_training"]


@pytest.mark.slow  # three toy runs
def test_iclca_table2_evaluates_a_finished_training_again(tmp_path):
    """retrain=false evaluates the finished training again (same numbers); other settings train afresh."""
    assert main(["run", "iclca-table2", "--set", "steps=3", "--set", "eval_sequences=20", "--set", "n_layer=1",
                 "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    stamp = (tmp_path / "train" / "results.json").stat().st_mtime_ns
    assert main(["run", "iclca-table2", "--set", "steps=3", "--set", "eval_sequences=20", "--set", "n_layer=1",
                 "--set", "retrain=false", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "results.json").read_text())
    assert again["reused_training"] and again["accuracy"] == results["accuracy"]
    assert (tmp_path / "train" / "results.json").stat().st_mtime_ns == stamp
    assert main(["run", "iclca-table2", "--set", "steps=3", "--set", "eval_sequences=20", "--set", "n_layer=1",
                 "--set", "retrain=false", "--set", "linear_norm=none", "--out", str(tmp_path)]) == 0
    other = json.loads((tmp_path / "results.json").read_text())
    assert not other["reused_training"] and other["accuracy"]["converted"] == other["accuracy"]["with prompt"]


def test_counting_accuracy_reads_prompt_and_query():
    """The counting baseline scores the most frequent non-trigger token of prompt + query so far."""
    from incontext.experiments.iclca_table2 import counting_accuracy
    from incontext.tasks import get_task
    from incontext.tasks.episodes import Episode, Query

    counting = get_task("induction", vocab_size=12, n_triggers=1).baselines()["counting"]  # token 0 the trigger
    prompt = torch.tensor([0, 7, 9, 9, 0, 7])
    query = Query(inputs=torch.tensor([7, 0, 7, 0]), targets=torch.tensor([0, 7, 0, 5]),
                  mask=torch.tensor([False, True, False, True]))
    episode = Episode(prompt=prompt, queries=[query])
    # position 1: counts 7 -> 3, 9 -> 2: predicts 7 (right); position 3: 7 -> 4: predicts 7, target 5 (wrong)
    assert counting_accuracy([episode], counting) == 0.5


def test_iclca_approx_trained_runs_at_toy_size(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert main(["run", "iclca-approx-trained", "--set", "steps=2", "--set", "pairs=2", "--set", "n_layer=1",
                 "--set", "vocab_size=300", "--set", "features=[16]", "--set", "exact_sinks=[0]",
                 "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "results.json").read_text())["relative_logits_error"]
    assert set(summary) == {"without prompt", "m=16, exact sinks=0"}


def test_iclca_table2_refuses_bad_options_before_training():
    from incontext.experiments.iclca_table2 import Table2Config

    for bad in ({"train_loss": "masked"}, {"steps": 0}, {"lr": 0.0}, {"head_dim": -1}, {"eval_every": 0}):
        with pytest.raises(ValueError):
            Table2Config(**bad)
    assert Table2Config().train_loss == "committed" and Table2Config(train_loss="all").train_loss == "all"
