"""Pieces shared by experiments: what an experiment returns (Result) and the one writer of its files, the
output-folder claim, and the typed pieces of a training run."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import merge
from ..fileio import strict_json
from ..models import Transformer
from ..train import latest_checkpoint, load_for_eval, train
from ..train.config import OptimizerConfig, RunConfig, ScheduleConfig, TrainConfig, config_from_dict, replace_run

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


# An experiment's output folder carries this file (naming the experiment): a later run of the same experiment
# may replace what is in it; any other non-empty folder is refused, so no command writes over a user's files.
EXPERIMENT_MARKER = ".incontext-experiment"
_TRAIN_MARKER = ".incontext-train-fresh"  # in out_dir/train: written by train_fresh, which alone may remove it
_TRAINER_OUTPUTS = {"config.yaml", "metrics.jsonl", "tensorboard", "checkpoints", "results.json", "loss.png", _TRAIN_MARKER}


def claim_output_folder(out_dir: Path, owner: str, create: bool = True) -> None:
    """Make out_dir the output folder of `owner` (an experiment, or a command such as compare): it must be new,
    empty, or an earlier output of the same owner (one written before markers existed is recognised by its
    results.json and table.md); anything else is refused before a file is written. create=False only checks."""
    out_dir = Path(out_dir)
    marker = out_dir / EXPERIMENT_MARKER
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"--out {out_dir} is a file, not a folder")
    if marker.is_file():
        try:
            earlier = json.loads(marker.read_text()).get("experiment")
        except (ValueError, AttributeError):
            earlier = None
        if earlier != owner:
            raise FileExistsError(f"--out {out_dir} holds the output of experiment {earlier!r}, not {owner!r}: "
                                  "choose another --out")
        return
    entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
    if entries and not {"results.json", "table.md"} <= set(entries):
        raise FileExistsError(f"--out {out_dir} is not empty: it holds files this command did not write "
                              f"({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) and is no output of "
                              f"{owner!r}; choose a new or empty folder (incontext never writes over files it did not create)")
    if create:
        out_dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"experiment": owner}) + "\n")


# ----------------------------------------------------------------------------- results


@dataclass
class Result:
    """What an experiment produced. `tables` and `figures` map file names to functions of the final results
    (results.json's content, with "experiment" and "config" in front): a table returns markdown, a figure a
    matplotlib Figure (drawn with `pyplot()`)."""

    results: dict[str, Any]
    tables: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    figures: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_result(result: Result, out_dir: Path, experiment: str | None = None, config: Any = None) -> dict[str, Any]:
    """The one writer of experiment files: results.json (strict JSON), the tables and the figures (PNG, 120 dpi)
    under out_dir; returns the results as written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = {"experiment": experiment} if experiment else {}
    if config is not None:
        head["config"] = dataclasses.asdict(config)
    results = {**head, **result.results}
    (out_dir / "results.json").write_text(strict_json(results))
    for name, make in result.tables.items():
        text = make(results)
        (out_dir / name).write_text(text if text.endswith("\n") else text + "\n")
    plt = pyplot() if result.figures else None
    for name, draw in result.figures.items():
        figure = draw(results)
        figure.savefig(out_dir / name, dpi=120)
        plt.close(figure)
    return results


def _claimed(folder: Path) -> bool:
    return any((parent / EXPERIMENT_MARKER).is_file() for parent in folder.resolve().parents)


def _remove_earlier_training(train_dir: Path) -> None:
    """Remove out_dir/train of an earlier run of the experiment, and nothing that incontext did not write."""
    if not train_dir.exists():
        return
    entries = {p.name for p in train_dir.iterdir()} if train_dir.is_dir() else {"(a file)"}
    ours = (train_dir / _TRAIN_MARKER).is_file() or _claimed(train_dir)
    if not ours or not entries <= _TRAINER_OUTPUTS:
        foreign = sorted(entries - _TRAINER_OUTPUTS) or sorted(entries)
        raise FileExistsError(f"{train_dir} exists and was not written by an earlier run of this experiment (it holds "
                              f"{', '.join(foreign[:3])}): remove it or choose another output folder")
    shutil.rmtree(train_dir)


def train_fresh(out_dir: Path, settings: TrainConfig | dict[str, Any]) -> tuple[Transformer, TrainConfig, dict[str, Any]]:
    """Train a model for an experiment into out_dir/train (replacing an earlier run of it there, never other
    files) through the ordinary trainer; returns the trained model in eval mode, its config and the results.
    `settings`: a TrainConfig, or its plain sections."""
    train_dir = Path(out_dir) / "train"
    if isinstance(settings, TrainConfig):
        config = replace_run(settings, out_dir=str(train_dir))
    else:
        config = config_from_dict(merge(settings, {"run": {"out_dir": str(train_dir)}}))
    _remove_earlier_training(train_dir)
    train_dir.mkdir(parents=True)
    (train_dir / _TRAIN_MARKER).write_text("written by incontext train_fresh; the next run of the experiment replaces this folder\n")
    results = train(config)
    model, _ = load_for_eval(latest_checkpoint(train_dir))
    return model, config, results
