"""A trained KV prefix (Cartridges, Eyuboglu et al. 2025): p key and value vectors per layer and K/V head,
prepended to every query's attention, trained by self-study so the model with the prefix answers as the model
with the whole document in its context. The base model stays frozen.

    adapted = get_absorb_method("kv-prefix", prefix_tokens=32).absorb(model, prompt, codec=tokenizer)
    logits = adapted(query)               # the query attends to the prefix (positions p, p+1, ...)

- the start (`init`): the K/V of the document's first p tokens ("document", Cartridges' best), or p of the
  document's K/V pairs spread evenly over it, keys re-rotated to the prefix's positions ("document-spread"; ours,
  the better start for a long document);
- the first prefix position stays frozen: the attention sink (Cartridges' and peft's `num_frozen_tokens=1`);
- the data stage, the objective and the training loop are the pipeline's (absorb/distill.py); this module
  supplies the prefix as the trained tensors and the student that reads it as a cache;
- written once against the causal-LM protocol: the prefix is a cache of either backend (our K/V tuples or
  transformers' DynamicCache layers), so it runs on our Transformer and on any Hugging Face family; saved, the
  adapted model holds the prefix alone (`saves_base = False`).

With p = M and init "document" and no training steps the prefix is the document's own K/V: keep-prompt exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal

import torch
from torch import nn

from ....config import limit, option
from ....models import Cache
from ....models.lm import cache_kv, is_causal_lm, with_kv
from ....ops import apply_rope, rope_cos_sin
from ...distill import Distiller, Student, TrainOptions
from ...presses import CacheBuffers, empty_cache, press_cache, press_classes
from ...study import StudyOptions, chunk_spans


class TrainedPrefix(CacheBuffers):
    """The base with a trained K/V prefix: forward(query) attends to it first, the query at `position` on (the
    prefix's length; for a press start at its original positions, the document's length)."""

    method = "kv-prefix"
    prefix = "prefix"

    def __init__(self, base: nn.Module, state: Cache):
        super().__init__(base, state)
        self.history: dict[str, Any] = {}

    @classmethod
    def empty(cls, base, extra):
        """Buffers of the saved layout (presses.cache_layout, recorded by every save)."""
        if "masked" not in extra:
            raise ValueError("the saved prefix records no cache layout (an absorb folder of an older incontext): absorb "
                             "the document again")
        return cls(base, empty_cache(base, extra))


@dataclass
class KVPrefixStudy(StudyOptions):
    """kv-prefix's data stage: the recall windows and continuations, plus 16 queries derived from the document by
    rules (chosen on validation episodes of `facts` and `documents`, the document alone: docs/absorb-methods.md)."""

    derived: int = limit(16, min=0, help="queries derived from the document's text by rules (no writer model)")


@dataclass
class KVPrefixOptions(TrainOptions):
    prefix_tokens: int | None = limit(None, min=1, help="p, the prefix's length (default: a quarter of the document)")
    # the start: the first p tokens' K/V; p spread over all; a kvpress press's kept K/V at their own positions (queries
    # after the whole document); or those re-rotated to 0..p-1 (the PEFT CARTRIDGE layout)
    init: Literal["document", "document-spread", "press", "press-rerotated"] = "document"
    ratio: float | None = limit(None, gt=0, max=1, help=
        "p as a share of the document's tokens (when prefix_tokens is unset)")
    press: str = option("kvzip", "init=press / press-rerotated: the kvpress press whose kept K/V start the prefix")
    steps: int = limit(96, min=0, help="train at least this many steps (0: the start is the result)")
    passes: int = limit(8, min=0, help="and at least this many passes over the data stage")
    learning_rate: float = limit(0.05, gt=0, help="AdamW's rate on the prefix (halved at each rollback)")
    autocast: Literal["none", "bfloat16", "float16"] = option("bfloat16",
        "training's matmuls in this dtype (\"none\": the model's)")
    study: KVPrefixStudy = field(default_factory=KVPrefixStudy, metadata={"help":
        "the data stage (--set study.OPTION=VALUE)"})


class KVPrefix(Distiller):
    """Self-study into a trained KV prefix (see the module docstring and docs/absorb-methods.md, where the options'
    ablations are). Training runs max(steps, passes * sequences / batch_size) steps (96 for a 160-token document's ~30
    sequences, about 580 for a 1,000-token one's ~190), stopping early on a plateau; a document longer than the
    context is read by the teacher in chunks (study.chunk_tokens), with p at most a quarter of the context by default.
    compose_steps: `compose` trains the concatenated prefixes that many steps on both documents' data stages."""

    name = "kv-prefix"
    Options = KVPrefixOptions
    long_prompts = True  # a document longer than the context: the data stage reads it in chunks
    needs = "a token-input causal LM with softmax attention"
    summary = "self-study into a trained K/V prefix of prefix_tokens=P vectors per layer (Cartridges)"

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or not model.config.tokens:
            return "needs a token-input causal LM"
        if getattr(model.config, "attention", "softmax") != "softmax":
            return "needs softmax attention (a linear-attention state is no K/V prefix; iclca converts it exactly)"
        return None

    def setup(self) -> None:
        if self.init.startswith("press") and self.press not in press_classes():
            raise ValueError(f"kv-prefix: unknown press {self.press!r}; kvpress's: {', '.join(press_classes())}")

    def prepare(self, model, prompt: torch.Tensor) -> dict[str, Any]:
        m, context = prompt.shape[0], model.config.max_seq_len
        # default p: a quarter of the document (or `ratio` of it); of the context for a document the context does not hold
        share = 0.25 if self.ratio is None else self.ratio
        p = self.prefix_tokens if self.prefix_tokens is not None else max(1, round(min(m, context or m) * share))
        chunk_spans(m, self.study.chunk_tokens, context)  # a chunk the context cannot hold fails now
        if p > m:
            raise ValueError(f"kv-prefix: prefix_tokens={p} exceeds the document's {m} tokens (init={self.init})")
        if self.init in ("document-spread", "press-rerotated") and (getattr(model, "backend", None) != "incontext"
                                                                   or model.config.positions != "rope"):
            raise ValueError(f"kv-prefix: init={self.init} re-rotates RoPE keys: it needs our Transformer with RoPE "
                             "(use init=document or init=press)")
        if self.init.startswith("press") and context is not None and m >= context:
            raise ValueError(f"kv-prefix: init={self.init} presses the whole document, which the context ({context}) "
                             "does not hold; use init=document-spread")
        if context is not None and p >= context:
            raise ValueError(f"kv-prefix: prefix_tokens={p} leaves no room for queries within the context ({context})")
        return {"p": p}

    def _absorb(self, model, given):
        self._codec = given.codec  # the press start's (KVzip writes its reconstruction prompt with it)
        try:
            return super()._absorb(model, given)
        finally:
            self._codec = None

    @torch.no_grad()
    def start(self, model, prompt: torch.Tensor, p: int) -> Cache:
        if self.init == "document":
            return model.prefill(prompt[None, :p])
        if self.init.startswith("press"):  # the press keeps `ratio` itself where it is given (kv-press's own budget)
            share = self.ratio if self.ratio is not None and self.prefix_tokens is None else p / prompt.shape[0]
            pressed = press_cache(model, prompt[None], self.press, share, getattr(self, "_codec", None))
            return pressed if self.init == "press" else rerotated_press(model, prompt, pressed, self.press)
        return spread_prefix(model, prompt, p, chunk_spans(prompt.shape[0], self.study.chunk_tokens, model.config.max_seq_len))

    def student(self, model, prompt, generator, sequences, p: int, queries=None) -> Student:
        context, longest = model.config.max_seq_len, max((item[0].shape[0] for item in sequences), default=0)
        start = self.start(model, prompt, p)
        if context is not None and start.position + longest > context:
            at = "" if start.position == p else f" (queries after the press start's {start.position} positions)"
            raise ValueError(f"kv-prefix: prefix_tokens={p} and the data stage's sequences of up to {longest} tokens "
                             f"exceed the context ({context}){at}; lower prefix_tokens or study.chunk_tokens")
        return self.prefix_student(model, start, [0])

    def prefix_student(self, model, template: Cache, frozen: list[int]) -> Student:
        """The prefix's tensors in float32 master copies (bf16 rounds away Adam's late, small steps), read by the
        student as a cache in the model's dtype, the positions `frozen` fixed."""
        dtype = cache_kv(template)[0][0].dtype
        master = torch.promote_types(dtype, torch.float32)
        pairs = [(nn.Parameter(k.detach().to(master, copy=True)), nn.Parameter(v.detach().to(master, copy=True)))
                 for k, v in cache_kv(template)]

        def inputs(batch: int) -> dict[str, Any]:
            return {"cache": with_kv(template, [(k.to(dtype).expand(batch, *k.shape[1:]), v.to(dtype).expand(batch, *v.shape[1:]))
                                                for k, v in pairs])}

        student = Student([t for pair in pairs for t in pair], model, inputs, frozen,
                          graphable=getattr(model, "backend", None) == "incontext")
        student.template, student.dtype = template, dtype  # for `adapted`
        return student

    def adapted(self, model, student: Student, p: int | None = None) -> "TrainedPrefix":
        flat = [t.detach().to(student.dtype) for t in student.params]
        out = TrainedPrefix(model, with_kv(student.template, list(zip(flat[0::2], flat[1::2]))))
        start = max(float(t.abs().max()) for pair in cache_kv(student.template) for t in pair)
        out.initial_scales = {name: start for name, _ in out.named_buffers(recurse=False)}
        return out

    def join(self, adapted: list["TrainedPrefix"]) -> "TrainedPrefix":
        return compose_prefixes(*adapted)

    def join_student(self, joined: "TrainedPrefix", adapted: list) -> tuple[Student, Any]:
        frozen = list(accumulate((a.position for a in adapted[:-1]), initial=0))  # each document's first position
        student = self.prefix_student(joined.base, joined.state(), frozen)
        return student, lambda s: TrainedPrefix(joined.base, with_kv(joined.state(), [
            (k.detach().to(s.dtype), v.detach().to(s.dtype)) for k, v in zip(s.params[0::2], s.params[1::2])]))


@torch.no_grad()
def rerotated_press(model, prompt: torch.Tensor, pressed: Cache, press: str) -> Cache:
    """init=press-rerotated: the press's kept pairs, each key re-rotated from its document position to its rank among
    its head's kept positions (0 .. n-1, in document order), the values in the same order: a prefix at positions
    0..n-1, the PEFT CARTRIDGE layout. The positions are found by matching each kept key with the document's own
    keys (kvpress gathers them unchanged). A press that keeps a different number of pairs per head (kvzip) has no
    such layout: a one-line ValueError (use init=press)."""
    from ....ops.masked_kv import MaskedKV

    if any(isinstance(layer, MaskedKV) for layer in pressed.layers):
        raise ValueError(f"kv-prefix: init=press-rerotated needs a press that keeps the same number of pairs in every "
                         f"head; {press} keeps a different number per head (use init=press, or a press such as snapkv)")
    full = cache_kv(model.prefill(prompt[None]))
    kept = cache_kv(pressed)
    n = kept[0][0].shape[2]
    if any(k.shape[2] != n for k, _ in kept):
        raise ValueError(f"kv-prefix: init=press-rerotated needs the same number of kept pairs in every layer; {press} "
                         f"keeps {[k.shape[2] for k, _ in kept]} (use init=press)")
    layers = []
    for (fk, _), (k, v) in zip(full, kept):
        distance = torch.cdist(k[0].double(), fk[0].double())  # (H, n, M)
        found = distance.argmin(-1)  # (H, n): each kept key's document position
        if float(distance.gather(-1, found[..., None]).max()) > 1e-4 * float(fk.abs().max()):
            raise ValueError(f"kv-prefix: {press}'s kept keys are not the document's own (a press that merges or "
                             "changes them has no original positions): use init=press")
        order = found.argsort(-1)  # document order within each head
        positions = found.gather(-1, order)
        k = k.gather(2, order[None, :, :, None].expand_as(k))
        v = v.gather(2, order[None, :, :, None].expand_as(v))
        ranks = torch.arange(n, device=k.device).expand_as(positions)
        layers.append((rerotate(model, k, ranks - positions), v))
    return Cache(layers=layers, position=n)


def rerotate(model, k: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """RoPE keys (B, H, S, D) moved by `shift` ((S,) or per head (H, S)) positions each: a key at position a becomes the key at
    a + shift (rotations compose, R(shift) R(a) = R(a + shift); our Transformer's RoPE)."""
    cos, sin = rope_cos_sin(shift, model.rope_dim, model.config.rope_theta, k.dtype)
    return apply_rope(k, cos, sin)


@torch.no_grad()
def spread_prefix(model, prompt: torch.Tensor, p: int, spans: list[tuple[int, int]] | None = None) -> Cache:
    """init=document-spread: p of the document's own K/V pairs, from positions spread evenly over the whole document
    (the first one always, the attention sink), computed with the whole document in context, each key re-rotated
    from its document position to its place in the prefix (0 .. p-1): a quarter of the document's cache that covers
    all of it, where `document` keeps its first quarter. At p = M it is the document's own cache (keep-prompt).
    With `spans` (the data stage's chunks, study.stage.chunk_spans), each pair is computed with the chunk that holds
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


def compose_prefixes(*prefixes: TrainedPrefix) -> TrainedPrefix:
    """Several documents absorbed separately, answered together: their prefixes concatenated (Cartridges composes
    cartridges the same way, without retraining). Each prefix keeps the positions it was trained at; queries start
    after every position the prefixes hold: the sum of their lengths, and on a model that reads its BOS first the
    BOS each prefix holds after the first (as PEFT's compose_cartridge_adapters: absorb/methods/kv_prefix/export.py)."""
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
