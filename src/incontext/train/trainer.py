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
from typing import Any

import torch
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..config import ConfigError
from ..models import CGT, Transformer, cgt_loss
from ..tasks.base import Batch, Task
from ..fileio import strict_json
from .checkpoint import (LATEST, complete_checkpoints, is_finite_checkpoint, latest_checkpoint, load_training_state,
                         read_state, save_checkpoint)
from .config import OptimizerConfig, ScheduleConfig, TrainConfig
from .distributed import Distributed, init_distributed, rank_slice, shutdown
from .metrics import MetricsLogger, plot_losses, read_metrics

KILL_AT_STEP_ENV = "INCONTEXT_TEST_KILL_AT_STEP"  # tests: die like `kill -9` right after this step
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


def build_model(config: TrainConfig) -> Transformer | CGT:
    """The model the config describes: a Transformer, or a CGT for model.kind=cgt."""
    model_config = config.model_config()
    return CGT(model_config) if config.model_kind == "cgt" else Transformer(model_config)


def training_loss(model: torch.nn.Module, raw_model: torch.nn.Module, task: Task, batch: Batch, config: TrainConfig,
                  generator: torch.Generator) -> tuple[torch.Tensor, dict[str, float]]:
    """The task's loss of the model's outputs, or for a CGT the full objective (eq. 3) and its parts."""
    loss_config = config.loss_config()
    if loss_config is None:
        return task.loss(model(batch.inputs).float(), batch), {}

    def task_loss(outputs: torch.Tensor, scored: torch.Tensor | None) -> torch.Tensor:
        mask = batch.mask if scored is None else batch.mask & scored
        if not bool(mask.any()):  # no scored position in the auxiliary chunks of this micro-batch
            return outputs.sum() * 0.0
        return task.loss(outputs.float(), Batch(batch.inputs, batch.targets, mask, {}))

    return cgt_loss(raw_model, batch.inputs, task_loss, loss_config, generator)


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
        return torch.autocast(device.type, dtype=torch.bfloat16)
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
                          f"({'; '.join(differences)}); pass --force to continue anyway (no longer bit-identical "
                          "to an uninterrupted run)")


# the files a run writes into its folder: a fresh run may restart only over these (a run that died before
# its first checkpoint), never over a user's own files
_RUN_FILES = {"config.yaml", "metrics.jsonl", "tensorboard", "checkpoints"}


def _check_fresh_run_dir(run_dir: Path) -> None:
    if complete_checkpoints(run_dir) or latest_checkpoint(run_dir) is not None or any((run_dir / "checkpoints").glob("step_*")):
        raise FileExistsError(f"{run_dir} already holds checkpoints: pass --resume to continue, or choose another --out")
    if run_dir.exists() and not run_dir.is_dir():
        raise FileExistsError(f"run folder {run_dir} is a file")
    foreign = sorted(p.name for p in run_dir.iterdir()
                     if p.name not in _RUN_FILES and not p.name.startswith(".incontext-")) if run_dir.is_dir() else []
    if foreign:
        raise FileExistsError(f"{run_dir} is not empty (it holds {', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}) "
                              "and incontext did not write it: choose another --out (run.out_dir)")


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
    finite = torch.stack([torch.isfinite(t).all() for _, t in tensors]).cpu()
    return None if bool(finite.all()) else tensors[int((~finite).nonzero()[0])][0]


def _last_finite_checkpoint(run_dir: Path) -> Path | None:
    for checkpoint in reversed(complete_checkpoints(run_dir)):
        if is_finite_checkpoint(checkpoint):
            return checkpoint
    return None


