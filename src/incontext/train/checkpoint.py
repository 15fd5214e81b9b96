"""Checkpoints: weights and optimizer state in safetensors (never pickle), the rest in JSON, written atomically.

    <run>/checkpoints/step_00000500/model.safetensors      model weights (shared tensors handled)
                                   /optimizer.safetensors  optimizer state tensors + RNG states
                                   /state.json             config, step, optimizer param groups, metadata
    <run>/checkpoints/latest                               name of the newest complete checkpoint

A checkpoint is written into a temporary folder and renamed into place, then `latest` is replaced (write +
rename): a crash at any moment leaves the previous checkpoint intact and `latest` pointing at it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

LATEST = "latest"


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict], dict]:
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
            elif value is not None:
                scalars[f"{index}.{key}"] = value
    return tensors, state["param_groups"], scalars


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict], scalars: dict) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("state."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = value
    for name, value in scalars.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    state = {index: state[index] for index in sorted(state)}  # safetensors sorts names as strings
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    config: dict[str, Any],
    metadata: dict[str, Any] | None = None,
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` under run_dir/checkpoints atomically; keep the newest `keep`. Returns its path."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        tensors: dict[str, torch.Tensor] = {"rng.cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            tensors["rng.cuda"] = torch.cuda.get_rng_state()
        state: dict[str, Any] = {"step": step, "config": config, "metadata": metadata or {}}
        if optimizer is not None:
            opt_tensors, groups, scalars = _optimizer_tensors(optimizer)
            tensors.update(opt_tensors)
            state["optimizer"] = {"class": type(optimizer).__name__, "param_groups": groups, "scalars": scalars}
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        if final.exists():  # re-saving the same step (e.g. resumed run): replace the old copy
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_write_text(root / LATEST, final.name + "\n")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if (path / "state.json").is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint folder from a checkpoint folder, a run folder, or a run's checkpoints folder."""
    path = Path(path)
    if (path / "state.json").is_file():
        return path
    for candidate in (path, path.parent):
        found = latest_checkpoint(candidate)
        if found is not None:
            return found
    raise FileNotFoundError(f"no checkpoint at {path} (expected a folder with state.json, or a run folder with checkpoints/latest)")


def read_state(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / "state.json").read_text())


def load_weights(checkpoint: Path, model: torch.nn.Module) -> None:
    """Load model weights, with a clear message when the checkpoint does not fit the model."""
    try:
        missing, unexpected = load_model(model, str(Path(checkpoint) / "model.safetensors"), strict=False)
    except RuntimeError as error:  # shape mismatch
        raise ValueError(f"checkpoint {checkpoint} does not fit this model: {error}") from error
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} does not fit this model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def load_training_state(checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimizer and RNG state; returns state.json."""
    state = read_state(checkpoint)
    load_weights(checkpoint, model)
    tensors = load_file(str(Path(checkpoint) / "optimizer.safetensors"))
    saved = state.get("optimizer")
    if saved is None or saved["class"] != type(optimizer).__name__:
        raise ValueError(f"checkpoint {checkpoint} holds no {type(optimizer).__name__} state")
    _restore_optimizer(optimizer, tensors, saved["param_groups"], saved["scalars"])
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return state
