"""The distillation pipeline kv-prefix and distill-lora share, in Cartridges' three stages:

1. synthesis: the data stage (absorb/study/: the sequences a prompt-free student reads and the teacher's
   next-token distributions on them, cached on disk with `study.cache`);
2. objective: KL(teacher || student) on the teacher's top-k log-probabilities at the taught positions, plus
   `argmax_weight` times the cross-entropy of the teacher's top token (distillation_loss);
3. one training loop (train): seeded batches over the stage, AdamW, autocast, a divergence guard (Rollback), an
   early stop on a plateau, a progress bar, and on a CUDA device for our Transformer the step as one CUDA graph.

A method is a `Distiller`: its options are TrainOptions (the shared fields, with its own defaults) plus a few of its
own, and it supplies only its trainable tensors and how the student runs (`Student`) and the adapted model they
make. Speed switches that change no result are explicit arguments (`Speed`), not options.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from ..config import limit, option
from ..runtime import device_of, frozen_casts, parse_dtype, resolve_runtime, tf32_matmuls
from .protocol import AbsorbMethod, AdaptedModel, method_class
from .study import StudyOptions, heldout_sequences, study


@dataclass(frozen=True)
class Speed:
    """How fast, never what: each switch leaves the result the same up to float rounding (the benchmarks' peers)."""

    cuda_graph: bool = True  # on a CUDA device, our Transformer: the training step captured once and replayed
    tf32: bool = False  # on a CUDA device: float32 matmuls in TF32 (rounds inputs: a small change of the numbers)
    static_decode: Literal["always", "cuda", "never"] = "always"  # the data stage's decodes on a fixed-size cache
    cast_once: bool = True  # under autocast: the frozen weights' half-precision copies made once, not per step
    fixed_shapes: bool = False  # every batch padded to the longest sequence (what a CUDA graph needs; on with one)


@dataclass
class TrainOptions:
    """The options of every distillation method (each sets its own defaults); `study` is the data stage's."""

    steps: int = limit(96, min=0, help="train at least this many steps (0: no training)")
    passes: int = limit(8, min=0, help="and at least this many passes over the data stage (a long document's is large)")
    learning_rate: float = limit(0.05, gt=0, help="AdamW's rate (halved at each rollback of the divergence guard)")
    batch_size: int = limit(4, min=1, help="sequences per step")
    patience: int = limit(16, min=1, help="the divergence guard's window in steps; the plateau's (at least one pass)")
    min_improvement: float = limit(0.01, min=0, max=1, help=
        "stop where a window's mean loss falls less than this share")
    argmax_weight: float = limit(0.0, min=0, help="plus this times the cross-entropy of the teacher's top token")
    tail: bool = option(False, "the top-k KL plus one bucket for the rest of the mass (a true divergence, >= 0)")
    autocast: Literal["none", "bfloat16", "float16"] = option("bfloat16",
        "training's matmuls in this dtype (\"none\": the model's)")
    seed: int = limit(0, min=0, help="every draw of the data stage and of training")
    compose_steps: int = limit(0, min=0, help="compose: train the combination this many steps on both data stages")
    heldout: int = limit(2, min=0, help="fresh continuations never trained on: the full KL before and after training")
    keep_start: bool = option(False, "keep the start where training raised the held-out KL (needs heldout > 0)")
    study: StudyOptions = field(default_factory=StudyOptions, metadata={"help":
        "the data stage (--set study.OPTION=VALUE)"})


# ----------------------------------------------------------------------------- the objective


def _padded(batch, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences right-padded into (B, L) ids (causal: padding is unseen; L the longest, or `length`) and the mask
    of each one's taught positions (its last n, n = rows of its teacher log-probs)."""
    length = length or max(item[0].shape[0] for item in batch)
    tokens = batch[0][0].new_zeros(len(batch), length)
    mask = torch.zeros(len(batch), length, dtype=torch.bool, device=tokens.device)
    for row, item in enumerate(batch):
        end, n = item[0].shape[0], item[1].shape[0]
        tokens[row, :end], mask[row, end - n: end] = item[0], True
    return tokens, mask


def distillation_batch(batch, length: int | None = None) -> dict[str, torch.Tensor]:
    """A batch of the stage's sequences as the tensors distillation_loss reads: ids (B, L) right-padded to the
    longest sequence (or to `length`, for a step of fixed shapes), the taught positions' mask, the teacher's
    log-probs (B, L, k or V) and, for top-k targets, their token ids."""
    tokens, mask = _padded(batch, length)
    width, top_k = batch[0][1].shape[-1], len(batch[0]) == 3
    teacher = batch[0][1].new_zeros(len(batch), tokens.shape[1], width)
    index = batch[0][2].new_zeros(len(batch), tokens.shape[1], width) if top_k else None
    for row, item in enumerate(batch):
        end, n = item[0].shape[0], item[1].shape[0]
        teacher[row, end - n: end] = item[1]
        if top_k:
            index[row, end - n: end] = item[2]
    out = {"tokens": tokens, "mask": mask, "teacher": teacher}
    return out if index is None else {**out, "index": index}


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Maechler's split at -log 2)."""
    x = x.clamp(max=-torch.finfo(x.dtype).eps)  # below 0: each branch's input kept where its gradient is finite
    near = x > -0.6931471805599453
    return torch.where(near, torch.log(-torch.expm1(torch.where(near, x, -1.0))),
                       torch.log1p(-torch.exp(torch.where(near, -1.0, x))))


def distillation_loss(logits: torch.Tensor, tensors: dict[str, torch.Tensor], argmax_weight: float = 0.0,
                      tail: bool = False) -> torch.Tensor:
    """Mean over the taught positions of KL(teacher || student) from the student's logits (B, L, V) on
    distillation_batch's ids, without a host sync (a CUDA graph can hold it). Top-k targets are taught on the
    teacher's top k tokens, sum_i p_i (log p_i - log q_i) over them (the full KL at k = V; below zero where the
    student puts more mass on them than the teacher); with `tail`, plus one bucket for the rest of the mass,
    p_rest (log p_rest - log q_rest): the KL of the two distributions coarsened to k + 1 outcomes, >= 0, and the full
    KL at k = V. With `argmax_weight` w > 0, plus w times the mean cross-entropy of the teacher's most likely token at
    the same positions."""
    log_q = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    log_p = tensors["teacher"].to(log_q.dtype)
    top_k = "index" in tensors
    if top_k:
        log_q = log_q.gather(-1, tensors["index"])  # the top k, most likely first
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    if tail and top_k:
        tiny = math.log(torch.finfo(log_q.dtype).tiny)  # a rest that rounds to 0 (k = V) adds 0, not 0 * inf
        rest_p, rest_q = (_log1mexp(x.logsumexp(-1)).clamp(min=tiny) for x in (log_p, log_q))
        kl = kl + rest_p.exp() * (rest_p - rest_q)
    if argmax_weight:
        kl = kl - argmax_weight * (log_q[..., 0] if top_k else log_q.gather(-1, log_p.argmax(-1, keepdim=True))[..., 0])
    mask = tensors["mask"].to(kl.dtype)
    return (kl * mask).sum() / mask.sum()


def distillation_kl(student, batch, argmax_weight: float = 0.0, tail: bool = False) -> torch.Tensor:
    """distillation_loss of `student` ((B, L) ids -> logits) on a batch of the stage's sequences."""
    tensors = distillation_batch(batch)
    return distillation_loss(student(tensors["tokens"]), tensors, argmax_weight, tail)


@torch.no_grad()
def heldout_kl(student: "Student", sequences: list) -> float | None:
    """The full KL(teacher || student) in nats per taught position of `student` on sequences with the teacher's full
    log-probabilities (study.stage.heldout_sequences; distillation_loss at k = V: a true divergence, >= 0), in the
    student's own dtype (no autocast); None for no sequences."""
    if not sequences:
        return None
    tensors = distillation_batch(sequences)
    logits = student.module(tensors["tokens"], **student.inputs(tensors["tokens"].shape[0]))
    return float(distillation_loss(logits, tensors))


# ----------------------------------------------------------------------------- the training loop


@dataclass
class Student:
    """What a method trains: `params` (leaf tensors, trained in place), the `module` whose forward is the student
    (its other parameters frozen while training), `inputs(batch)`: the keyword arguments of that forward for a batch
    of `batch` rows (kv-prefix: the prefix as a cache), and `frozen`: positions along dim 2 of every param whose
    gradient is dropped (the attention sink), or one such list per param (prefixes of different lengths per layer).
    `graphable`: the step may be captured as a CUDA graph."""

    params: list[torch.Tensor]
    module: nn.Module
    inputs: Callable[[int], dict[str, Any]] = lambda batch: {}
    frozen: list[int] | list[list[int]] = field(default_factory=list)
    graphable: bool = False

    def frozen_of(self, i: int) -> list[int]:
        """The frozen positions of params[i]."""
        return list(self.frozen[i]) if self.frozen and isinstance(self.frozen[0], list) else list(self.frozen)


def training_steps(steps: int, passes: int, n_sequences: int, batch_size: int) -> int:
    """Steps of training on a data stage of n sequences: `steps`, or more where `passes` passes over the sequences
    need more; none when steps = 0 or there is nothing to learn."""
    return max(steps, -(-passes * n_sequences // batch_size)) if steps and n_sequences else 0


def plateau(losses: list[float], window: int, min_improvement: float) -> bool:
    """The mean loss of the last `window` steps is not `min_improvement` (relative) below the window's before."""
    if len(losses) < 2 * window:
        return False
    recent, before = sum(losses[-window:]) / window, sum(losses[-2 * window: -window]) / window
    return recent > (1.0 - min_improvement) * before


def _finite(flat: list[torch.Tensor]) -> torch.Tensor:
    """One device-side flag: every trained tensor finite (one host sync to read)."""
    return torch.stack([torch.isfinite(t).all() for t in flat]).all()


class _Steps:
    """One optimizer step per call, (loss, whether the trained tensors are still finite). With `length`, every batch
    is padded to that many tokens (causal attention and the loss mask make padding inert: fixed shapes), and with
    `capture` (a CUDA device) the step's forward, backward and AdamW update are captured once as a CUDA graph and
    replayed: a 135M model's step is a few thousand small kernels, launch-bound on a GPU. The first `warmup` steps
    run eagerly on a side stream (they warm up autograd, the optimizer's state and cuBLAS, as capture requires)."""

    warmup = 1

    def __init__(self, forward, optimizer, params, argmax_weight: float, length: int | None = None, capture: bool = False,
                 tail: bool = False):
        self.forward, self.optimizer, self.params, self.argmax_weight = forward, optimizer, params, argmax_weight
        self.tail = tail
        self.length, self.capture = length, capture
        self.static: dict[str, torch.Tensor] | None = None
        self.graph, self.calls = None, 0
        self.stream = torch.cuda.Stream() if capture else None

    def _step(self, tensors):
        self.optimizer.zero_grad(set_to_none=True)
        loss = distillation_loss(self.forward(tensors["tokens"]), tensors, self.argmax_weight, self.tail)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), _finite(self.params)

    def reset(self) -> None:
        """After a rollback (a new learning rate): capture again on the next call."""
        self.graph, self.calls = None, 0

    def __call__(self, batch) -> tuple[float, bool]:
        tensors = distillation_batch(batch, self.length)
        if self.length is None:
            loss, finite = self._step(tensors)
            return loss.item(), bool(finite)
        if self.static is None:
            self.static = tensors
        else:
            for name, tensor in tensors.items():
                self.static[name].copy_(tensor)
        self.calls += 1
        if not self.capture or self.calls <= self.warmup:
            with torch.cuda.stream(self.stream) if self.capture else contextlib.nullcontext():
                if self.capture:
                    self.stream.wait_stream(torch.cuda.current_stream())
                loss, finite = self._step(self.static)
            if self.capture:
                torch.cuda.current_stream().wait_stream(self.stream)
            return loss.item(), bool(finite)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.loss, self.finite = self._step(self.static)
        self.graph.replay()
        return self.loss.item(), bool(self.finite)


@torch.enable_grad()  # trains even when the caller runs under torch.no_grad()
def train(student: Student, sequences: list, options: TrainOptions, generator: torch.Generator, *, total: int,
          desc: str = "distill", progress: bool = True, speed: Speed = Speed()) -> dict[str, Any]:
    """`total` steps of AdamW on `student.params` over `sequences` in seeded batches (every sequence once per pass,
    in a random order from `generator`), under `options.autocast`. It stops early when the mean loss of a window (at
    least one pass, and `options.patience` steps) stops falling by `options.min_improvement` (plateau); the
    divergence guard (Rollback, windows of `patience` steps) brings back the lowest window's tensors at half the rate where the loss blows up or a tensor
    turns non-finite. Returns the history (`loss`: the objective per step, distillation_loss; with top-k targets it is not
    a KL and goes below 0 where the student puts more mass on the teacher's top k than the teacher does; steps,
    stopped_early, cuda_graph, rollbacks)."""
    params, module = student.params, student.module
    device = params[0].device
    graphed = speed.cuda_graph and device.type == "cuda" and student.graphable
    flags = [p.requires_grad for p in module.parameters()]
    trained = {id(p) for p in params}
    for p in module.parameters():
        p.requires_grad_(id(p) in trained)
    for p in params:
        p.requires_grad_(True)
    for i, t in enumerate(params):  # the attention sink(s): their gradient is dropped
        if frozen := student.frozen_of(i):
            still = torch.zeros(t.shape[2], 1, dtype=torch.bool, device=device)
            still[frozen] = True
            t.register_hook(lambda grad, still=still: grad.masked_fill(still, 0.0))
    dtype = None if options.autocast == "none" else parse_dtype(options.autocast)
    casts = frozen_casts(module, dtype, enabled=speed.cast_once) if dtype is not None else {}

    def forward(tokens: torch.Tensor) -> torch.Tensor:
        inputs = student.inputs(tokens.shape[0])
        if casts:
            return functional_call(module, casts, (tokens,), inputs, tie_weights=False, strict=False)
        return module(tokens, **inputs)

    optimizer = torch.optim.AdamW(params, lr=options.learning_rate, weight_decay=0.0, capturable=graphed)
    length = max(item[0].shape[0] for item in sequences) if graphed or speed.fixed_shapes else None
    steps = _Steps(forward, optimizer, params, options.argmax_weight, length, capture=graphed, tail=options.tail)
    window = max(options.patience, -(-len(sequences) // options.batch_size))  # the plateau's: at least one pass
    guard = Rollback(params, optimizer, options.patience)  # `patience` steps: blow-ups in the first pass too
    losses, order, stopped_early = [], [], False
    bar = tqdm(total=total, desc=desc, unit="step", disable=not progress, leave=False)
    autocast = resolve_runtime(device, options.autocast).autocast() if dtype is not None else contextlib.nullcontext()
    try:
        with autocast:
            for _ in range(total):
                for group in optimizer.param_groups:  # a captured step keeps the rate it was captured with
                    group["lr"] = options.learning_rate * guard.scale
                if len(order) < options.batch_size:
                    order += torch.randperm(len(sequences), generator=generator).tolist()
                picked, order = order[: options.batch_size], order[options.batch_size:]
                loss, finite = steps([sequences[i] for i in picked])
                losses.append(loss)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")  # the objective (top-k: may go below 0), not a KL
                if not finite and not guard.rollback(losses):
                    raise FloatingPointError(f"{desc}: the trained tensors became non-finite; lower the learning rate")
                if not finite or guard.update(losses):  # rolled back: a graph is captured again at the new rate
                    steps.reset()
                    continue
                if plateau(losses[guard.start:], window, options.min_improvement):  # windows since the last rollback
                    stopped_early = True
                    break
        guard.finish(losses)
    finally:
        bar.close()
        for p, flag in zip(module.parameters(), flags):
            p.requires_grad_(flag)
        for p in params:
            p.requires_grad_(False)
    return {"loss": losses, "steps": len(losses), "stopped_early": stopped_early, "cuda_graph": graphed,
            **guard.record()}


class Rollback:
    """The divergence guard of the training loop. After each step it takes the mean loss of the last `window`
    steps; at each new lowest mean it snapshots the trained tensors and the optimizer's state (in place copies: a
    captured CUDA graph keeps its tensors). Where a later mean is more than `factor` times the lowest and `margin`
    nats above it, training has diverged (lr 0.1 on a 1,000-token document's stage: KL from 0.3 to 6 after 110
    steps): the snapshot comes back and the learning rate halves (`scale`), at most `max_rollbacks` times; after that,
    and when training ends diverged, the snapshot is what training returns (`finish`). A run that never diverges is
    untouched: the guard only copies."""

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer, window: int,
                 factor: float = 2.0, margin: float = 0.25, max_rollbacks: int = 3):
        self.params, self.optimizer, self.window = params, optimizer, max(1, int(window))
        self.factor, self.margin, self.max_rollbacks = factor, margin, max_rollbacks
        self.best, self.rollbacks, self.scale, self.start = math.inf, 0, 1.0, 0
        self.snapshot: list[torch.Tensor] | None = None
        self.state: list[dict[str, Any]] = []

    def _mean(self, losses: list[float]) -> float | None:
        if len(losses) - self.start < self.window:  # windows never reach back past a rollback
            return None
        return sum(losses[-self.window:]) / self.window

    def _diverged(self, mean: float) -> bool:
        return self.snapshot is not None and mean > self.factor * self.best and mean - self.best > self.margin

    @torch.no_grad()
    def _save(self) -> None:
        if self.snapshot is None:
            self.snapshot = [p.detach().clone() for p in self.params]
            self.state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in self.optimizer.state[p].items()}
                          for p in self.params]
            return
        for saved, p in zip(self.snapshot, self.params):
            saved.copy_(p)
        for saved, p in zip(self.state, self.params):
            for k, v in self.optimizer.state[p].items():
                if torch.is_tensor(v):
                    saved[k].copy_(v)
                else:
                    saved[k] = v

    @torch.no_grad()
    def _restore(self) -> None:
        for saved, p in zip(self.snapshot, self.params):
            p.copy_(saved)
        for saved, p in zip(self.state, self.params):
            for k, v in saved.items():
                if torch.is_tensor(v):
                    self.optimizer.state[p][k].copy_(v)
                else:
                    self.optimizer.state[p][k] = v

    def update(self, losses: list[float]) -> bool:
        """Call after each step with every loss so far; True when it rolled back."""
        mean = self._mean(losses)
        if mean is None:
            return False
        if mean < self.best:
            self.best = mean
            self._save()
            return False
        return self.rollback(losses) if self._diverged(mean) else False

    def rollback(self, losses: list[float]) -> bool:
        """Restore the snapshot and halve the rate now; False where there is no snapshot or the rollbacks are spent."""
        if self.snapshot is None or self.rollbacks >= self.max_rollbacks:
            return False
        self._restore()
        self.rollbacks += 1
        self.scale *= 0.5
        self.start = len(losses)
        return True

    def finish(self, losses: list[float]) -> bool:
        """At the end: True (and the snapshot restored) where the last window since the last rollback is diverged."""
        recent = losses[max(self.start, len(losses) - self.window):]
        if recent and self._diverged(sum(recent) / len(recent)):
            self._restore()
            return True
        return False

    def record(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks, "best_window_loss": None if math.isinf(self.best) else self.best}


# ----------------------------------------------------------------------------- the method


class Distiller(AbsorbMethod):
    """A distillation method: the data stage, then `train` on what `student` returns, then `adapted`. Subclasses set
    `Options` (TrainOptions with their defaults and fields) and implement `prepare` (checks that need the model and prompt), `student` and `adapted`; `compose` joins several
    absorbs (`join`) and, with compose_steps, trains the join on the union of their data stages."""

    takes_codec = True  # with the tokenizer the data stage also writes questions and chat turns
    recorded: tuple[str, ...] = ()  # keys of `prepare`'s dict the absorb's history keeps (kv-prefix: the start taken)

    def __init__(self, *, speed: "Speed | None" = None, writer=None, **options):
        """The method's options (AbsorbMethod's one constructor), and what only a distiller takes: `speed`, its
        speed switches (Speed), never results; `writer`, (model, tokenizer) that writes the data stage's questions and
        messages (None: the model being adapted)."""
        if speed is not None and not isinstance(speed, Speed):  # not an option: from --set, a mistyped name
            raise ValueError(f"{self.name}: unknown option 'speed'; options: "
                             f"{', '.join(f.name for f in dataclasses.fields(self.Options))}")
        if writer is not None and not (isinstance(writer, tuple) and len(writer) == 2 and hasattr(writer[1], "encode")):
            raise ValueError(f"{self.name}: writer must be a (model, tokenizer) pair, got {type(writer).__name__}")
        self.speed, self.writer = speed or Speed(), writer
        super().__init__(**options)

    @property
    def needs_train_groups(self) -> bool:
        return bool(self.options.study.wording_ensemble)

    def prepare(self, model, prompt: torch.Tensor, codec) -> dict[str, Any]:
        """Checks before the data stage; returns what `student` needs (e.g. kv-prefix's p and the codec its press
        start reads)."""
        return {}

    def student(self, model, prompt: torch.Tensor, generator: torch.Generator, sequences: list, **prepared) -> Student:
        raise NotImplementedError

    def adapted(self, model, student: Student) -> AdaptedModel:
        raise NotImplementedError

    def _absorb(self, model, given) -> AdaptedModel:
        prompt, queries, codec = given.prompt[0].long(), given.train_queries or [], given.codec  # checked by absorb
        o = self.options
        if o.keep_start and not o.heldout:  # before prepare's work (kv-prefix's press start)
            raise ValueError(f"{self.name}: keep_start compares the held-out KL before and after training; "
                             "it needs heldout > 0")
        prepared = self.prepare(model, prompt, codec)
        if o.autocast != "none" and o.steps:  # a device without the dtype fails now, not after the data stage
            resolve_runtime(device_of(model), o.autocast)
        generator = torch.Generator().manual_seed(o.seed)
        start = time.perf_counter()
        with tf32_matmuls(self.speed.tf32, prompt.device):
            was_training = model.training
            model.eval()
            try:
                sequences, counts = study(model, prompt, queries, o.study, codec, generator, seed=o.seed,
                                          groups=given.train_groups, static_decode=self.speed.static_decode,
                                          writer=self.writer)
                student = self.student(model, prompt, generator, sequences, **prepared)
                total = training_steps(o.steps, o.passes, len(sequences), o.batch_size)
                # the held-out batch: its own generator, so training's draws are those of a run without it
                held = heldout_sequences(model, prompt, o.study, torch.Generator().manual_seed(o.seed + 1),
                                         o.heldout) if total and o.heldout else []
                before = heldout_kl(student, held)
                saved = [t.detach().clone() for t in student.params] if held and o.keep_start else None
            finally:
                model.train(was_training)
            teacher_seconds = time.perf_counter() - start
            history = self._train(student, sequences, generator, total) if total else {"loss": [], "steps": 0}
            if held:
                after = heldout_kl(student, held)
                history["heldout_kl"] = {"before": before, "after": after, "sequences": len(held),
                                         "positions": sum(item[1].shape[0] for item in held)}
                if saved is not None:  # keep_start: training that raised the held-out KL is undone
                    history["kept_start"] = undo = after > before
                    if undo:
                        with torch.no_grad():
                            for t, first in zip(student.params, saved):
                                t.copy_(first)
        adapted = self.adapted(model, student)
        adapted.sequences = sequences  # the data stage, for compose_steps (in memory only: never saved)
        counts = dict(counts)
        derived = counts.pop("derived_queries", None)  # texts, not a count (an older cached stage has none)
        history.update({key: prepared[key] for key in self.recorded if key in prepared})  # e.g. kv-prefix's init
        adapted.history = {**history, "pool": counts, "derived_queries": derived, "teacher_seconds": teacher_seconds,
                           "train_seconds": time.perf_counter() - start - teacher_seconds}
        return adapted.eval()

    def _train(self, student: Student, sequences: list, generator: torch.Generator, total: int) -> dict[str, Any]:
        return train(student, sequences, self.options, generator, total=total, desc=self.name, progress=self.progress,
                     speed=self.speed)

    def join(self, adapted: list) -> AdaptedModel:
        raise NotImplementedError

    def join_student(self, joined: AdaptedModel, adapted: list) -> tuple[Student, Callable[[Student], AdaptedModel]]:
        raise NotImplementedError

    def compose(self, adapted: list) -> AdaptedModel:
        """Documents absorbed one by one, answered together (`join`). With `compose_steps`, the join is then trained
        that many steps on the union of the documents' data stages, each sequence against its own document's teacher:
        an absorb trained alone never met another document's. It needs each absorb's data stage, which an absorb
        keeps in memory (`sequences`), not in its saved folder."""
        joined = self.join(adapted)
        if not self.options.compose_steps:
            return joined
        if any(getattr(a, "sequences", None) is None for a in adapted):
            raise ValueError(f"{self.name}: compose_steps trains on each absorb's data stage; one loaded from a folder "
                             "has none (absorb the documents in this process, or set compose_steps=0)")
        sequences = [item for a in adapted for item in a.sequences]
        student, finish = self.join_student(joined, adapted)
        with tf32_matmuls(self.speed.tf32, device_of(joined.base)):
            history = self._train(student, sequences, torch.Generator().manual_seed(self.options.seed),
                                  self.options.compose_steps)
        out = finish(student)
        out.history = {"compose": history}
        return out.eval()


def distiller_args(name: str, speed: Speed | None = None, writer=None) -> dict[str, Any]:
    """speed= and writer= for method `name` where it is a distiller (they go to the distillers alone), else {}: what
    the harness and `incontext absorb` add to get_absorb_method's options."""
    return {"speed": speed, "writer": writer} if issubclass(method_class(name), Distiller) else {}
