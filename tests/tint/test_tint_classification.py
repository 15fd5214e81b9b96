import json

import pytest
import torch
import torch.nn.functional as F
from conftest import r_approx_steps, rel_error

from incontext.cli.commands import main
from incontext.absorb.prompt_update import full_mask
from incontext.absorb.methods.dynamic_eval import prompt_sgd
from incontext.absorb.methods.tint import tint_simulate, tint_update
from incontext.experiments.tint_classification import SETTINGS, Study, accuracy
from incontext.models import Transformer, TransformerConfig
from incontext.tint import TinT, TintConfig


def tiny_model(seed: int, n_layer: int = 2) -> Transformer:
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=n_layer, d_model=24, n_head=2, vocab_size=40, max_seq_len=32, positions="learned",
                               norm="layernorm", mlp="gelu_tanh", init_std=0.2)
    return Transformer(config).double().eval()


def masked_r_approx(model, sequences, targets, config: TintConfig) -> dict:
    """R-approx (TinT's own gradient rules) for a loss summed over the target tokens of several sequences:
    one SGD step on TinT's parameter subset; returns the updated state dict."""
    return r_approx_steps(model, sequences, targets, config, layers=model.config.n_layer, steps=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_loss_tint_step_matches_masked_r_approx(seed):
    """TinT with the label-loss gradient mask, single mode (updates of several sequences summed) and multi
    mode (one sequence, scattered targets), equals SGD with TinT's gradient rules on the masked summed loss."""
    model = tiny_model(seed)
    g = torch.Generator().manual_seed(seed)
    config = TintConfig(learning_rate=0.05)
    sequences = [torch.randint(0, 40, (int(n),), generator=g) for n in torch.randint(6, 14, (3,), generator=g)]
    targets = []
    for ids in sequences:  # a few scattered target tokens, the last one inside the sequence
        keep = torch.rand(len(ids), generator=g) < 0.3
        keep[0], keep[len(ids) - 2] = False, True
        targets.append(keep)
    updated = tint_update(model, sequences, targets, config)
    reference = masked_r_approx(model, sequences, targets, config)
    state = updated.state_dict()
    for name, value in reference.items():
        assert rel_error(state[name], value) < 1e-7, name
    base = model.state_dict()
    assert max(rel_error(state[n], base[n]) for n in reference) > 1e-4  # the step moved the weights


def test_full_context_tint_simulation_is_the_plain_simulator():
    """With every token a target, tint_simulate is TinT.simulate on the whole sequence (no mask installed)."""
    model = tiny_model(3)
    ids = torch.randint(0, 40, (12,), generator=torch.Generator().manual_seed(3))
    config = TintConfig(learning_rate=0.05)
    _, logits, _ = tint_simulate(model, ids, full_mask(ids), config)
    with torch.no_grad():
        plain = TinT(model, config)(ids, 12)
    assert rel_error(logits, plain) < 1e-12


def test_label_loss_sgd_step_matches_plain_sgd():
    """The experiment's dynamic-evaluation step (prompt_sgd with a label mask, several sequences) is one plain
    SGD step on all parameters of the masked summed cross-entropy."""
    model = tiny_model(4)
    g = torch.Generator().manual_seed(4)
    sequences = [torch.randint(0, 40, (n,), generator=g) for n in (15, 9)]
    labels = torch.zeros(9, dtype=torch.bool)
    labels[[3, 7]] = True
    targets = [full_mask(sequences[0]), labels]
    ours, _ = prompt_sgd(model, sequences, targets, learning_rate=0.03)
    reference = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    loss = 0.0
    for ids, keep in zip(sequences, targets):
        logits = torch.func.functional_call(model, reference, (ids[None],))[0]
        loss = loss + F.cross_entropy(logits[:-1][keep[1:]], ids[1:][keep[1:]], reduction="sum")
    grads = dict(zip(reference, torch.autograd.grad(loss, list(reference.values()))))
    state = ours.state_dict()
    for name, value in reference.items():
        assert rel_error(state[name], value - 0.03 * grads[name]) < 1e-12, name
    assert rel_error(state["blocks.0.attn.qkv.weight"], model.state_dict()["blocks.0.attn.qkv.weight"]) > 1e-4


def test_full_mask_and_calibrated_accuracy():
    assert full_mask(torch.arange(6)).tolist() == [False] + [True] * 5
    scores = torch.log(torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.2, 0.8]]))
    baseline = torch.log(torch.tensor([0.8, 0.2]))  # a prior for label 0: calibration removes it
    labels = torch.tensor([0, 1, 1])
    plain, calibrated = accuracy(scores, baseline, labels)
    assert plain == pytest.approx(200 / 3) and calibrated == pytest.approx(200 / 3)
    assert (scores - baseline).argmax(-1).tolist() == [1, 1, 1]


def test_tint_classification_runs_at_toy_size(tmp_path):
    torch.set_num_threads(1)  # thousands of tiny ops: a second thread only adds synchronisation (20x slower on a busy machine)
    assert main(["run", "tint-classification", "--set", "steps=2", "--set", "n_layer=1", "--set", "d_model=48",
                 "--set", "n_head=2", "--set", "vocab_size=512", "--set", "seeds=2", "--set", "inner_lrs=[0.001]",
                 "--set", "validation_per_topic=1", "--set", "test_per_topic=1", "--set", "heldout_per_topic=4",
                 "--set", "seq_len=128", "--set", "excerpt_words=6", "--set", "max_train_per_topic=30",
                 "--set", "shots=2", "--set", "check_queries=1", "--set", "batch_size=2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["n_queries"] == {"validation": 5, "test": 5}
    assert len(set(results["label_tokens"])) == 5
    shots = results["2_shot"]
    assert set(shots) == {"in-context"} | {f"{m} {s}/{l}" for m in ("dynamic eval", "TinT") for s in ("single", "multi") for l in ("label", "full")} \
        | {"dynamic eval chosen on validation", "TinT chosen on validation"}
    assert all(len(v["plain"]["seeds"]) == 2 and 0 <= v["plain"]["mean"] <= 100 for v in shots.values())
    assert all(r["max_abs_label_log_prob_gap"] < 1e-9 for r in results["simulator_check"])
    chosen = shots["TinT chosen on validation"]["calibrated"]
    assert set(chosen["settings"]) <= set(SETTINGS) and len(chosen["validation_seeds"]) == 2
    assert set(results["2_shot_per_seed"]["TinT single/label"][0]["validation_by_lr"]) == {"0.001"}
    assert (tmp_path / "table.md").is_file() and (tmp_path / "accuracy.png").is_file()


def test_setting_chosen_on_validation_never_looks_at_test():
    """Per calibration mode the setting with the best validation accuracy wins (ties: the first setting),
    whatever the test accuracies say."""
    validation = {"single/label": (50, 30), "single/full": (60, 30), "multi/label": (40, 30), "multi/full": (60, 20)}
    rows = {f"TinT {s}": {"plain": 90 - 10 * i, "calibrated": 10 * i, "lr": {"plain": i, "calibrated": -i},
                          "validation": {"plain": validation[s][0], "calibrated": validation[s][1]}}
            for i, s in enumerate(SETTINGS)}
    row = Study.chosen_on_validation(rows, "TinT")
    assert row["setting"] == {"plain": "single/full", "calibrated": "single/label"}
    assert (row["plain"], row["calibrated"]) == (80, 0) and row["lr"] == {"plain": 1, "calibrated": 0}
    assert row["validation"] == {"plain": 60, "calibrated": 30}
