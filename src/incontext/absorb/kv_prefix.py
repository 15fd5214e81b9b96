"""A trained KV prefix (Cartridges, Eyuboglu et al. 2025): p key and value vectors per layer and K/V head,
prepended to every query's attention, trained by self-study so the model with the prefix answers as the model
with the whole document in its context. The base model stays frozen.

    adapted = get_absorb_method("kv-prefix", prefix_tokens=32).absorb(model, prompt, codec=tokenizer)
    logits = adapted(query)               # the query attends to the prefix (positions p, p+1, ...)

- initialisation (`init`): the K/V of the document's first p tokens ("document", Cartridges' best), p of the
  document's K/V pairs spread evenly over it, keys re-rotated to the prefix's positions ("document-spread"; ours),
  of p random tokens ("random-tokens") or random vectors with the document K/V's per-layer scale ("random-vectors");
- the first prefix position stays frozen (`freeze_first`): the attention sink (Gemma's BOS where the model reads one);
- training sequences and the teacher's next-token distributions come from the data stage (absorb/self_study.py),
  the loss is KL(teacher || student) over the taught positions, AdamW on the prefix alone;
- written once against the causal-LM protocol: the prefix is a cache of either backend (our K/V tuples or
  transformers' DynamicCache layers), so it runs on our Transformer and on any Hugging Face family; on transformers
  it is an ordinary `past_key_values` (interop.hf_backend.prefix_cache);
- on a CUDA device the training step is captured once as a CUDA graph and replayed (_FixedShapeSteps; the step of a
  small model is launch-bound there); saved, the adapted model holds the prefix alone (`saves_base = False`).

With p = M and init "document" and no training steps the prefix is the document's own K/V: keep-prompt exactly.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from typing import Any, Literal

import torch
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from ..config import limit
from ..models import Cache
from ..models.lm import cache_kv, copy_cache, is_causal_lm, with_kv
from ..ops import apply_rope, rope_cos_sin
from ..runtime import device_of, frozen_casts, parse_dtype, resolve_runtime, tf32_matmuls
from .base import AbsorbMethod, AdaptedModel
from .distill_lora import DataStageOptions, Rollback, _plateau, composition_trainer, pass_patience, training_steps
from .self_study import (StudyOptions, chunk_spans, distillation_batch, distillation_kl, distillation_loss,
                         next_token_loss, study)


class TrainedPrefix(AdaptedModel):
    """The base with a trained K/V prefix of `position` tokens: forward(query) attends to it first."""

    method = "kv-prefix"
    saves_base = False  # the prefix alone (kept bytes), not the frozen base it was trained against

    def __init__(self, base: nn.Module, state: Cache):
        super().__init__(base)
        kv = cache_kv(state)
        for i, (k, v) in enumerate(kv):
            self.register_buffer(f"prefix_k_{i}", k.detach().clone())
            self.register_buffer(f"prefix_v_{i}", v.detach().clone())
        self.n_prefix_layers = len(kv)
        self.position = state.position
        self._template = with_kv(state, self._tensors())  # the layers' bookkeeping (sliding windows' counts)
        self.history: dict[str, Any] = {}

    def _tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(getattr(self, f"prefix_k_{i}"), getattr(self, f"prefix_v_{i}")) for i in range(self.n_prefix_layers)]

    def state(self) -> Cache:
        return with_kv(self._template, self._tensors())

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.state())

    def query_cache(self) -> Cache:
        return copy_cache(self.state())

    def extra_state(self) -> dict[str, Any]:
        return {"position": self.position, "shapes": [list(k.shape) for k, _ in self._tensors()],
                "value_shapes": [list(v.shape) for _, v in self._tensors()]}

    @classmethod
    def empty(cls, base, extra):
        """Buffers of the saved shapes in a cache of the base's own kind (a prefill of `position` tokens gives the
        layers' types and bookkeeping; its values are replaced on load)."""
        device = next(base.parameters()).device
        with torch.no_grad():
            template = base.prefill(torch.zeros(1, extra["position"], dtype=torch.long, device=device))
        kv = cache_kv(template)
        if [list(k.shape) for k, _ in kv] != extra["shapes"]:
            raise ValueError(f"the saved prefix has shapes {extra['shapes']}; this base model makes "
                             f"{[list(k.shape) for k, _ in kv]}")
        return cls(base, template)


