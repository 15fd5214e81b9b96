"""Training: typed configs, the loop (single process or torchrun/DDP), checkpoints, metrics."""

from .checkpoint import latest_checkpoint, resolve_checkpoint, save_checkpoint
from .config import OptimizerConfig, RunConfig, ScheduleConfig, TrainConfig, load_config
from .trainer import NonFiniteLossError, evaluate, evaluate_checkpoint, load_for_eval, lr_at, train

__all__ = [
    "NonFiniteLossError",
    "OptimizerConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrainConfig",
    "evaluate",
    "evaluate_checkpoint",
    "latest_checkpoint",
    "load_config",
    "load_for_eval",
    "lr_at",
    "resolve_checkpoint",
    "save_checkpoint",
    "train",
]
