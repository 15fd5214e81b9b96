"""The training loop: one code path for one process on CPU, one GPU, or many processes under torchrun.

Data for step s is drawn from a generator seeded by (seed, s) and every process draws the whole global batch
then keeps its own rows, so the data of a run depends on (seed, batch_size) only: not on the number of
processes, the accumulation steps, or where a run was resumed. Together with checkpoints that hold the
optimizer and RNG state, a resumed run reaches bit-identical weights.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..runtime import Runtime
from ..config import ConfigError
from ..tasks.base import Batch, Task
from ..fileio import strict_json
from .checkpoint import (LATEST, complete_checkpoints, is_finite_checkpoint, latest_checkpoint, load_training_state,
                         read_state, save_checkpoint)
from .config import MODEL_KINDS, OptimizerConfig, config_from_dict, ScheduleConfig, TrainConfig
from .distributed import Distributed, init_distributed, rank_slice, shutdown
from .metrics import MetricsLogger, plot_losses, read_metrics

_EVAL_SEED_OFFSET = 1_000_000_007
_AUX_SEED_OFFSET = 2_000_000_011  # auxiliary-loss cut points and VAE noise


class NonFiniteLossError(RuntimeError):
    """The loss, the gradient norm, the weights or the optimizer state became NaN or infinite; nothing of that
    step is written and the last good checkpoint is kept."""


# ----------------------------------------------------------------------------- pieces


def lr_at(step: int, optimizer: OptimizerConfig, schedule: ScheduleConfig) -> float:
    """Learning rate for (0-based) step: linear warmup, then cosine decay to lr * min_lr_ratio (or constant)."""
    if step < schedule.warmup_steps:
        return optimizer.lr * (step + 1) / schedule.warmup_steps
    if schedule.kind == "constant":
        return optimizer.lr
    progress = (step - schedule.warmup_steps) / max(1, schedule.total_steps - schedule.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return optimizer.lr * (schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * cosine)


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig) -> torch.optim.Optimizer:
    """Weight decay on matrices only (not on biases, norm gains or scalar mixing weights)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if config.name == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps)
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)