@dataclass
class KVPrefixOptions(DataStageOptions):
    prefix_tokens: int | None = limit(None, min=1)
    init: Literal["document", "document-spread", "document-attended", "random-tokens", "random-vectors"] = "document"
    freeze_first: bool = True
    steps: int = limit(96, min=0)
    passes: int = limit(8, min=0)
    learning_rate: float = limit(0.05, gt=0)
    batch_size: int = limit(4, min=1)
    patience: int = limit(16, min=1)
    min_improvement: float = limit(0.01, min=0, lt=1)
    seed: int = limit(0, min=0)
    progress: bool = True
    top_k: int | None = limit(20, min=1)
    data_cache: str = ""
    objective: Literal["kl", "next-token"] = "kl"  # KL(teacher || student) on the teacher's targets, or the sequences' own next tokens
    argmax_weight: float = limit(0.0, min=0)  # with the KL: plus this times the cross-entropy of the teacher's top token
    cuda_graph: bool = True
    tf32: bool = False
    autocast: Literal["none", "bfloat16", "float16"] = "bfloat16"  # training's matmul dtype under torch.autocast ("none": the model's own)
    schedule: Literal["constant", "cosine"] = "constant"  # the rate over the steps: fixed, or decayed to 0 along half a cosine
    compose_steps: int = limit(0, min=0)

    def __post_init__(self):
        super().__post_init__()
        if self.argmax_weight and self.objective != "kl":
            raise ValueError(f"argmax_weight adds to the KL objective; objective={self.objective!r} takes none")


