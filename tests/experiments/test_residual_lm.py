"""The residual-lm probes (IOI, in-context loss, induction) against plain references and oracle models, and a
smoke run of the experiment."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from incontext.cli.commands import main
from incontext.experiments.residual_lm import first_step, first_step_below, rewrite_outputs
from incontext.train.lm_probes import continuation_logprobs, in_context_score, induction_accuracy, ioi_scores
from incontext.models import Transformer, TransformerConfig
from incontext.tasks.stories import IOIPrompt
from incontext.tasks.stories import paper_ioi_prompts as paper_prompts
from incontext.tasks.stories import sampled_ioi_prompts as sampled_prompts
from incontext.tasks import Stories, StoriesConfig
from incontext.tasks.stories import HELDOUT_NAMES, TRAIN_NAMES
from incontext.tasks.text import ENDOFTEXT_ID

pytest.importorskip("tokenizers")
VOCAB = 320


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return Stories(StoriesConfig(vocab_size=VOCAB, train_stories=1500, validation_stories=100,
                                 tokenizer_dir=str(tmp_path_factory.mktemp("lm-tok"))))


class Uniform(torch.nn.Module):
    """Logits that do not depend on the input: every token has probability 1 / V."""

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, VOCAB, dtype=torch.float64)


class CopyFromHalfBack(torch.nn.Module):
    """An induction oracle for <eot> r r sequences: position t predicts the token `half` positions back."""

    def __init__(self, half):
        super().__init__()
        self.half = half

    def forward(self, tokens):
        logits = torch.zeros(*tokens.shape, VOCAB)
        source = torch.arange(tokens.shape[1]) + 1 - self.half
        valid = source >= 1
        logits[:, valid] = F.one_hot(tokens[:, source[valid]], VOCAB).float()
        return logits


def test_paper_prompts_ask_both_orders():
    prompts = paper_prompts()
    assert len(prompts) == 8
    for p in prompts:
        assert p.text.endswith(" to") and p.correct != p.incorrect
        assert p.text.count(p.incorrect) == 2 and p.text.count(p.correct) == 1  # subject repeated, IO once
    assert prompts[0].text == "When John and Mary went to the shops, John gave the bag to" and prompts[0].correct == "Mary"
    assert prompts[1].text == "When John and Mary went to the shops, Mary gave the bag to" and prompts[1].correct == "John"
    assert prompts[7].text == "After Sam and Amy went to the park, Amy gave a drink to" and prompts[7].correct == "Sam"


def test_sampled_prompts_use_only_their_names_and_both_orders():
    prompts = sampled_prompts(HELDOUT_NAMES, 30, seed=0, group="held-out names")
    assert len(prompts) == 60 and sampled_prompts(HELDOUT_NAMES, 30, seed=0, group="held-out names") == prompts
    for first, second in zip(prompts[::2], prompts[1::2]):
        assert (first.correct, first.incorrect) == (second.incorrect, second.correct)
        for p in (first, second):
            assert p.correct in HELDOUT_NAMES and p.incorrect in HELDOUT_NAMES
            assert not set(p.text.replace(",", "").split()) & set(TRAIN_NAMES)


@pytest.mark.parametrize("seed", range(3))
def test_continuation_logprobs_match_one_prompt_at_a_time(task, seed):
    """Batched, right-padded scoring equals scoring each unpadded sequence alone (float64, tight)."""
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(n_layer=2, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=64,
                                          residual_stream="v")).double().eval()
    prompts = sampled_prompts(HELDOUT_NAMES, 4, seed, "h") + paper_prompts()[:3]
    pairs = [(p.text, " " + p.correct) for p in prompts]
    batched = continuation_logprobs(model, task, pairs, batch_size=5)
    for (prompt, answer), value in zip(pairs, batched):
        context, target = [ENDOFTEXT_ID, *task.encode(prompt)], task.encode(answer)
        tokens = torch.tensor([context + target])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(tokens[:, :-1])[0], -1)
        reference = sum(float(logprobs[len(context) - 1 + i, t]) for i, t in enumerate(target))
        assert value == pytest.approx(reference, rel=1e-12, abs=1e-12)


def test_ioi_scores_of_a_uniform_model(task):
    """Each name token has probability 1/V, so a name of n tokens has V^-n, whatever the prompt."""
    prompts = paper_prompts()
    scores = ioi_scores(Uniform(), task, prompts)
    assert set(scores) == {f"paper {i}" for i in range(1, 5)}
    for name, group in scores.items():
        members = [p for p in prompts if p.group == name]
        expected = {key: 100 * sum(VOCAB ** -len(task.encode(" " + getattr(p, key))) for p in members) / len(members)
                    for key in ("correct", "incorrect")}
        assert group["correct"] == pytest.approx(expected["correct"], rel=1e-9)
        assert group["incorrect"] == pytest.approx(expected["incorrect"], rel=1e-9)
        assert group["logit_diff"] == pytest.approx(0.0, abs=1e-9)  # both orders: the same two names swap roles
        assert group["prompts"] == 2


def test_ioi_scores_reward_the_indirect_object(task):
    class Prefers(torch.nn.Module):
        """Puts logit 20 on every token of one name."""

        def __init__(self, name):
            super().__init__()
            self.tokens = task.encode(" " + name)

        def forward(self, tokens):
            logits = torch.zeros(*tokens.shape, VOCAB)
            logits[..., self.tokens] = 20.0
            return logits

    prompt = [IOIPrompt("When John and Mary went to the shops, John gave the bag to", "Mary", "John", "g")]
    for preferred, sign in (("Mary", 1), ("John", -1)):
        model = Prefers(preferred)
        scores = ioi_scores(model, task, prompt)["g"]
        logp = torch.log_softmax(model(torch.zeros(1, 1, dtype=torch.long))[0, 0], -1)  # the same at every position
        c, w = (float(sum(logp[t] for t in task.encode(" " + name))) for name in ("Mary", "John"))
        assert scores["logit_diff"] == pytest.approx(c - w, rel=1e-5) and sign * (c - w) > 1.0
        assert scores["accuracy"] == (1.0 if sign > 0 else 0.0)
        assert scores["correct"] == pytest.approx(100 * math.exp(c), rel=1e-5)
        assert scores["incorrect"] == pytest.approx(100 * math.exp(w), rel=1e-5)


def test_induction_accuracy_of_an_oracle_and_of_a_uniform_model(task):
    half = (task.sequence_length - 1) // 2
    oracle = induction_accuracy(CopyFromHalfBack(half), task, 16, seed=0)
    assert oracle["accuracy"] == 1.0 and oracle["loss_second_copy"] < oracle["loss_first_copy"]
    assert induction_accuracy(Uniform(), task, 16, seed=0)["accuracy"] == 0.0  # argmax ties pick <eot>, never a target


def test_in_context_score():
    curve = [5.0] * 10 + [3.0] * 10
    assert in_context_score(curve, (0, 10), (10, 20)) == -2.0
    assert in_context_score(curve, (0, 5), (5, 10)) == 0.0


def test_bad_experiment_settings_are_reported(capsys):
    assert main(["run", "residual-lm", "--set", "variants=[w]"]) == 2
    assert "variants" in capsys.readouterr().err
    assert main(["run", "residual-lm", "--set", "icl_late=[48, 99]"]) == 2
    assert "icl_late" in capsys.readouterr().err
    assert main(["run", "residual-lm", "--set", "probe_every=-5"]) == 2
    assert "probe_every" in capsys.readouterr().err


def test_residual_lm_runs_at_toy_size(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert main(["run", "residual-lm", "--set", "steps=2", "--set", "seeds=[0]", "--set", "n_layer=1",
                 "--set", "d_model=32", "--set", "n_head=2", "--set", "vocab_size=300", "--set", "train_stories=800",
                 "--set", "ioi_pairs=3", "--set", "eval_windows=8", "--set", "icl_stories=4",
                 "--set", "induction_sequences=4", "--set", "warmup_steps=1", "--set", "probe_every=1",
                 "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results["runs"]) == {"none", "v"} and results["summary"]["v"]["validation loss"][0] > 0
    run = results["runs"]["v"][0]
    assert set(run["ioi"]) == {"paper 1", "paper 2", "paper 3", "paper 4", "paper", "train names", "held-out names"}
    assert run["ioi"]["held-out names"]["prompts"] == 6 and len(run["in_context_curve"]) == 64
    assert (out / "table.md").read_text().count("| 4: After Sam and Amy") == 1
    assert [row["step"] for row in run["during_training"]] == [1, 2] and results["seeds_done"] == [0]
    for name in ("loss_curves.png", "ioi.png", "icl_during_training.png"):
        assert (out / name).is_file()
    table = (out / "table.md").read_text()
    assert "| IOI training names P(correct) >= 50% (probed) |" in table and "| training loss < 1.3 (logged" in table and "| 2 | " in table
    (out / "table.md").unlink()
    assert rewrite_outputs(out)["summary"] == results["summary"] and (out / "table.md").read_text() == table


def test_first_step():
    probes = [{"step": 10, "x": 0.1}, {"step": 20, "x": 0.7}, {"step": 30, "x": 0.4}]
    assert first_step(probes, lambda row: row["x"], 0.5) == 20
    assert first_step(probes, lambda row: row["x"], 0.9) is None
    assert first_step_below([(10, 2.0), (20, 1.2), (30, 1.0)], 1.3) == 20 and first_step_below([(10, 2.0)], 1.3) is None


def test_a_seed_is_added_to_an_earlier_study(tmp_path, monkeypatch):
    """add_to_existing keeps the earlier seeds' runs as they were and adds the new seed; other settings refuse."""
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    tiny = ["--set", "n_layer=1", "--set", "d_model=16", "--set", "n_head=2", "--set", "vocab_size=300",
            "--set", "train_stories=300", "--set", "steps=2", "--set", "batch_size=2", "--set", "warmup_steps=1",
            "--set", "ioi_pairs=2", "--set", "eval_windows=4", "--set", "icl_stories=4", "--set", "induction_sequences=4",
            "--set", "probe_every=0", "--out", str(tmp_path / "out")]
    assert main(["run", "residual-lm", "--set", "seeds=[0]", *tiny]) == 0
    first = json.loads((tmp_path / "out" / "results.json").read_text())
    assert main(["run", "residual-lm", "--set", "seeds=[1]", "--set", "add_to_existing=true", *tiny]) == 0
    both = json.loads((tmp_path / "out" / "results.json").read_text())
    assert both["seeds_done"] == [0, 1] and both["config"]["seeds"] == [0, 1]
    for variant in ("none", "v"):
        assert [r["seed"] for r in both["runs"][variant]] == [0, 1]
        assert both["runs"][variant][0] == first["runs"][variant][0]
        assert len(both["train_loss_curves"][variant]) == 2
    assert main(["run", "residual-lm", "--set", "seeds=[2]", "--set", "add_to_existing=true", *tiny, "--set", "lr=0.01"]) == 2