def pick_device(preference: str, local_rank: int = 0) -> torch.device:
    if preference == "cuda" or (preference == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("run.device='cuda' but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def build_model(config: TrainConfig) -> torch.nn.Module:
    """The model the config describes (its kind from train.config.MODEL_KINDS: a Transformer, a CGT, ...)."""
    return MODEL_KINDS[config.model_kind].build(config.model_config(), config.loss_config())


def training_loss(model: torch.nn.Module, train_model: torch.nn.Module, task: Task, batch: Batch,
                  generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """The task's loss of the model's outputs, or the model's own objective and its parts when it defines
    `training_loss(inputs, task_loss, generator) -> (loss, parts)` (a CGT does: eq. 3). `task_loss(outputs,
    scored)` scores outputs shaped like the model's over the task's mask and, given `scored` (B, T), only there."""
    own = getattr(model, "training_loss", None)
    if own is None:
        return task.loss(train_model(batch.inputs).float(), batch), {}

    def task_loss(outputs: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
        mask = batch.mask if scored is None else batch.mask & scored
        if not bool(mask.any()):  # no scored position (e.g. in the auxiliary chunks of this micro-batch)
            return outputs.sum() * 0.0
        return task.loss(outputs.float(), Batch(batch.inputs, batch.targets, mask, {}))

    return own(batch.inputs, task_loss, generator)


def evaluation_batches(task: Task, config: TrainConfig) -> list[Batch]:
    """The fixed held-out set: the same sequences at every evaluation and in `incontext eval`."""
    generator = torch.Generator().manual_seed(config.run.seed + _EVAL_SEED_OFFSET)
    sizes = [config.run.eval_batch_size] * (config.run.eval_sequences // config.run.eval_batch_size)
    if config.run.eval_sequences % config.run.eval_batch_size:
        sizes.append(config.run.eval_sequences % config.run.eval_batch_size)
    return [task.sample(size, generator) for size in sizes]


def autocast_context(config: TrainConfig, device: torch.device):
    mode = config.run.autocast
    if mode == "bf16" or (mode == "auto" and device.type == "cuda"):
        return Runtime(device, torch.bfloat16).autocast()  # the one place that builds autocast (runtime.py)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, batches: list[Batch], device: torch.device, autocast=None) -> dict[str, Any]:
    """Loss and the task's own metrics over the evaluation set, averaged with batch-size weights."""
    was_training = model.training
    model.eval()
    totals: dict[str, Any] = {}
    count = 0
    for batch in batches:
        batch = batch.to(device)
        with autocast or contextlib.nullcontext():
            outputs = model(batch.inputs)
        values = {"loss": float(task.loss(outputs.float(), batch)), **task.evaluate(outputs.float(), batch)}
        n = batch.batch_size
        for key, value in values.items():
            if isinstance(value, list):
                totals[key] = [t + n * v for t, v in zip(totals.get(key, [0.0] * len(value)), value)]
            else:
                totals[key] = totals.get(key, 0.0) + n * float(value)
        count += n
    model.train(was_training)
    return {k: [v / count for v in t] if isinstance(t, list) else t / count for k, t in totals.items()}


_MISSING = object()


def _check_resumable(saved: dict[str, Any], config: TrainConfig, checkpoint: Path, force: bool) -> None:
    """Refuse to continue with another model, task, optimizer, loss, batch size or seed (the data and the
    weights would no longer be those of an uninterrupted run) unless forced."""
    current = config.to_dict()
    try:  # the saved sections as this version resolves them (older runs saved the model section as given)
        saved = {**saved, **{k: v for k, v in config_from_dict(saved).to_dict().items() if k in ("model", "loss")}}
    except ConfigError:
        pass
    differences = []
    for section in ("model", "task", "optimizer", "loss", "run.batch_size", "run.seed"):
        parent, _, key = section.partition(".")
        before = saved.get(parent, {} if parent == "loss" else _MISSING)  # older runs have no loss section
        now = current[parent]
        if key:
            before, now = (before.get(key, _MISSING) if isinstance(before, dict) else _MISSING), now[key]
        if isinstance(before, dict) and isinstance(now, dict):
            differences += [f"{section}.{k}: {before.get(k, 'unset')} -> {now.get(k, 'unset')}"
                            for k in sorted(set(before) | set(now)) if before.get(k, _MISSING) != now.get(k, _MISSING)]
        elif before != now:
            differences.append(f"{section}: {'unset' if before is _MISSING else before} -> {now}")
    if differences and not force:
        raise ConfigError(f"cannot resume {checkpoint}: it was trained with a different configuration "
                          f"({'; '.join(differences)}); resume with force to continue anyway (no longer bit-identical "
                          "to an uninterrupted run)")


# the files a run writes into its folder: a fresh run may restart only over these (a run that died before
# its first checkpoint), never over a user's own files
_RUN_FILES = {"config.yaml", "metrics.jsonl", "tensorboard", "checkpoints"}


def _check_fresh_run_dir(run_dir: Path) -> None:
    if complete_checkpoints(run_dir) or latest_checkpoint(run_dir) is not None or any((run_dir / "checkpoints").glob("step_*")):
        raise FileExistsError(f"{run_dir} already holds checkpoints: resume it, or choose another run folder")
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"run folder {run_dir} is a file")
    foreign = sorted(p.name for p in run_dir.iterdir()
                     if p.name not in _RUN_FILES and not p.name.startswith(".incontext-")) if run_dir.is_dir() else []
    if foreign:
        raise FileExistsError(f"{run_dir} is not empty (it holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}) "
                              "and incontext did not write it: choose another run folder (run.out_dir)")


def _clear_unfinished_run(run_dir: Path) -> None:
    """A fresh run over one that died before its first checkpoint: drop that run's log (ours to remove)."""
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)
    for events in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        events.unlink()


def _first_non_finite_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Which weight or optimizer-state tensor holds NaN or an infinity, if any (one device sync)."""
    names = {id(p): n for n, p in model.named_parameters()}
    tensors = [(f"weight {n}", p.detach()) for n, p in model.named_parameters()]
    for param, state in optimizer.state.items():
        tensors += [(f"optimizer {k} of {names.get(id(param), '?')}", v) for k, v in state.items()
                    if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not tensors:
        return None
    # AdamW keeps `step` on the CPU while the weights may sit on a GPU: one flag per tensor, gathered on the CPU
    finite = torch.stack([torch.isfinite(t).all().cpu() for _, t in tensors])
    return None if bool(finite.all()) else tensors[int((~finite).nonzero()[0])][0]


def _last_finite_checkpoint(run_dir: Path) -> Path | None:
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        if is_finite_checkpoint(checkpoint):
            return checkpoint
    return None


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop records logged after `step` by the run that is being resumed (they will be logged again)."""
    path = run_dir / "metrics.jsonl"
    records = read_metrics(run_dir) if path.is_file() else []
    kept = [json.dumps(r) for r in records if r["step"] <= step]
    if len(kept) < len(records):  # a finished run's log stays untouched
        path.write_text("".join(line + "\n" for line in kept))


# ----------------------------------------------------------------------------- the loop


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True, force: bool = False,
          after_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train as configured; returns the final evaluation. Writes under config.run.out_dir:
    config.yaml, metrics.jsonl, tensorboard/, checkpoints/, loss.png and results.json.

    A fresh run needs an empty (or new) folder; resume=True continues from its latest checkpoint, refusing a
    changed model, task, optimizer, batch size or seed unless force=True. Resuming a finished run writes
    nothing and returns its results with "already_finished": True. `after_step(step)` is called after each
    step's evaluation and checkpoint (tests use it to kill a run)."""
    run = config.run
    if run.threads:
        torch.set_num_threads(run.threads)
    device = pick_device(run.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist_info = init_distributed(device)
    try:
        results = _train(config, dist_info, device, resume=resume, progress=progress, force=force, after_step=after_step)
        # every rank done before any tears the group down: a rank destroying gloo's group while another still writes
        # its results aborted once in CI ("terminate called without an active exception"); not after an error, where
        # a barrier could wait forever for a rank that failed
        dist_info.barrier()
        return results
    finally:
        shutdown(dist_info)


@dataclass
class _Run:
    """What one training run holds while it steps."""

    config: TrainConfig
    dist: Distributed
    device: torch.device
    task: Task
    model: torch.nn.Module
    train_model: torch.nn.Module  # the model wrapped for DDP and/or torch.compile
    optimizer: torch.optim.Optimizer
    logger: MetricsLogger
    bar: Any
    autocast: Any
    eval_batches: list[Batch]

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.out_dir)


def _train(config: TrainConfig, dist_info: Distributed, device: torch.device, *, resume: bool, progress: bool,
           force: bool, after_step: Callable[[int], None] | None) -> dict[str, Any]:
    run, schedule = config.run, config.schedule
    run_dir = Path(run.out_dir)
    micro_batches = dist_info.world_size * run.grad_accum
    if run.batch_size % micro_batches:
        raise ConfigError(
            f"run.batch_size={run.batch_size} must be divisible by processes x run.grad_accum = {micro_batches}"
        )
    task = config.build_task()
    torch.manual_seed(run.seed)  # parameter init; identical on every rank
    model = build_model(config).to(device)
    if hasattr(model, "training_loss") and (dist_info.enabled or run.compile):
        raise ConfigError(f"model.kind={config.model_kind} trains in one process without torch.compile (its objective "
                          "makes its own passes through the model); set run.compile=false and start without torchrun")
    optimizer = build_optimizer(model, config.optimizer)

    start_step = _resume_or_start(config, dist_info, run_dir, model, optimizer, resume=resume, force=force)
    if start_step == schedule.total_steps:
        return _finished_run(run_dir, latest_checkpoint(run_dir), model, task, config, device, dist_info)

    train_model: torch.nn.Module = model
    if dist_info.enabled:
        train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if run.compile:
        train_model = torch.compile(train_model)
    bar = tqdm(total=schedule.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
               disable=not (progress and dist_info.is_main))
    r = _Run(config, dist_info, device, task, model, train_model, optimizer,
             MetricsLogger(run_dir, tensorboard=run.tensorboard, enabled=dist_info.is_main), bar,
             autocast_context(config, device), evaluation_batches(task, config) if dist_info.is_main else [])
    model.train()
    window = _Window()
    final_eval: dict[str, Any] = {}
    for step in range(start_step, schedule.total_steps):
        lr, step_loss, grad_norm = _train_step(r, step, window.parts)
        done = step + 1
        window.add(step_loss)
        bar.update(1)
        if done % run.log_every == 0 or done == schedule.total_steps:
            _log_train(r, done, lr, grad_norm, window)
            window = _Window()
        if done == schedule.total_steps or (run.eval_every and done % run.eval_every == 0):
            final_eval = _evaluate_and_log(r, done)
        if done == schedule.total_steps or (run.checkpoint_every and done % run.checkpoint_every == 0):
            _save(r, done)
        if after_step is not None:
            after_step(done)
    bar.close()
    r.logger.close()
    results = {"steps": schedule.total_steps, "parameters": model.num_parameters(), "eval": final_eval,
               "checkpoint": str(latest_checkpoint(run_dir)), "world_size": dist_info.world_size}
    if dist_info.is_main:
        (run_dir / "results.json").write_text(strict_json(results))
        plot_losses(run_dir)
    return results


def _resume_or_start(config: TrainConfig, dist_info: Distributed, run_dir: Path, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, *, resume: bool, force: bool) -> int:
    """The step to start from: the resumed checkpoint's (its weights and optimizer state loaded), or 0 for a
    fresh run in an empty folder (config.yaml written)."""
    start_step = 0
    if resume:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise FileNotFoundError(f"resume: no checkpoint under {run_dir}/checkpoints to resume from")
        pointer = run_dir / "checkpoints" / LATEST
        if dist_info.is_main and pointer.is_file() and pointer.read_text(errors="replace").strip() != checkpoint.name:
            print(f"incontext: note: {pointer} names an incomplete checkpoint; resuming from {checkpoint}", file=sys.stderr)
        state = read_state(checkpoint)
        _check_resumable(state["config"], config, checkpoint, force)
        if state["step"] > config.schedule.total_steps:
            raise ConfigError(f"cannot resume {checkpoint}: it is at step {state['step']}, past "
                              f"schedule.total_steps={config.schedule.total_steps}")
        start_step = load_training_state(checkpoint, model, optimizer)["step"]
        if start_step == config.schedule.total_steps:
            return start_step
        if dist_info.is_main:
            truncate_metrics(run_dir, start_step)
    else:
        _check_fresh_run_dir(run_dir)
    dist_info.barrier()
    if not resume and dist_info.is_main:
        _clear_unfinished_run(run_dir)
    if dist_info.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    return start_step


@dataclass
class _Window:
    """Training losses summed since the last log record."""

    loss: float = 0.0
    steps: int = 0
    start: float = field(default_factory=time.perf_counter)
    parts: dict[str, float] = field(default_factory=dict)  # a model's own loss parts (e.g. CGT's)

    def add(self, step_loss: float) -> None:
        self.loss += step_loss
        self.steps += 1


def _train_step(r: _Run, step: int, parts: dict[str, float]) -> tuple[float, float, torch.Tensor | None]:
    """One optimizer step on the step's global batch (this process's rows, in grad_accum micro-batches);
    returns the learning rate, the loss and the gradient norm. Stops the run before the update is kept if
    anything became non-finite. Loss parts are added to `parts`."""
    run, config = r.config.run, r.config
    lr = lr_at(step, config.optimizer, config.schedule)
    for group in r.optimizer.param_groups:
        group["lr"] = lr
    task_batch = r.task.sample(run.batch_size, step_generator(run.seed, step))
    rows = rank_slice(run.batch_size, r.dist)
    micro = (run.batch_size // r.dist.world_size) // run.grad_accum
    local = Batch(task_batch.inputs[rows], task_batch.targets[rows], task_batch.mask[rows], {})
    r.optimizer.zero_grad(set_to_none=True)
    step_loss = torch.zeros((), device=r.device)
    for m in range(run.grad_accum):
        part = slice(m * micro, (m + 1) * micro)
        batch = Batch(local.inputs[part], local.targets[part], local.mask[part], {}).to(r.device)
        sync = m == run.grad_accum - 1 or not r.dist.enabled
        with (contextlib.nullcontext() if sync else r.train_model.no_sync()), r.autocast:
            loss, loss_parts = training_loss(r.model, r.train_model, r.task, batch,
                                             step_generator(run.seed + _AUX_SEED_OFFSET, step * run.grad_accum + m))
            loss = loss / run.grad_accum
        loss.backward()
        step_loss += loss.detach()
        for key, value in loss_parts.items():
            parts[key] = parts.get(key, 0.0) + value / run.grad_accum
    grad_norm = None
    if config.optimizer.grad_clip is not None:
        grad_norm = torch.nn.utils.clip_grad_norm_(r.model.parameters(), config.optimizer.grad_clip)
    bad = not bool(torch.isfinite(step_loss)) or (grad_norm is not None and not bool(torch.isfinite(grad_norm)))
    if r.dist.any(bad):
        _stop(r, f"non-finite loss ({float(step_loss)}) or gradient norm at step {step + 1} (lr {lr:.3g})")
    r.optimizer.step()
    broken = _first_non_finite_state(r.model, r.optimizer)
    if r.dist.any(broken is not None):  # e.g. an overflowing update: checked before anything is written
        _stop(r, f"non-finite {broken or 'weights'} after the update of step {step + 1} (lr {lr:.3g})")
    return lr, float(step_loss), grad_norm


def _log_train(r: _Run, done: int, lr: float, grad_norm: torch.Tensor | None, window: _Window) -> None:
    elapsed = time.perf_counter() - window.start
    tokens = r.config.run.batch_size * r.task.sequence_length * window.steps
    record = {"loss": r.dist.mean(window.loss / window.steps), "lr": lr, "tokens_per_s": tokens / max(elapsed, 1e-9)}
    if grad_norm is not None:
        record["grad_norm"] = float(grad_norm)
    record.update({key: value / window.steps for key, value in window.parts.items()})
    r.logger.log(done, "train", record)
    r.bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")


def _evaluate_and_log(r: _Run, done: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if r.dist.is_main:
        result = evaluate(r.model, r.task, r.eval_batches, r.device, r.autocast)
        r.logger.log(done, "eval", result)
        r.bar.write(f"step {done}: eval " + ", ".join(f"{k} {v:.4f}" for k, v in result.items() if isinstance(v, float)))
    r.dist.barrier()
    return result


def _save(r: _Run, step: int) -> None:
    if r.dist.is_main:
        meta = {"parameters": r.model.num_parameters(), "world_size": r.dist.world_size}
        save_checkpoint(r.run_dir, step, r.model, r.optimizer, r.config.to_dict(), meta, keep=r.config.run.keep_checkpoints)
    r.dist.barrier()


def _stop(r: _Run, problem: str) -> None:
    r.bar.close()
    r.logger.close()
    good = _last_finite_checkpoint(r.run_dir) if r.dist.is_main else None
    where = f"the last good checkpoint (verified finite) is {good}" if good else "no finite checkpoint has been written"
    raise NonFiniteLossError(f"{problem}; training stopped without writing these weights; {where}. Lower "
                             "optimizer.lr, set optimizer.grad_clip, or check the data.")


def _finished_run(run_dir: Path, checkpoint: Path, model: torch.nn.Module, task: Task, config: TrainConfig,
                  device: torch.device, dist_info: Distributed) -> dict[str, Any]:
    """Resuming a run that already reached schedule.total_steps: add nothing to its log; its results (written
    now only if the run died between its last checkpoint and results.json)."""
    path = run_dir / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        results = None
    if not isinstance(results, dict) or results.get("steps") != config.schedule.total_steps:
        final_eval = evaluate(model, task, evaluation_batches(task, config), device, autocast_context(config, device))
        results = {"steps": config.schedule.total_steps, "parameters": model.num_parameters(), "eval": final_eval,
                   "checkpoint": str(checkpoint), "world_size": dist_info.world_size}
        if dist_info.is_main:
            path.write_text(strict_json(results))
    return {**results, "already_finished": True}


def load_for_eval(checkpoint: Path, device: str = "cpu") -> tuple[torch.nn.Module, TrainConfig]:
    """The model of a checkpoint and the config it was trained with."""
    from .checkpoint import load_weights

    state = read_state(checkpoint)
    config = config_from_dict(state["config"])
    model = build_model(config).to(device)
    load_weights(checkpoint, model)
    return model.eval(), config


def evaluate_checkpoint(checkpoint: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Re-run the evaluation that training logged, on the same held-out set (float32 weights; a half `dtype` runs
    the forward in autocast, as training did)."""
    model, config = load_for_eval(checkpoint, device)
    task = config.build_task()
    runtime = Runtime(torch.device(device), dtype)
    if dtype == torch.float64:
        model = model.double()
    return evaluate(model, task, evaluation_batches(task, config), runtime.device, runtime.autocast())


__all__ = [
    "NonFiniteLossError",
    "build_model",
    "training_loss",
    "build_optimizer",
    "evaluate",
    "evaluate_checkpoint",
    "evaluation_batches",
    "load_for_eval",
    "lr_at",
    "train",
]
