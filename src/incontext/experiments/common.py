"""Typed pieces shared by experiments' configs: the flat options of a trained Transformer or CGT and their
checks. What an experiment returns and the writer of its files are in `incontext.outputs`; training for an
experiment is `train.fresh.train_fresh`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..train.config import OptimizerConfig, RunConfig, ScheduleConfig, TrainConfig

GPT2_BLOCK = {"positions": "learned", "norm": "layernorm", "mlp": "gelu_tanh", "attention": "softmax"}
GPT2_ADAMW = {"name": "adamw", "weight_decay": 0.1, "betas": (0.9, 0.95)}
# an experiment's training run: evaluated and checkpointed at the end only (the experiment evaluates the model)
EXPERIMENT_RUN = {"eval_every": 0, "eval_sequences": 256, "checkpoint_every": 0, "log_every": 10}


def check_settings(config: Any, counts: tuple[str, ...] = (), rates: tuple[str, ...] = ()) -> None:
    """An experiment config's sizes and counts must be >= 1 and its learning rates > 0: refused when the config
    is read, before a model loads or an output folder is claimed."""
    for name in counts:
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")
    for name in rates:
        if not getattr(config, name) > 0:
            raise ValueError(f"the learning rate must satisfy {name} > 0, got {getattr(config, name)}")


@dataclass
class TrainedModelOptions:
    """The options of an experiment that trains a Transformer through the trainer (flat keys for --set);
    an experiment's config inherits them and may change the defaults."""

    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    steps: int = 1500
    batch_size: int = 32
    lr: float = 2e-3
    seed: int = 0

    def __post_init__(self):  # checked before training, not minutes later
        check_settings(self, counts=("n_layer", "d_model", "n_head", "steps", "batch_size"), rates=("lr",))

    def train_config(self, task: dict[str, Any], *, model: dict[str, Any] | None = None,
                     optimizer: dict[str, Any] | None = None, warmup_steps: int = 100, **run: Any) -> TrainConfig:
        """The training run these options describe on `task`: `model` adds TransformerConfig fields,
        `optimizer` OptimizerConfig fields, `run` RunConfig fields (over EXPERIMENT_RUN)."""
        return TrainConfig(
            model={"n_layer": self.n_layer, "d_model": self.d_model, "n_head": self.n_head, **(model or {})},
            task=task,
            optimizer=OptimizerConfig(lr=self.lr, **(optimizer or {})),
            schedule=ScheduleConfig(total_steps=self.steps, warmup_steps=warmup_steps),
            run=RunConfig(**{**EXPERIMENT_RUN, "batch_size": self.batch_size, "seed": self.seed, **run}),
        )


@dataclass
class CGTOptions:
    """The options of an experiment that trains a CGT (model and loss; flat keys for --set); an experiment's
    config inherits them and may change the defaults."""

    n_layer: int = 4
    split_layer: int = 3
    d_x: int = 64
    n_head_x: int = 4
    d_y: int = 32
    n_head_y: int = 2
    rank: int = 4
    n_templates: int = 8
    eta: float = 0.5
    aux_cuts: int = 4
    w_c: float = 0.0
    w_d: float = 0.0

    def cgt_sections(self, regularised: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trainer's model and loss sections of this CGT; regularised=False sets w_c = w_d = 0."""
        model = {"kind": "cgt", **{name: getattr(self, name) for name in (
            "n_layer", "split_layer", "d_x", "n_head_x", "d_y", "n_head_y", "rank", "n_templates")}}
        loss = {"eta": self.eta, "aux_cuts": self.aux_cuts, "w_c": self.w_c if regularised else 0.0,
                "w_d": self.w_d if regularised else 0.0}
        return model, loss
