"""Training a CGT through the ordinary trainer (model.kind=cgt, loss section) and loading it back."""

import json

import pytest

from incontext.config import ConfigError
from incontext.models import CGT, CGTLossConfig
from incontext.train import latest_checkpoint, load_config, load_for_eval, train

TINY_CGT = [
    "model.kind=cgt", "model.n_layer=2", "model.split_layer=1", "model.d_x=16", "model.n_head_x=2", "model.d_y=8",
    "model.n_head_y=2", "model.n_templates=2", "task.name=arithmetic", "task.n_tasks=2", "task.n_ex=2",
    "task.digits=1", "loss.eta=0.5", "loss.w_c=0.1", "loss.w_d=0.1", "optimizer.lr=3e-3", "schedule.total_steps=4",
    "schedule.warmup_steps=1", "run.batch_size=4", "run.eval_sequences=8", "run.eval_batch_size=8",
    "run.log_every=1", "run.tensorboard=false", "run.threads=1",
]


def test_cgt_trains_from_config_and_loads_back(tmp_path):
    config = load_config(None, TINY_CGT + [f"run.out_dir={tmp_path}"])
    assert config.loss_config() == CGTLossConfig(eta=0.5, w_c=0.1, w_d=0.1)
    results = train(config, progress=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["split"] == "train"]
    assert {"loss_task", "loss_aux", "r_c", "r_d"} <= set(train_records[-1])
    assert "char_accuracy" in results["eval"]
    model, loaded = load_for_eval(latest_checkpoint(tmp_path))
    assert isinstance(model, CGT) and loaded.model_kind == "cgt"


def test_loss_section_and_unknown_kinds_are_rejected():
    with pytest.raises(ConfigError, match="model.kind=cgt only"):
        load_config(None, ["loss.eta=0.5"])
    with pytest.raises(ConfigError, match="model.kind"):
        load_config(None, ["model.kind=rnn"])
    with pytest.raises(ConfigError, match="loss"):
        load_config(None, TINY_CGT + ["loss.eta=2"])
