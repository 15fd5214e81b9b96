"""tint-layer-steps (TinT Tables 4-5): a budget's update is R-approx's steps of the top layers (several sequences: each
step sums them), the all-layers 1-step rows are tint-classification's at the same settings, the table has a row per
setting and budget, and the presets resolve to the paper's budgets."""

import json

import pytest
import torch
from conftest import r_approx_steps, rel_error

from incontext.absorb.methods.tint import tint_update
from incontext.cli.commands import main
from incontext.config import ConfigError, apply_overrides
from incontext.experiments.tint_layer_steps import SETTINGS, LayerStepsConfig, default_budgets
from incontext.models import Transformer, TransformerConfig
from incontext.tint import TintConfig

TOY = ["steps=2", "n_layer=2", "d_model=48", "n_head=2", "vocab_size=512", "seeds=2", "inner_lrs=[0.001, 0.1, 1.0]",
       "validation_per_topic=1", "test_per_topic=2", "heldout_per_topic=5", "seq_len=128", "excerpt_words=6",
       "max_train_per_topic=30", "shots=2", "check_queries=1", "batch_size=2"]


def tiny_model(seed: int, n_layer: int = 3) -> Transformer:
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=n_layer, d_model=24, n_head=2, vocab_size=40, max_seq_len=32, positions="learned",
                               norm="layernorm", mlp="gelu_tanh", init_std=0.2)
    return Transformer(config).double().eval()


@pytest.mark.parametrize("n_sequences, layers, steps", [(3, 1, 2), (2, 2, 3), (1, 1, 4), (1, 3, 2)])
def test_a_budget_s_update_is_r_approx_steps_of_the_top_layers(n_sequences, layers, steps):
    """Single format (several sequences, label loss): every step sums the sequences' updates from the weights the
    previous step left; multi format (one sequence): the simulator's own steps. Both equal n steps of R-approx on the
    top layers, and the layers below do not move."""
    model = tiny_model(steps + layers)
    g = torch.Generator().manual_seed(n_sequences)
    sequences = [torch.randint(0, 40, (int(n),), generator=g) for n in torch.randint(8, 14, (n_sequences,), generator=g)]
    targets = []
    for ids in sequences:
        keep = torch.rand(len(ids), generator=g) < 0.4
        keep[0], keep[len(ids) - 2] = False, True
        targets.append(keep)
    config = TintConfig(learning_rate=0.05, n_simulation_layers=layers, n_steps=steps)
    state = tint_update(model, sequences, targets, config).state_dict()
    reference = r_approx_steps(model, sequences, targets, config)
    for name, value in reference.items():
        assert rel_error(state[name], value) < 1e-7, name
    base = model.state_dict()
    frozen = [n for n in base if n.startswith(tuple(f"blocks.{i}." for i in range(3 - layers)))]
    assert all(torch.equal(state[n], base[n]) for n in frozen)
    one_step = tint_update(model, sequences, targets, TintConfig(learning_rate=0.05, n_simulation_layers=layers)).state_dict()
    assert max(rel_error(state[n], base[n]) for n in base) > 1e-4  # the steps moved the weights,
    assert max(rel_error(state[n], one_step[n]) for n in base) > 1e-5  # further than one step


def run(name: str, out, extra=()) -> dict:
    argv = ["run", name]
    for option in [*TOY, *extra]:
        argv += ["--set", option]
    assert main([*argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())


def test_runs_at_toy_size_and_its_all_layers_one_step_rows_are_tint_classification_s(tmp_path):
    torch.set_num_threads(1)  # thousands of tiny ops: one thread (and the same float sums in both runs)
    ours = run("tint-layer-steps", tmp_path / "steps")
    theirs = run("tint-classification", tmp_path / "classification")
    assert ours["budgets"] == [[2, 1], [1, 2]] and ours["methods"] == ["TinT", "dynamic eval"]
    per_seed, reference = ours["2_shot_per_seed"], theirs["2_shot_per_seed"]
    assert set(per_seed) == {"vanilla", "in-context"} | {f"{m} {b} {s}" for m in ("TinT", "dynamic eval")
                                                         for b in ("2x1", "1x2") for s in SETTINGS}
    for method in ("TinT", "dynamic eval"):
        for setting in SETTINGS:
            for a, b in zip(per_seed[f"{method} 2x1 {setting}"], reference[f"{method} {setting}"], strict=True):
                for key in ("plain", "calibrated", "lr", "validation", "validation_by_lr"):
                    assert a[key] == b[key], (method, setting, key)
    assert [r["plain"] for r in per_seed["in-context"]] == [r["plain"] for r in reference["in-context"]]
    assert all(r["max_abs_label_log_prob_gap"] < 1e-9 for r in ours["simulator_check"])
    assert {r["budget"] for r in ours["simulator_check"]} == {"2x1", "1x2"}
    table = (tmp_path / "steps" / "table.md").read_text().splitlines()
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| setting")]
    assert len(rows) == len(SETTINGS) * 2 and all(row.count("|") == 10 for row in rows)
    assert "| single/label | 2x1 |" in rows[0] and "68.2 (0.1), 12x1" in rows[0] and "69.8 (0.1), 12x1" in rows[0]
    assert "| multi/full | 1x2 |" in rows[-1] and "50.9 (1.8), 6x2" in rows[-1]


def test_presets_resolve_to_the_paper_s_budgets_and_bad_budgets_are_refused():
    assert default_budgets(12) == [[12, 1], [6, 2], [3, 4]] and default_budgets(4) == [[4, 1], [2, 2], [1, 4]]
    reduced = LayerStepsConfig()
    assert reduced.resolved_budgets() == [[4, 1], [2, 2], [1, 4]]
    assert reduced.classification().n_layer == 4 and reduced.classification().shots == 4
    paper = apply_overrides(LayerStepsConfig(), ["preset=paper"])
    assert paper.resolved_budgets() == [[12, 1], [6, 2], [3, 4]] and paper.classification().shots == 32
    assert apply_overrides(LayerStepsConfig(), ["preset=paper", "n_layer=4"]).resolved_budgets() == [[4, 1], [2, 2], [1, 4]]
    for bad in (["budgets=[[5, 1]]"], ["budgets=[[2, 0]]"], ["budgets=[[2, 2], [2, 2]]"], ["preset=gpu"], ["budgets=[[2]]"]):
        with pytest.raises(ConfigError):
            apply_overrides(LayerStepsConfig(), bad)
