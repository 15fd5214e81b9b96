"""Checkpoints: weights and optimizer state in safetensors (never pickle), the rest in JSON, written atomically.

    <run>/checkpoints/step_00000500/model.safetensors      model weights (shared tensors handled)
                                   /optimizer.safetensors  optimizer state tensors + RNG states
                                   /state.json             config, step, optimizer param groups, metadata
    <run>/checkpoints/latest                               name of the newest complete checkpoint

A checkpoint is written into a temporary folder, flushed to disk (files and folder fsync'd) and renamed into
place, then `latest` is replaced (write + rename): a crash at any moment leaves the previous checkpoint intact
and `latest` pointing at it; the next save removes what an interrupted one left behind. state.json records the
sha256 of both tensor files, checked on every load, so a flipped bit is an error naming the file.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model

from ..fileio import durable_replace, sha256_file, write_text_atomic

LATEST = "latest"
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def _is_checkpoint_name(name: str) -> bool:
    return name.startswith("step_") and name[5:].isdigit()


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
    _remove_leftovers(root)
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
        state["sha256"] = {name: sha256_file(tmp / name) for name in TENSOR_FILES}
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        if final.exists():  # re-saving the same step (e.g. resumed run): replace the old copy
            shutil.rmtree(final)
        durable_replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    write_text_atomic(root / LATEST, final.name + "\n")
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and _is_checkpoint_name(p.name))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _remove_leftovers(root: Path) -> None:
    """Temporary folders and files of saves that were interrupted (killed between write and rename)."""
    for leftover in root.glob(".step_*"):
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
    for leftover in root.glob(f".{LATEST}.*"):
        leftover.unlink(missing_ok=True)


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders under run_dir/checkpoints that hold a state.json (written last), oldest first."""
    root = Path(run_dir) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if _is_checkpoint_name(p.name) and (p / "state.json").is_file())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `latest` names, or (when `latest` is missing or names an incomplete folder) the newest
    complete one; None when there is none."""
    pointer = Path(run_dir) / "checkpoints" / LATEST
    if pointer.is_file():
        path = pointer.parent / pointer.read_text(errors="replace").strip()
        if path.parent == pointer.parent and _is_checkpoint_name(path.name) and (path / "state.json").is_file():
            return path
    complete = complete_checkpoints(run_dir)
    return complete[-1] if complete else None


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
    path = Path(checkpoint) / "state.json"
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"{path} is missing: {checkpoint} is not a complete checkpoint") from error
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is corrupt: not UTF-8 text (byte {error.start})") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}:{error.colno}: corrupt, not valid JSON ({error.msg})") from error
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or not isinstance(state.get("config"), dict):
        raise ValueError(f"{path} is corrupt: it needs an integer `step` and a `config` mapping")
    return state


def verify_file(checkpoint: Path, name: str, state: dict[str, Any] | None = None) -> Path:
    """checkpoint/name, after checking its sha256 against state.json (checkpoints written before digests were
    recorded are only checked for presence)."""
    path = Path(checkpoint) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the checkpoint is incomplete")
    expected = (state if state is not None else read_state(checkpoint)).get("sha256", {}).get(name)
    if expected is not None:
        actual = sha256_file(path)
        if actual != expected:
            raise ValueError(f"{path} is corrupt: its sha256 {actual[:16]}... differs from {expected[:16]}... "
                             "recorded in state.json")
    return path


def first_non_finite(tensors: dict[str, torch.Tensor] | list[tuple[str, torch.Tensor]]) -> str | None:
    """Name of the first floating-point tensor holding NaN or an infinity (None when all are finite)."""
    items = tensors.items() if isinstance(tensors, dict) else tensors
    for name, tensor in items:
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return name
    return None


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as error:
        raise ValueError(f"{path} is corrupt: {' '.join(str(error).split())}") from error


def is_finite_checkpoint(checkpoint: Path) -> bool:
    """True when the checkpoint's files match their digests and every tensor in them is finite."""
    try:
        state = read_state(checkpoint)
        return all(first_non_finite(_read_tensors(verify_file(checkpoint, name, state))) is None for name in TENSOR_FILES)
    except (ValueError, OSError):
        return False


def load_weights(checkpoint: Path, model: torch.nn.Module) -> None:
    """Load model weights after checking the file's digest, with a one-line message when the file is corrupt,
    holds non-finite values, or does not fit the model."""
    path = verify_file(checkpoint, "model.safetensors")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except SafetensorError as error:
        raise ValueError(f"{path} is corrupt: {' '.join(str(error).split())}") from error
    except RuntimeError as error:  # shape mismatch
        raise ValueError(f"checkpoint {checkpoint} does not fit this model: {' '.join(str(error).split())}") from error
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {checkpoint} does not fit this model: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )
    bad = first_non_finite(list(model.state_dict().items()))
    if bad is not None:
        raise ValueError(f"{path} holds non-finite values (in {bad}): the run diverged before this checkpoint was written")


def load_training_state(checkpoint: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimizer and RNG state; returns state.json."""
    state = read_state(checkpoint)
    load_weights(checkpoint, model)
    path = verify_file(checkpoint, "optimizer.safetensors", state)
    tensors = _read_tensors(path)
    bad = first_non_finite({k: v for k, v in tensors.items() if k.startswith("state.")})
    if bad is not None:
        raise ValueError(f"{path} holds non-finite values (in {bad}): the run diverged before this checkpoint was written")
    saved = state.get("optimizer")
    if saved is None or saved["class"] != type(optimizer).__name__:
        raise ValueError(f"checkpoint {checkpoint} holds no {type(optimizer).__name__} state")
    if "rng.cpu" not in tensors:
        raise ValueError(f"{path} is incomplete: it holds no rng.cpu state")
    try:
        _restore_optimizer(optimizer, tensors, saved["param_groups"], saved["scalars"])
    except (KeyError, ValueError, RuntimeError) as error:
        raise ValueError(f"checkpoint {checkpoint}: its optimizer state does not fit this model "
                         f"({' '.join(str(error).split())})") from error
    torch.set_rng_state(tensors["rng.cpu"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    return state
