"""cgt-pretrained at toy size on a tiny random Llama (SmolLM2 itself is too slow for the default suite): it runs end
to end, writes its files, and its training resumes bit-identically after a kill."""

import json

import pytest
import torch
from cgt_adapter_helpers import VOCAB, random_base

from incontext.experiments.cgt_pretrained import PretrainedConfig, run_on, train_resumable
from incontext.models import CGTAdapter, CGTAdapterConfig
from incontext.outputs import save_result
from incontext.train import latest_checkpoint

TOY = dict(split_layer=2, n_y_blocks=1, d_y=8, n_head_y=2, rank=2, n_templates=2, seq_len=24, cut_lo=6, cut_hi=12,
           max_doc_tokens=64, steps=3, batch_size=2, warmup_steps=1, checkpoint_every=2, prefix=8, scored=8,
           eval_docs_per_topic=2, eval_batch_size=4, corpus_docs=20)


def encode(text: str) -> list[int]:
    return [b % VOCAB for b in text.encode()]


def test_cgt_pretrained_runs_at_toy_size(tmp_path):
    base = random_base(0, dtype=torch.float32)
    results = save_result(run_on(base, encode, PretrainedConfig(**TOY), tmp_path), tmp_path, "cgt-pretrained",
                          PretrainedConfig(**TOY))  # as the registry writes it
    assert list(results)[:3] == ["experiment", "config", "base"] and results["config"]["mixing"] == "tanh"
    assert results["documents"]["evaluated"] == 12  # 2 held-out documents of each of the 6 topics
    assert len(results["ce"]["base, no prefix"]["per_position"]) == 8
    assert {"CGT specialised (y frozen from the prefix, prefix dropped) - base, no prefix",
            "CGT specialised (y frozen from the prefix, prefix dropped) - LoRA (no context stream), no prefix"} <= set(results["differences"])
    assert results["export"]["max_abs_logit_difference"] < 1e-4
    assert results["y"]["knn_topic_accuracy"] is not None and 0 <= results["y"]["collapse"]["within_document"]
    for name in ("results.json", "table.md", "cgt_pretrained.png", "adapter/guide.json", "peft-example/adapter_config.json"):
        assert (tmp_path / name).is_file(), name
    assert latest_checkpoint(tmp_path / "train" / "cgt").name == "step_00000003"
    # a second run finds both trainings finished: nothing is retrained
    stamp = (tmp_path / "train" / "cgt" / "metrics.jsonl").stat().st_mtime_ns
    again = run_on(random_base(0, dtype=torch.float32), encode, PretrainedConfig(**TOY), tmp_path)
    assert (tmp_path / "train" / "cgt" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert again.results["ce"] == json.loads((tmp_path / "results.json").read_text())["ce"]


def test_mixing_is_one_of_the_generators_choices():
    with pytest.raises(ValueError, match="mixing"):
        PretrainedConfig(mixing="relu")


def test_training_resumes_bit_identically_after_a_kill(tmp_path):
    config = PretrainedConfig(**{**TOY, "steps": 4})
    x = torch.randint(0, VOCAB, (6, 2, 12), generator=torch.Generator().manual_seed(0))

    def make():
        return CGTAdapter(random_base(1, dtype=torch.float32), CGTAdapterConfig(split_layer=2, n_y_blocks=1, d_y=8, n_head_y=2),
                          generator=torch.Generator().manual_seed(0))

    def step_loss_of(adapter, die_at=None):
        def step_loss(step):
            if step == die_at:
                raise KeyboardInterrupt  # killed between the checkpoint of step 2 and step 3
            inputs = x[step]

            def task(out, scored):
                mask = torch.ones_like(inputs[:, 1:], dtype=torch.bool) if scored is None else scored[:, 1:]
                return torch.nn.functional.cross_entropy(out[:, :-1][mask], inputs[:, 1:][mask])
            return adapter.training_loss(inputs, task, torch.Generator().manual_seed(step))
        return step_loss

    whole = make()
    train_resumable(whole.guide, step_loss_of(whole), tmp_path / "whole", {"r": 1}, config, "whole")
    killed = make()
    with pytest.raises(KeyboardInterrupt):
        train_resumable(killed.guide, step_loss_of(killed, die_at=2), tmp_path / "resumed", {"r": 1}, config, "resumed")
    resumed = make()
    log = train_resumable(resumed.guide, step_loss_of(resumed), tmp_path / "resumed", {"r": 1}, config, "resumed")
    assert [entry["step"] for entry in log] == [1, 2, 3, 4]
    for (name, a), b in zip(whole.guide.state_dict().items(), resumed.guide.state_dict().values()):
        assert torch.equal(a, b), name
    # other settings: the old run is replaced, not continued
    fresh = make()
    log = train_resumable(fresh.guide, step_loss_of(fresh), tmp_path / "resumed", {"r": 2}, config, "fresh")
    assert [entry["step"] for entry in log] == [1, 2, 3, 4]