def _truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop records logged after `step` by the run that is being resumed (they will be logged again)."""
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        kept = [json.dumps(r) for r in read_metrics(run_dir) if r["step"] <= step]
        path.write_text("".join(line + "\n" for line in kept))


# ----------------------------------------------------------------------------- the loop


def train(config: TrainConfig, *, resume: bool = False, progress: bool = True, force: bool = False) -> dict[str, Any]:
    """Train as configured; returns the final evaluation. Writes under config.run.out_dir:
    config.yaml, metrics.jsonl, tensorboard/, checkpoints/, loss.png and results.json.

    A fresh run needs an empty (or new) folder; resume=True continues from its latest checkpoint, refusing a
    changed model, task, optimizer, batch size or seed unless force=True. Resuming a finished run writes
    nothing and returns its results with "already_finished": True."""
    run = config.run
    if run.threads:
        torch.set_num_threads(run.threads)
    device = pick_device(run.device, int(os.environ.get("LOCAL_RANK", "0")))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist_info = init_distributed(device)
    try:
        return _train(config, dist_info, device, resume=resume, progress=progress, force=force)
    finally:
        shutdown(dist_info)


def _train(config: TrainConfig, dist_info: Distributed, device: torch.device, *, resume: bool, progress: bool,
           force: bool) -> dict[str, Any]:
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
    if config.model_kind == "cgt" and (dist_info.enabled or run.compile):
        raise ConfigError("model.kind=cgt trains in one process without torch.compile (its objective makes two passes "
                          "through model.run); set run.compile=false and start without torchrun")
    optimizer = build_optimizer(model, config.optimizer)

    start_step = 0
    checkpoint = latest_checkpoint(run_dir)
    if resume:
        if checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {run_dir}/checkpoints to resume from")
        pointer = run_dir / "checkpoints" / LATEST
        if dist_info.is_main and pointer.is_file() and pointer.read_text(errors="replace").strip() != checkpoint.name:
            print(f"incontext: note: {pointer} names an incomplete checkpoint; resuming from {checkpoint}", file=sys.stderr)
        state = read_state(checkpoint)
        _check_resumable(state["config"], config, checkpoint, force)
        if state["step"] > schedule.total_steps:
            raise ConfigError(f"cannot resume {checkpoint}: it is at step {state['step']}, past "
                              f"schedule.total_steps={schedule.total_steps}")
        start_step = load_training_state(checkpoint, model, optimizer)["step"]
        if start_step == schedule.total_steps:
            return _finished_run(run_dir, checkpoint, model, task, config, device, dist_info)
        if dist_info.is_main:
            _truncate_metrics(run_dir, start_step)
    else:
        _check_fresh_run_dir(run_dir)
    dist_info.barrier()
    if not resume and dist_info.is_main:
        _clear_unfinished_run(run_dir)

    logger = MetricsLogger(run_dir, tensorboard=run.tensorboard, enabled=dist_info.is_main)
    if dist_info.is_main:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
    train_model: torch.nn.Module = model
    if dist_info.enabled:
        train_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if run.compile:
        train_model = torch.compile(train_model)
    autocast = autocast_context(config, device)
    eval_batches = evaluation_batches(task, config) if dist_info.is_main else []
    rows = rank_slice(run.batch_size, dist_info)
    micro = (run.batch_size // dist_info.world_size) // run.grad_accum
    kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "-1"))
    tokens_per_step = run.batch_size * task.sequence_length

    def save(step: int) -> Path | None:
        path = None
        if dist_info.is_main:
            meta = {"parameters": model.num_parameters(), "world_size": dist_info.world_size}
            path = save_checkpoint(run_dir, step, model, optimizer, config.to_dict(), meta, keep=run.keep_checkpoints)
        dist_info.barrier()
        return path

    def stop(problem: str) -> None:
        bar.close()
        logger.close()
        good = _last_finite_checkpoint(run_dir) if dist_info.is_main else None
        where = f"the last good checkpoint (verified finite) is {good}" if good else "no finite checkpoint has been written"
        raise NonFiniteLossError(f"{problem}; training stopped without writing these weights; {where}. Lower "
                                 "optimizer.lr, set optimizer.grad_clip, or check the data.")

    def run_eval(step: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        if dist_info.is_main:
            result = evaluate(model, task, eval_batches, device, autocast)
            logger.log(step, "eval", result)
        dist_info.barrier()
        return result

    bar = tqdm(total=schedule.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
               disable=not (progress and dist_info.is_main))
    model.train()
    window_loss, window_start, window_steps, window_parts = 0.0, time.perf_counter(), 0, {}
    final_eval: dict[str, Any] = {}
    for step in range(start_step, schedule.total_steps):
        lr = lr_at(step, config.optimizer, schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.sample(run.batch_size, step_generator(run.seed, step))
        local = Batch(batch.inputs[rows], batch.targets[rows], batch.mask[rows], {})
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for m in range(run.grad_accum):
            part = slice(m * micro, (m + 1) * micro)
            piece = Batch(local.inputs[part], local.targets[part], local.mask[part], {}).to(device)
            sync = m == run.grad_accum - 1 or not dist_info.enabled
            with (contextlib.nullcontext() if sync else train_model.no_sync()), autocast:
                loss, parts = training_loss(train_model, model, task, piece, config,
                                            step_generator(run.seed + _AUX_SEED_OFFSET, step * run.grad_accum + m))
                loss = loss / run.grad_accum
            loss.backward()
            step_loss += loss.detach()
            for key, value in parts.items():
                window_parts[key] = window_parts.get(key, 0.0) + value / run.grad_accum
        grad_norm = None
        if config.optimizer.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.optimizer.grad_clip)
        bad = not bool(torch.isfinite(step_loss)) or (grad_norm is not None and not bool(torch.isfinite(grad_norm)))
        if dist_info.any(bad):
            stop(f"non-finite loss ({float(step_loss)}) or gradient norm at step {step + 1} (lr {lr:.3g})")
        optimizer.step()
        broken = _first_non_finite_state(model, optimizer)
        if dist_info.any(broken is not None):  # e.g. an overflowing update: checked before anything is written
            stop(f"non-finite {broken or 'weights'} after the update of step {step + 1} (lr {lr:.3g})")
        done = step + 1
        window_loss += float(step_loss)
        window_steps += 1
        bar.update(1)
        if done % run.log_every == 0 or done == schedule.total_steps:
            elapsed = time.perf_counter() - window_start
            record = {"loss": dist_info.mean(window_loss / window_steps), "lr": lr,
                      "tokens_per_s": tokens_per_step * window_steps / max(elapsed, 1e-9)}
            if grad_norm is not None:
                record["grad_norm"] = float(grad_norm)
            record.update({key: value / window_steps for key, value in window_parts.items()})  # CGT loss parts
            logger.log(done, "train", record)
            bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
            window_loss, window_start, window_steps, window_parts = 0.0, time.perf_counter(), 0, {}
        if done == schedule.total_steps or (run.eval_every and done % run.eval_every == 0):
            final_eval = run_eval(done)
            if final_eval and dist_info.is_main:
                bar.write(f"step {done}: eval " + ", ".join(f"{k} {v:.4f}" for k, v in final_eval.items() if isinstance(v, float)))
        if done == schedule.total_steps or (run.checkpoint_every and done % run.checkpoint_every == 0):
            save(done)
        if done == kill_at:
            os._exit(137)
    bar.close()
    logger.close()
    results = {"steps": schedule.total_steps, "parameters": model.num_parameters(), "eval": final_eval,
               "checkpoint": str(latest_checkpoint(run_dir)), "world_size": dist_info.world_size}
    if dist_info.is_main:
        (run_dir / "results.json").write_text(strict_json(results))
        plot_losses(run_dir)
    return results


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


def load_for_eval(checkpoint: Path, device: str = "cpu") -> tuple[Transformer | CGT, TrainConfig]:
    """The model of a checkpoint and the config it was trained with."""
    from .checkpoint import load_weights
    from .config import config_from_dict

    state = read_state(checkpoint)
    config = config_from_dict(state["config"])
    model = build_model(config).to(device)
    load_weights(checkpoint, model)
    return model.eval(), config


def evaluate_checkpoint(checkpoint: Path, device: str = "cpu") -> dict[str, Any]:
    """Re-run the evaluation that training logged, on the same held-out set."""
    model, config = load_for_eval(checkpoint, device)
    task = config.build_task()
    return evaluate(model, task, evaluation_batches(task, config), torch.device(device))


__all__ = [
    "NonFiniteLossError",
    "build_model",
    "build_optimizer",
    "evaluate",
    "evaluate_checkpoint",
    "evaluation_batches",
    "load_for_eval",
    "lr_at",
    "train",
]
