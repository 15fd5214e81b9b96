"""Typed pieces shared by experiments' configs: the flat options of a trained Transformer or CGT, their checks and
the trainer sections they describe. What an experiment returns and the writer of its files are in
`incontext.outputs`; training for an experiment is `train.fresh.train_fresh`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..train.config import TrainConfig, config_from_dict

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
class TransformerOptions:
    """The options of an experiment that trains Transformers through the trainer (flat keys for --set), each
    run's seed given when its sections are built (a study over seeds); an experiment's config inherits them
    and may change the defaults. TrainedModelOptions adds one `seed` option."""

    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    steps: int = 1500
    batch_size: int = 32
    lr: float = 2e-3

    def __post_init__(self):  # checked before training, not minutes later
        check_settings(self, counts=("n_layer", "d_model", "n_head", "steps", "batch_size"), rates=("lr",))

    def train_sections(self, task: dict[str, Any], *, seed: int, model: dict[str, Any] | None = None,
                       optimizer: dict[str, Any] | None = None, warmup_steps: int = 100,
                       schedule: dict[str, Any] | None = None, **run: Any) -> dict[str, dict[str, Any]]:
        """The trainer's plain sections of the run these options describe on `task`: `model` adds
        TransformerConfig fields, `optimizer` OptimizerConfig fields, `schedule` ScheduleConfig fields, `run`
        RunConfig fields (over EXPERIMENT_RUN)."""
        return {"model": {"n_layer": self.n_layer, "d_model": self.d_model, "n_head": self.n_head, **(model or {})},
                "task": task, "optimizer": {"lr": self.lr, **(optimizer or {})},
                "schedule": {"total_steps": self.steps, "warmup_steps": warmup_steps, **(schedule or {})},
                "run": {**EXPERIMENT_RUN, "batch_size": self.batch_size, "seed": seed, **run}}

    def train_config(self, task: dict[str, Any], **options: Any) -> TrainConfig:
        """`train_sections` as a TrainConfig (the one loader of training configs)."""
        return config_from_dict(self.train_sections(task, **options))


@dataclass
class TrainedModelOptions(TransformerOptions):
    """TransformerOptions of an experiment that trains with one seed (the `seed` option)."""

    seed: int = 0

    def train_sections(self, task: dict[str, Any], **options: Any) -> dict[str, dict[str, Any]]:
        return super().train_sections(task, seed=self.seed, **options)


@dataclass
class WarmupOption:
    """The steps of linear learning-rate warmup, an option of its own: a config lists it before
    TransformerOptions / TrainedModelOptions among its bases (its field then follows theirs) and passes
    `warmup_steps=config.warmup_steps` to train_sections / train_config."""

    warmup_steps: int = 100


@dataclass
class CGTGuideOptions:
    """The options of an experiment that trains a CGT's context stream and generators (flat keys for --set): the
    y stream from block `split_layer`, the low-rank generators, the objective and the training run; shared by a
    CGT trained from scratch (CGTOptions) and a CGT adapter over a frozen base (cgt-pretrained). An experiment's
    config inherits them and may change the defaults."""

    split_layer: int = 3
    d_y: int = 32
    n_head_y: int = 2
    rank: int = 4
    n_templates: int = 8
    eta: float = 0.5
    aux_cuts: int = 4
    w_c: float = 0.0
    w_d: float = 0.0
    steps: int = 2000
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0

    def loss_section(self, regularised: bool = True) -> dict[str, Any]:
        """The objective's options (CGTLossConfig fields); regularised=False leaves out R_C and R_D (the
        objective's defaults w_c = w_d = 0)."""
        return {"eta": self.eta, "aux_cuts": self.aux_cuts, **({"w_c": self.w_c, "w_d": self.w_d} if regularised else {})}


@dataclass
class CGTOptions(CGTGuideOptions):
    """CGTGuideOptions with the x stream of a CGT trained from scratch (and of its same-size plain Transformer)."""

    n_layer: int = 4
    d_x: int = 64
    n_head_x: int = 4

    def cgt_sections(self, regularised: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
        """The trainer's model and loss sections of this CGT; regularised=False: without R_C and R_D."""
        model = {"kind": "cgt", **{name: getattr(self, name) for name in (
            "n_layer", "split_layer", "d_x", "n_head_x", "d_y", "n_head_y", "rank", "n_templates")}}
        return model, self.loss_section(regularised)

    def baseline_model(self) -> dict[str, Any]:
        """The model section of the plain Transformer of the CGT's depth and x width (no y)."""
        return {"n_layer": self.n_layer, "d_model": self.d_x, "n_head": self.n_head_x, "positions": "learned"}

    def trainer_sections(self, task: dict[str, Any], model: dict[str, Any], loss: dict[str, Any], warmup: int = 200,
                         **run: Any) -> dict[str, dict[str, Any]]:
        """The trainer's plain sections of a run of `model` (with `loss`) on `task` with these training options:
        AdamW without weight decay, min(warmup, steps // 2) warmup steps then cosine, evaluated at the end only,
        logged every 50 steps, no TensorBoard; `run` adds RunConfig fields."""
        return {"model": model, "task": task, "loss": loss,
                "optimizer": {"name": "adamw", "lr": self.lr, "weight_decay": 0.0},
                "schedule": {"total_steps": self.steps, "warmup_steps": min(warmup, self.steps // 2)},
                "run": {"batch_size": self.batch_size, "seed": self.seed, **EXPERIMENT_RUN, "log_every": 50, **run,
                        "tensorboard": False}}