class KVPrefix(AbsorbMethod):
    """Self-study into a trained KV prefix (see the module docstring). Options: prefix_tokens (p; default a quarter
    of the document, Cartridges' memory budget for this comparison), init ("document-spread" is the better start for
    a long document: on 1,035-token `facts` documents at p = 100, 5 of keep-prompt's 9 validation answers and 4 of 10
    test answers against 4 and 3 from the first tokens, and a tie, 2 and 2, on a second validation document, where its
    KL was lower; on 2-person documents it tied; "document-attended": per layer, the p positions the training queries
    attend to most, attended_prefix),
    freeze_first, steps and passes (training runs max(steps, passes * sequences / batch_size) steps: at the defaults 96
    for a 160-token document's ~30 sequences, about 580 for a 1,000-token one's ~190), learning_rate, batch_size,
    patience / min_improvement (early stop on a KL plateau, over windows of at least one pass; windows
    of `patience` steps drive the divergence guard, distill_lora.Rollback: a blown-up KL or a non-finite prefix goes
    back to the snapshot of the lowest window at half the rate), seed,
    progress, top_k (the teacher's top-k log-probs per position; None: all), data_cache (a folder where the data
    stage is stored and reused when model, document and settings match), n_conversations (self-study messages the
    model writes from the seed prompts `seed_prompts`, up to `message_tokens` each, answered by the teacher), and
    the data stage's other options (window_tokens, n_continuations, continuation_tokens, answer_tokens,
    n_questions, contrast, chat_answer_tokens, temperature; n_foreign: that many training queries asked again about
    invented names the document does not hold, answered by the teacher, so the prefix's facts stay with its own
    people when it is composed beside another document's; chunk_tokens: the teacher reads the document in chunks of
    that many tokens, self_study.chunk_spans; 0, the default: whole where the model's context holds it, else in
    chunks of half the context, so a document longer than the context is absorbed too, with p at most a quarter of
    the context by default; at ~1,000 tokens a chunk's reader answers fewer facts than the whole document's,
    benchmarks/results/chunked_teacher_facts_long.json; wording_ensemble: the wordings of one training question, as the
    task groups them (absorb's train_groups), taught one target, the teacher's log-probabilities averaged over them
    along their consensus answer, self_study.wording_ensemble). Defaults chosen on 4 validation episodes of `facts`
    (seed 10000, never the test episodes): n_questions=0 (the base model's own questions lowered the score, 14.3% vs
    17.9%, and raised the KL, 0.91 vs 0.73 nats; results/kv-prefix-validation), then steps=96, patience=16 and
    learning_rate=0.1 (21.4% and KL 0.55 against 17.9% and 0.73 at 48 steps and 2e-2, and 21.4% and 0.66 at 5e-2;
    results/kv-prefix-validation-sweep), which double the absorb time; those validation episodes carried training
    questions. For the document alone (6 validation episodes, no training question: results/document-alone-validation)
    passes=8, learning_rate=0.05 and autocast=bfloat16 gave 11.9% against the earlier defaults' 7.1% (KL 0.93 vs 1.10)
    at a quarter of the absorb time, and are the defaults since. objective: "kl" (the teacher's distributions) or
    "next-token" (the sequences' own next tokens; Cartridges' ablation); argmax_weight w > 0: with the KL, plus w times
    the cross-entropy of the teacher's most likely token at each taught position (what a greedy answer reads;
    self_study.distillation_loss). cuda_graph: on a CUDA device, the KL training
    step is captured once as a CUDA graph and replayed (every batch padded to the longest sequence; false: eager).
    tf32: on a CUDA device, the absorb's float32 matmuls (data stage and training) in TF32 (runtime.tf32_matmuls).
    autocast: "bfloat16" or "float16": training's forward and backward under torch.autocast in that dtype (its matmuls
    in half precision; the prefix, the optimizer and the teacher's targets stay float32); on a CPU with bf16
    instructions a training step costs about 0.7 of float32's (benchmarks/results/absorb_cost_autocast_cpu.md).
    schedule: "constant" or "cosine" (the rate decayed to 0 over the steps; on the validation episodes it lost to the
    constant rate, KL 0.61 vs 0.55 at 96 steps, and tied it at 48, 0.67 vs 0.66: results/kv-prefix-validation-schedule;
    a cosine schedule trains eagerly). compose_steps: `compose` trains the concatenated prefixes that many steps on
    both documents' data stages (0: the plain concatenation; on validation episodes 192 steps brought each document's
    composed recall from about a third of its recall alone to all of it: results/kv-prefix-validation-compose-steps)."""

    name = "kv-prefix"
    Options = KVPrefixOptions
    long_prompts = True  # a document longer than the context: the data stage reads it in chunks
    takes_codec = True  # with the tokenizer the data stage also writes questions about the document (and chat turns)
    needs = "a token-input causal LM with softmax attention"
    summary = "self-study into a trained K/V prefix of prefix_tokens=P vectors per layer (Cartridges)"

    def __init__(self, **options):
        """`options`: the fields of KVPrefixOptions (their defaults where not given), checked there."""
        self._set_options(options)
        self.stage = StudyOptions(**{name: getattr(self, name) for name in StudyOptions.__dataclass_fields__})

    def compose(self, adapted: list[TrainedPrefix]) -> TrainedPrefix:
        """Documents absorbed one by one, answered together: their prefixes concatenated (compose_prefixes). With
        `compose_steps`, the concatenation is then trained for that many steps on the union of the documents' data
        stages, each sequence against its own document's teacher (every document's first position frozen): a prefix
        trained alone never met another document's before it. It needs each prefix's data stage, which an absorb
        keeps in memory (`sequences`), not in its saved folder."""
        composed = compose_prefixes(*adapted)
        if not self.compose_steps:
            return composed
        trainer, sequences = composition_trainer(self, adapted, "prefix")
        frozen = list(accumulate((a.position for a in adapted[:-1]), initial=0))  # each document's first position
        with tf32_matmuls(self.tf32, device_of(composed.base)):
            history = trainer._train(composed.base, composed.state(), sequences, torch.Generator().manual_seed(self.seed),
                                     frozen=frozen if self.freeze_first else [])
        out = TrainedPrefix(composed.base, with_kv(composed.state(), history.pop("kv")))
        out.history = {"compose": history}
        return out.eval()

    def learns_nothing(self) -> str | None:
        """steps=0 keeps the initial prefix: the document's own K/V (or chosen positions of it) is a result, random
        K/V (init=random-*) holds nothing of the document."""
        if self.steps == 0 and self.init.startswith("random"):
            return (f"steps=0 trains nothing: with init={self.init} the prefix stays random and holds nothing of the "
                    "prompt (give steps >= 1, or an init from the document)")
        return None

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or not model.config.tokens:
            return "needs a token-input causal LM"
        if getattr(model.config, "attention", "softmax") != "softmax":
            return "needs softmax attention (a linear-attention state is no K/V prefix; iclca converts it exactly)"
        return None

    def _absorb(self, model, prompt, loss_mask, train_queries, codec=None, train_groups=None) -> TrainedPrefix:
        prompt = prompt[0].long()
        m, limit = prompt.shape[0], model.config.max_seq_len
        # default p: a quarter of the document; of the context for a document the context does not hold
        p = self.prefix_tokens if self.prefix_tokens is not None else max(1, min(m, limit or m) // 4)
        chunk_spans(m, self.chunk_tokens, limit)  # a chunk the context cannot hold fails now, not in the data stage
        if self.init.startswith("document") and p > m:
            raise ValueError(f"kv-prefix: prefix_tokens={p} exceeds the document's {m} tokens (init={self.init})")
        if self.init in ("document-spread", "document-attended") and (getattr(model, "backend", None) != "incontext"
                                                                     or model.config.positions != "rope"):
            raise ValueError(f"kv-prefix: init={self.init} re-rotates RoPE keys: it needs our Transformer with RoPE "
                             "(use init=document)")
        if self.init == "document-attended" and len(chunk_spans(m, self.chunk_tokens, limit)) > 1:
            raise ValueError("kv-prefix: init=document-attended reads the whole document's attention: it needs a document "
                             "the context holds, without chunk_tokens (use init=document-spread)")
        if limit is not None and p >= limit:
            raise ValueError(f"kv-prefix: prefix_tokens={p} leaves no room for queries within the context ({limit})")
        with tf32_matmuls(self.tf32, prompt.device):
            return self._absorb_document(model, prompt, p, train_queries, codec, train_groups)

    def _absorb_document(self, model, prompt, p: int, train_queries, codec, train_groups=None) -> TrainedPrefix:
        if self.autocast != "none" and self.steps:  # a device without the dtype fails now, not after the data stage
            resolve_runtime(device_of(model), self.autocast)
        queries = [q[0] if q.dim() == 2 else q for q in (train_queries or [])]
        generator = torch.Generator().manual_seed(self.seed)
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            sequences, counts = study(model, prompt, queries, self.stage, codec, generator, top_k=self.top_k,
                                      cache_dir=self.data_cache or None, seed=self.seed, groups=train_groups)
            template = self._initial(model, prompt, p, generator, queries or [item[0] for item in sequences])
        finally:
            model.train(was_training)
        context, longest = model.config.max_seq_len, max((item[0].shape[0] for item in sequences), default=0)
        if context is not None and p + longest > context:  # `limit` is config's field helper here
            raise ValueError(f"kv-prefix: prefix_tokens={p} and the data stage's sequences of up to {longest} tokens exceed "
                             f"the context ({context}); lower prefix_tokens or chunk_tokens")
        teacher_seconds = time.perf_counter() - start
        history = self._train(model, template, sequences, generator) if self.steps and sequences else {"kl": [], "steps": 0}
        adapted = TrainedPrefix(model, with_kv(template, history.pop("kv", cache_kv(template))))
        adapted.sequences = sequences  # the data stage, for compose_steps (in memory only: never saved)
        start_scale = max(float(t.abs().max()) for pair in cache_kv(template) for t in pair)
        adapted.initial_scales = {name: start_scale for name, _ in adapted.named_buffers(recurse=False)}
        adapted.history = {**history, "pool": counts, "teacher_seconds": teacher_seconds,
                           "train_seconds": time.perf_counter() - start - teacher_seconds}
        return adapted.eval()

    @torch.no_grad()
    def _initial(self, model, prompt: torch.Tensor, p: int, generator: torch.Generator, observations) -> Cache:
        if self.init == "document":
            return model.prefill(prompt[None, :p])
        if self.init == "document-attended":
            return attended_prefix(model, prompt, p, observations)
        if self.init == "document-spread":
            return spread_prefix(model, prompt, p, chunk_spans(prompt.shape[0], self.chunk_tokens, model.config.max_seq_len))
        if self.init == "random-tokens":
            ids = torch.randint(0, model.config.vocab_size, (1, p), generator=generator).to(prompt.device)
            return model.prefill(ids)
        document = model.prefill(prompt[None, : min(p, prompt.shape[0])])  # scale per layer; shapes from p tokens
        shaped = model.prefill(prompt.new_zeros(1, p))
        kv = []
        for (k, v), (dk, dv) in zip(cache_kv(shaped), cache_kv(document)):
            noise = [torch.randn(t.shape, generator=generator, dtype=torch.float32).to(t) for t in (k, v)]
            kv.append((noise[0] * dk.float().std().to(k.dtype), noise[1] * dv.float().std().to(v.dtype)))
        return with_kv(shaped, kv)

    @torch.enable_grad()
    def _train(self, model, template: Cache, sequences, generator, frozen: list[int] | None = None) -> dict[str, Any]:

        # float32 master copies for a half-precision model (bf16 rounds away Adam's late, small steps); the student
        # reads them in the model's dtype
        kv_dtype = cache_kv(template)[0][0].dtype
        master = torch.promote_types(kv_dtype, torch.float32)
        params = [(nn.Parameter(k.detach().to(master, copy=True)), nn.Parameter(v.detach().to(master, copy=True)))
                  for k, v in cache_kv(template)]
        flat = [t for pair in params for t in pair]
        frozen = ([0] if self.freeze_first else []) if frozen is None else frozen
        if frozen:  # the attention sink(s): their gradient is dropped
            still = torch.zeros(flat[0].shape[2], 1, dtype=torch.bool, device=flat[0].device)
            still[frozen] = True
            for t in flat:
                t.register_hook(lambda grad: grad.masked_fill(still, 0.0))
        flags = [q.requires_grad for q in model.parameters()]
        model.requires_grad_(False)  # the base stays frozen: no gradients into its weights
        fixed = self._graphed(model, flat[0].device)
        graphed = fixed and flat[0].device.type == "cuda"
        optimizer = torch.optim.AdamW(flat, lr=self.learning_rate, weight_decay=0.0, capturable=graphed)
        losses, order, stopped_early = [], [], False
        patience = pass_patience(self.patience, len(sequences), self.batch_size)
        total = self.total_steps(len(sequences))
        bar = tqdm(total=total, desc="kv-prefix", unit="step", disable=not self.progress, leave=False)

        # under autocast, the frozen weights' half-precision casts made once, not at every step (the same numbers)
        casts = frozen_casts(model, parse_dtype(self.autocast)) if self.autocast != "none" else {}

        def student(tokens: torch.Tensor) -> torch.Tensor:
            batch = tokens.shape[0]
            cache = with_kv(template, [(k.to(kv_dtype).expand(batch, *k.shape[1:]), v.to(kv_dtype).expand(batch, *v.shape[1:]))
                                       for k, v in params])
            if casts:
                return functional_call(model, casts, (tokens,), {"cache": cache}, tie_weights=False, strict=False)
            return model(tokens, cache=cache)

        def batches():
            nonlocal order
            while True:
                if len(order) < self.batch_size:
                    order += torch.randperm(len(sequences), generator=generator).tolist()
                picked, order = order[: self.batch_size], order[self.batch_size:]
                yield [sequences[i] for i in picked]

        try:
            if fixed:
                steps = _FixedShapeSteps(student, optimizer, flat, sequences, capture=graphed, argmax_weight=self.argmax_weight)
            else:
                objective = partial(distillation_kl, argmax_weight=self.argmax_weight) if self.objective == "kl" else next_token_loss
                steps = _EagerSteps(student, optimizer, flat, objective)
            guard = Rollback(flat, optimizer, self.patience)  # `patience` steps, not a pass: blow-ups in the first pass too
            with self._autocast(flat[0].device):  # training's matmuls in half precision (option autocast)
                for step, batch in zip(range(total), batches()):
                    for group in optimizer.param_groups:  # a captured step keeps the constant rate it was captured with
                        group["lr"] = self.rate(step, total) * guard.scale
                    loss, finite = steps(batch)
                    losses.append(loss)
                    bar.update(1)
                    bar.set_postfix(kl=f"{losses[-1]:.4f}")
                    if not finite and not guard.rollback(losses):
                        raise FloatingPointError("kv-prefix: the prefix became non-finite; lower the learning rate")
                    if not finite or guard.update(losses):  # rolled back: the graph is captured again at the new rate
                        steps.reset()
                        continue
                    if _plateau(losses[guard.start:], patience, self.min_improvement):  # windows since the last rollback
                        stopped_early = True
                        break
                guard.finish(losses)
        finally:
            bar.close()
            for q, flag in zip(model.parameters(), flags):
                q.requires_grad_(flag)
        return {"kl": losses, "steps": len(losses), "stopped_early": stopped_early, "cuda_graph": graphed,
                **guard.record(), "kv": [(k.detach().to(kv_dtype), v.detach().to(kv_dtype)) for k, v in params]}

    def total_steps(self, n_sequences: int) -> int:
        """The training steps for a data stage of n sequences: `steps`, or more where `passes` passes over the
        sequences need more (a long document's stage holds hundreds); none when steps = 0."""
        return training_steps(self.steps, self.passes, n_sequences, self.batch_size)

    def rate(self, step: int, total: int | None = None) -> float:
        """The learning rate of step `step` (0-based) of `total` (default `steps`) under the schedule."""
        if self.schedule == "constant":
            return self.learning_rate
        return 0.5 * self.learning_rate * (1.0 + math.cos(math.pi * step / (total or self.steps)))

    def _autocast(self, device: torch.device):
        """torch.autocast in the `autocast` dtype on `device` (runtime.Runtime builds it; a one-line error where the
        device cannot compute in it), or nothing for "none"."""
        if self.autocast == "none":
            return contextlib.nullcontext()
        return resolve_runtime(device, self.autocast).autocast()

    def _graphed(self, model, device: torch.device) -> bool:
        """Whether training replays one captured CUDA graph per step (see _FixedShapeSteps): on a CUDA device, for the
        KL objective with a constant learning rate, on our Transformer (transformers' mask code reads tensors on the
        host, which capture forbids)."""
        return (self.cuda_graph and device.type == "cuda" and self.objective == "kl" and self.schedule == "constant"
                and model.backend == "incontext")


def rerotate(model, k: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """RoPE keys (B, H, S, D) moved by `shift` (S,) positions each: a key computed at position a becomes the key at
    a + shift (rotations compose, R(shift) R(a) = R(a + shift); our Transformer's RoPE)."""
    cos, sin = rope_cos_sin(shift, model.rope_dim, model.config.rope_theta, k.dtype)
    return apply_rope(k, cos, sin)


@torch.no_grad()
def spread_prefix(model, prompt: torch.Tensor, p: int, spans: list[tuple[int, int]] | None = None) -> Cache:
    """init=document-spread: p of the document's own K/V pairs, from positions spread evenly over the whole document
    (the first one always, the attention sink), computed with the whole document in context, each key re-rotated
    from its document position to its place in the prefix (0 .. p-1): a quarter of the document's cache that covers
    all of it, where `document` keeps its first quarter. At p = M it is the document's own cache (keep-prompt).
    With `spans` (the data stage's chunks, self_study.chunk_spans), each pair is computed with the chunk that holds
    its position most centrally in context, and re-rotated from its place in that chunk."""
    m = prompt.shape[0]
    spans = spans or [(0, m)]
    index = torch.linspace(0, m - 1, p, dtype=torch.float64).round().long().tolist()
    home = [max(range(len(spans)), key=lambda j: min(i - spans[j][0], spans[j][1] - 1 - i)
                if spans[j][0] <= i < spans[j][1] else -1) for i in index]
    parts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    order: list[int] = []
    for j, (a, b) in enumerate(spans):
        mine = [t for t, h in enumerate(home) if h == j]
        if not mine:
            continue
        order += mine
        local = torch.tensor([index[t] - a for t in mine], device=prompt.device)
        shift = torch.tensor(mine, device=prompt.device) - local
        parts.append([(rerotate(model, k[:, :, local], shift), v[:, :, local])
                      for k, v in cache_kv(model.prefill(prompt[None, a:b]))])
    back = torch.argsort(torch.tensor(order, device=prompt.device))  # into prefix order
    kv = [(torch.cat([part[layer][0] for part in parts], 2)[:, :, back], torch.cat([part[layer][1] for part in parts], 2)[:, :, back])
          for layer in range(len(parts[0]))]
    return Cache(layers=kv, position=p)  # our Transformer's layers are (k, v) pairs, nothing else to keep


@torch.no_grad()
def attended_prefix(model, prompt: torch.Tensor, p: int, observations: list[torch.Tensor]) -> Cache:
    """init=document-attended: in each layer, the p document positions that the `observations` (token sequences read
    after the document: the task's training queries, else the data stage's sequences) attend to most, their
    softmax attention summed over heads and tokens (attention_mass; the first position always, the attention sink),
    their own K/V in document order, each key re-rotated to its place in the prefix (0 .. p-1): SnapKV's selection
    (Li et al. 2024) as the start of training. At p = M it is the document's own cache (keep-prompt)."""
    m = prompt.shape[0]
    cache = model.prefill(prompt[None])
    mass = attention_mass(model, cache, m, observations)
    kv = []
    for layer, (k, v) in enumerate(cache_kv(cache)):
        score = mass[layer].clone()
        score[0] = math.inf
        index = score.topk(p).indices.sort().values.to(prompt.device)
        kv.append((rerotate(model, k[:, :, index], torch.arange(p, device=prompt.device) - index), v[:, :, index]))
    return Cache(layers=kv, position=p)


@torch.no_grad()
def attention_mass(model, cache: Cache, m: int, observations: list[torch.Tensor]) -> torch.Tensor:
    """(n_layer, m) float64: the softmax attention that the tokens of each observation sequence, read after the
    cached m-token document (each on its own copy of the cache), give each document position, summed over the
    query heads and the tokens (our Transformer's Attention.observe)."""
    c = model.config
    mass = torch.zeros(c.n_layer, m, dtype=torch.float64)
    scale = 1.0 / math.sqrt(c.dim_head) if c.scale_attn else 1.0

    def observer(layer: int):
        def observe(q, k):
            scores = q @ k.repeat_interleave(c.n_head // c.kv_heads, 1).transpose(-1, -2) * scale
            t, s = scores.shape[-2:]
            future = torch.arange(s, device=q.device)[None, :] > (s - t + torch.arange(t, device=q.device))[:, None]
            mass[layer] += scores.masked_fill(future, -math.inf).softmax(-1)[..., :m].sum((0, 1, 2)).double().cpu()
        return observe

    attentions = [block.attn for block in model.blocks]
    try:
        for layer, attention in enumerate(attentions):
            attention.observe = observer(layer)
        for ids in observations:
            model(ids[None], cache=copy_cache(cache, 1))
    finally:
        for attention in attentions:
            attention.observe = None
    return mass


def _finite(flat: list[torch.Tensor]) -> torch.Tensor:
    """One device-side flag: every prefix tensor finite (one host sync to read, not one per tensor)."""
    return torch.stack([torch.isfinite(t).all() for t in flat]).all()


class _EagerSteps:
    """One optimizer step per call, shapes following each batch: (loss, whether the prefix is still finite)."""

    def __init__(self, student, optimizer, flat, objective):
        self.student, self.optimizer, self.flat, self.objective = student, optimizer, flat, objective

    def __call__(self, batch) -> tuple[float, bool]:
        loss = self.objective(self.student, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item(), bool(_finite(self.flat))

    def reset(self) -> None:
        """After a rollback: nothing to do for eager steps."""


class _FixedShapeSteps:
    """The same steps with fixed shapes, every batch padded to the longest training sequence (causal attention and
    the loss mask make padding inert), and with `capture` (a CUDA device) the step's forward, backward and AdamW
    update captured once as a CUDA graph and replayed: a 135M model's step is a few thousand small kernels,
    launch-bound on a GPU. Capture: the first `warmup` steps run eagerly on a side stream (real steps: they warm up
    autograd, the optimizer's state and cuBLAS, as capture requires), the capture itself trains nothing, then each
    later step copies its batch into the graph's inputs and replays it. Without `capture` the fixed-shape step runs
    eagerly (how tests on a CPU check it against _EagerSteps)."""

    warmup = 1

    def __init__(self, student, optimizer, flat, sequences, capture: bool, argmax_weight: float = 0.0):
        self.student, self.optimizer, self.flat, self.argmax_weight = student, optimizer, flat, argmax_weight
        self.length = max(item[0].shape[0] for item in sequences)
        self.static: dict[str, torch.Tensor] | None = None
        self.graph, self.calls, self.capture = None, 0, capture
        self.stream = torch.cuda.Stream() if capture else None

    def _step(self):
        self.optimizer.zero_grad(set_to_none=True)
        loss = distillation_loss(self.student(self.static["tokens"]), self.static, self.argmax_weight)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), _finite(self.flat)

    def reset(self) -> None:
        """After a rollback (new learning rate): warm up and capture again on the next call."""
        self.graph, self.calls = None, 0

    def __call__(self, batch) -> tuple[float, bool]:
        tensors = distillation_batch(batch, self.length)
        if self.static is None:
            self.static = tensors
        else:
            for name, tensor in tensors.items():
                self.static[name].copy_(tensor)
        self.calls += 1
        if not self.capture:
            loss, finite = self._step()
            return loss.item(), bool(finite)
        if self.calls <= self.warmup:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                loss, finite = self._step()
            torch.cuda.current_stream().wait_stream(self.stream)
            return loss.item(), bool(finite)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.loss, self.finite = self._step()
        self.graph.replay()
        return self.loss.item(), bool(self.finite)


def compose_prefixes(*prefixes: TrainedPrefix) -> TrainedPrefix:
    """Several documents absorbed separately, answered together: their prefixes concatenated (Cartridges composes
    cartridges the same way, without retraining). Each prefix keeps the positions it was trained at; queries start
    after every position the prefixes hold: the sum of their lengths, and on a model that reads its BOS first the
    BOS each prefix holds after the first (as PEFT's compose_cartridge_adapters: interop/cartridge.py)."""
    if len(prefixes) < 2:
        raise ValueError("compose at least two prefixes")
    base = prefixes[0].base
    if any(p.base is not base for p in prefixes):
        raise ValueError("the prefixes were absorbed into different base models")
    states = [p.state() for p in prefixes]
    kvs = [cache_kv(state) for state in states]
    layers = []
    for i, layer in enumerate(states[0].layers):
        k, v = (torch.cat([kv[i][j] for kv in kvs], 2) for j in (0, 1))
        if hasattr(layer, "seen"):  # a layer that counts the tokens it has seen (transformers' sliding windows)
            layers.append(type(layer)(k, v, sum(state.layers[i].seen for state in states)))
        else:
            layers.append((k, v))
    bos = int(getattr(base, "bos_id", None) is not None)  # each prefix holds its BOS; `position` leaves out the first
    position = sum(state.position for state in states) + bos * (len(states) - 1)
    return TrainedPrefix(base, Cache(layers=layers, position=position)).eval()
