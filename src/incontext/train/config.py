"""The configuration of a training run: model, task, optimizer, schedule and run sections.

    model:     {n_layer: 4, d_model: 64, n_head: 4, ...}   # TransformerConfig fields; sizes of the inputs
                                                           # and outputs come from the task unless given;
                                                           # `kind: cgt` takes CGTConfig fields instead
                                                           # (kinds: MODEL_KINDS, typed once at load)
    loss:      {eta: 0.5, w_c: 0.08, ...}                  # CGTLossConfig fields (model.kind cgt only)
    task:      {name: linear_regression, d_in: 4, ...}     # a registered task and its config fields
    optimizer: {name: adamw, lr: 3.0e-3, ...}
    schedule:  {warmup_steps: 100, total_steps: 4500, ...}
    run:       {batch_size: 64, eval_every: 500, ...}

Loaded from YAML with `--set section.key=value` overrides and validated at load time: an unknown key, a
value of the wrong type or an invalid value stops with a message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError, from_dict, load_yaml, merge, parse_overrides, to_dict
from ..models import CGT, CGTConfig, CGTLossConfig, Transformer, TransformerConfig
from ..tasks.registry import build_task
from ..tasks.base import Task

_IO_KEYS = ("vocab_size", "d_input", "d_output")


@dataclass(frozen=True)
class ModelKind:
    """A kind of model the trainer can build: `model.kind` names it in a config."""

    config_class: type  # the model section's dataclass
    build: Callable[[Any, Any], Any]  # (model config, loss config or None) -> the nn.Module
    loss_class: type | None = None  # the `loss` section's dataclass, for a model with its own training_loss


MODEL_KINDS: dict[str, ModelKind] = {
    "transformer": ModelKind(TransformerConfig, lambda config, loss: Transformer(config)),
    "cgt": ModelKind(CGTConfig, lambda config, loss: CGT(config, objective=loss), CGTLossConfig),
}
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass
class OptimizerConfig:
    name: Literal["adamw", "sgd"] = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0  # SGD only
    grad_clip: float | None = 1.0  # max global gradient norm; None turns clipping off

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0 or self.momentum < 0 or self.eps <= 0:
            raise ValueError("weight_decay and momentum must be >= 0 and eps > 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ValueError(f"grad_clip must be > 0 or null, got {self.grad_clip}")
        if max(self.lr, self.weight_decay, self.eps, self.momentum) > _FLOAT32_MAX:  # the optimizer works in float32
            raise ValueError(f"lr, weight_decay, eps and momentum must lie in the float32 range (<= {_FLOAT32_MAX:.4g})")


@dataclass
class ScheduleConfig:
    total_steps: int = 1000
    warmup_steps: int = 100  # linear warmup from lr / warmup_steps
    kind: Literal["cosine", "constant"] = "cosine"
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio

    def __post_init__(self):
        if self.total_steps < 1 or self.warmup_steps < 0:
            raise ValueError(f"total_steps must be >= 1 and warmup_steps >= 0, got {self.total_steps}, {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


@dataclass
class RunConfig:
    batch_size: int = 64  # global batch (all processes, all accumulation steps)
    grad_accum: int = 1  # micro-batches per step in each process
    seed: int = 0
    out_dir: str = "runs/train"
    eval_every: int = 250  # steps; 0 evaluates only at the end
    eval_sequences: int = 1024  # held-out sequences (a fixed set, the same at every evaluation)
    eval_batch_size: int = 256
    checkpoint_every: int = 250  # steps; a checkpoint is always written at the end
    keep_checkpoints: int = 2
    log_every: int = 10
    device: Literal["auto", "cpu", "cuda"] = "auto"
    compile: bool = False  # torch.compile the model for training
    autocast: Literal["auto", "none", "bf16"] = "auto"  # auto: bf16 on GPU, none on CPU
    tensorboard: bool = True
    threads: int = 0  # torch CPU threads per process; 0 keeps torch's default

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "eval_sequences", "eval_batch_size", "keep_checkpoints", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


# the config and loss classes of MODEL_KINDS, for the annotations of TrainConfig (a new kind adds its classes here)
ModelConfig = TransformerConfig | CGTConfig
LossConfig = CGTLossConfig
_DEFAULT_TASK = {"name": "linear_regression"}


@dataclass
class TrainConfig:
    """A training run. `model` is typed and sized for the task once, at load: a plain model section (YAML,
    `--set`, a checkpoint's config) becomes the config class of its `kind` with the task's input/output sizes."""

    model: ModelConfig | None = None  # None: the default model of its kind, sized for the task
    task: dict[str, Any] = field(default_factory=lambda: dict(_DEFAULT_TASK))
    loss: LossConfig | None = None  # the objective's options of a model with its own (model.kind=cgt)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    run: RunConfig = field(default_factory=RunConfig)

    @classmethod
    def resolve_plain(cls, values: dict[str, Any]) -> dict[str, Any]:
        """from_dict's hook: the model and loss sections typed against the task section."""
        model = values.get("model", {})
        if isinstance(model, dict):
            task = _build_task(values.get("task", _DEFAULT_TASK))
            kind = _kind_name(model.get("kind", "transformer"))
            values["model"] = resolve_model(kind, {k: v for k, v in model.items() if k != "kind"}, task)
            values["loss"] = resolve_loss(kind, values.get("loss"))
        return values

    def __post_init__(self):  # a TrainConfig built in Python rather than loaded
        if self.model is None or isinstance(self.model, dict):
            resolved = self.resolve_plain({"model": self.model or {}, "task": self.task, "loss": self.loss})
            self.model, self.loss = resolved["model"], resolved["loss"]
        elif self.loss is None or isinstance(self.loss, dict):
            self.loss = resolve_loss(self.model_kind, self.loss)

    def build_task(self) -> Task:
        return _build_task(self.task)

    @property
    def model_kind(self) -> str:
        return next(name for name, kind in MODEL_KINDS.items() if type(self.model) is kind.config_class)

    def model_config(self) -> ModelConfig:
        return self.model

    def loss_config(self) -> LossConfig | None:
        return self.loss

    def to_dict(self) -> dict[str, Any]:
        """Plain sections that load back to this config (the model section names its kind)."""
        plain = to_dict(self)
        plain["model"] = {"kind": self.model_kind, **plain["model"]}
        plain["loss"] = plain["loss"] or {}
        return plain


def _kind_name(kind: Any) -> str:
    if kind not in MODEL_KINDS:
        raise ConfigError(f"model.kind={kind!r} is not one of {tuple(MODEL_KINDS)}")
    return kind


def _build_task(options: dict[str, Any]) -> Task:
    if not isinstance(options, dict):
        raise ConfigError(f"task: expected a mapping of keys to values, got {options!r}")
    options = dict(options)
    name = options.pop("name", None)
    if not isinstance(name, str):
        raise ConfigError(f"task.name must name a registered task, got {name!r}")
    try:
        task = build_task(name, options, where="task")
    except KeyError as error:
        raise ConfigError(f"task.name: {error.args[0]}") from error
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(f"task: {error}") from error
    dtype = getattr(task.config, "dtype", "float32")
    if dtype != "float32":  # the trainer builds float32 models (bf16 comes from run.autocast)
        raise ConfigError(f"task.dtype={dtype!r}: training uses float32 data (set run.autocast=bf16 for bf16)")
    return task


def resolve_model(kind: str, values: dict[str, Any], task: Task) -> ModelConfig:
    """The model section of `kind` as its config class, with input/output sizes and length taken from the task."""
    values = dict(values)
    io = task.model_io()
    for key in _IO_KEYS:
        if key in values and values[key] != io.get(key):
            raise ConfigError(f"model.{key}={values[key]} contradicts the task {task.name}, which needs {io}")
    values.update(io)
    values.setdefault("max_seq_len", task.sequence_length)
    if not isinstance(values["max_seq_len"], int) or isinstance(values["max_seq_len"], bool):
        raise ConfigError(f"model.max_seq_len: {values['max_seq_len']!r} is not int")
    if values["max_seq_len"] < task.sequence_length and values.get("positions", "learned") == "learned":
        raise ConfigError(f"model.max_seq_len={values['max_seq_len']} is shorter than the task's sequences ({task.sequence_length})")
    return from_dict(MODEL_KINDS[kind].config_class, values, where="model")


def resolve_loss(kind: str, values: Any) -> Any:
    """The loss section as the kind's loss class (None for a model trained on the task's loss)."""
    loss_class = MODEL_KINDS[kind].loss_class
    if loss_class is None:
        if values:
            owners = [name for name, k in MODEL_KINDS.items() if k.loss_class is not None]
            raise ConfigError(f"the loss section {values} applies to model.kind={'|'.join(owners)} only")
        return None
    if isinstance(values, loss_class):
        return values
    return from_dict(loss_class, dict(values or {}), where="loss")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TrainConfig from a YAML file (or the defaults) with `section.key=value` overrides applied."""
    data = load_yaml(path) if path is not None else {}
    data = merge(data, parse_overrides(overrides or []))
    return from_dict(TrainConfig, data)


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    return from_dict(TrainConfig, data)


def replace_run(config: TrainConfig, **changes: Any) -> TrainConfig:
    return dataclasses.replace(config, run=dataclasses.replace(config.run, **changes))
