"""A trained KV prefix (Cartridges, Eyuboglu et al. 2025): p key and value vectors per layer and K/V head,
prepended to every query's attention, trained by self-study so the model with the prefix answers as the model
with the whole document in its context. The base model stays frozen.

    adapted = get_absorb_method("kv-prefix", prefix_tokens=32).absorb(model, prompt, codec=tokenizer)
    logits = adapted(query)               # the query attends to the prefix (positions p, p+1, ...)

- the start (`init`): by default ("auto") a kvpress press's kept K/V at their own positions ("press", KVzip: chosen
  on SQuAD validation paragraphs, results/absorber-choice) wherever that start can be made (kvpress installed, a
  tokenizer given for KVzip's reconstruction prompt, a transformers form of the model, the document within the
  context), else the K/V of the document's first p tokens ("document", Cartridges' best); or p of the document's
  K/V pairs spread evenly over it, keys re-rotated to the prefix's positions ("document-spread"; ours, the better
  start for a long document); the start taken is in the absorb's history (`init`);
- the first prefix position stays frozen: the attention sink (Cartridges' and peft's `num_frozen_tokens=1`);
- the data stage, the objective and the training loop are the pipeline's (absorb/distill.py); this module
  supplies the prefix as the trained tensors and the student that reads it as a cache;
- written once against the causal-LM protocol: the prefix is a cache of either backend (our K/V tuples or
  transformers' DynamicCache layers), so it runs on our Transformer and on any Hugging Face family; saved, the
  adapted model holds the prefix alone (`saves_base = False`).

With p = M and init "document" and no training steps the prefix is the document's own K/V: keep-prompt exactly.
A press start keeps its pairs at the document's positions (queries after the whole document): a PEFT CARTRIDGE has
no layout for it, so a default folder of a pressed start holds no peft_adapter/ (init=document or press-rerotated
write one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Literal

import torch
from torch import nn

from ....config import limit, option, redefault
from ....models import Cache
from ....models.lm import cache_kv, is_causal_lm, with_kv
from ...distill import Distiller, Student, TrainOptions
from ....interop.hf import hf_twin
from ...presses import check_press, compact_cache, press_cache, press_classes, reconstructs
from ...study import StudyOptions, chunk_spans
from .adapted import TrainedPrefix, compose_prefixes
from .start import rerotated_press, spread_prefix

FROZEN = (0,)  # the prefix positions never trained: the document's first pair (the attention sink) in every head


@dataclass
class KVPrefixStudy(StudyOptions):
    """kv-prefix's data stage: the recall windows and continuations, plus 16 queries derived from the document by
    rules (chosen on validation episodes of `facts` and `documents`, the document alone: docs/absorb-methods.md) and
    8 reconstruction pieces (the document repeated after an instruction to repeat it; chosen with the press start on
    SQuAD validation paragraphs: results/absorber-choice)."""

    derived: int = redefault(StudyOptions, "derived", 16)
    reconstruction: int = redefault(StudyOptions, "reconstruction", 8)


@dataclass
class KVPrefixOptions(TrainOptions):
    # 32 steps, 2 passes: chosen on SQuAD validation paragraphs with the press start at a tenth of the K/V against
    # 96 / 8 and 16 / 1 (results/absorber-choice/validation-smollm2-0.1-steps): the best F1 at a third of the time
    steps: int = redefault(TrainOptions, "steps", 32)
    passes: int = redefault(TrainOptions, "passes", 2)
    prefix_tokens: int | None = limit(None, min=1, help="p, the prefix's length (default: a quarter of the document)")
    init: Literal["auto", "document", "document-spread", "press", "press-rerotated"] = option("auto",
        "the start: press where it can be made (kvpress, a tokenizer for kvzip, a transformers form, the document "
        "within the context), else document; the first p tokens' K/V; p spread over all; a kvpress press's kept K/V "
        "at their own positions "
        "(queries after the whole document); or those re-rotated to 0..p-1 (each head its own budget; a PEFT CARTRIDGE "
        "where every head keeps as many)")
    ratio: float | None = limit(None, gt=0, max=1, help=
        "p as a share of the document's tokens (when prefix_tokens is unset)")
    press: str = option("kvzip", "init=auto / press / press-rerotated: the kvpress press whose kept K/V start the prefix")
    study: KVPrefixStudy = redefault(TrainOptions, "study", KVPrefixStudy)


class KVPrefix(Distiller):
    """Self-study into a trained KV prefix (see the module docstring and docs/absorb-methods.md, where the options'
    ablations are). Training runs max(steps, passes * sequences / batch_size) steps (32 for a 160-token document's ~40
    sequences, about 100 for a 1,000-token one's ~200), stopping early on a plateau; a document longer than the
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

    recorded = ("init",)  # the start taken (init=auto resolved) goes into the absorb's history

    def setup(self) -> None:
        o = self.options
        if o.init.startswith("press"):
            check_press(o.press, "kv-prefix")
        elif o.init == "auto" and o.press != KVPrefixOptions.press:
            try:  # a misspelt press fails now; a press kvpress lacks here falls back like a missing kvpress
                check_press(o.press, "kv-prefix")
            except ValueError as error:
                if "unknown press" in str(error) or "trained weights" in str(error):
                    raise
        elif o.init != "auto" and o.press != KVPrefixOptions.press:
            raise ValueError(f"kv-prefix: press={o.press} is read only with init=press or init=press-rerotated "
                             f"(this is init={o.init}): give init=press too, or leave press out")

    def resolve_init(self, model, m: int, codec) -> str:
        """init=auto's start: "press" where it can be made here, else "document" (the module docstring); prepare
        falls back to "document" too where kvpress's press refuses the model (KVzip on Gemma 3)."""
        o = self.options
        if o.init != "auto":
            return o.init
        context = model.config.max_seq_len
        if context is not None and m >= context:
            return "document"
        try:
            classes = press_classes()
        except ValueError:  # kvpress not installed
            return "document"
        if o.press not in classes or (codec is None and reconstructs(classes[o.press])):
            return "document"
        try:
            hf_twin(model)
        except (ValueError, NotImplementedError):  # no transformers form of this model
            return "document"
        return "press"

    def prepare(self, model, prompt: torch.Tensor, codec) -> dict[str, Any]:
        m, context = prompt.shape[0], model.config.max_seq_len
        init = self.resolve_init(model, m, codec)
        o = dataclasses.replace(self.options, init=init)
        # default p: a quarter of the document (or `ratio` of it); of the context for a document the context does not hold
        share = 0.25 if o.ratio is None else o.ratio
        p = o.prefix_tokens if o.prefix_tokens is not None else max(1, round(min(m, context or m) * share))
        chunk_spans(m, o.study.chunk_tokens, context)  # a chunk the context cannot hold fails now
        if p > m:
            raise ValueError(f"kv-prefix: prefix_tokens={p} exceeds the document's {m} tokens (init={o.init})")
        if o.init in ("document-spread", "press-rerotated") and (getattr(model, "backend", None) != "incontext"
                                                                or model.config.positions != "rope"):
            raise ValueError(f"kv-prefix: init={o.init} re-rotates RoPE keys: it needs our Transformer with RoPE "
                             "(use init=document or init=press)")
        if o.init.startswith("press") and context is not None and m >= context:
            raise ValueError(f"kv-prefix: init={o.init} presses the whole document, which the context ({context}) "
                             "does not hold; use init=document-spread")
        if context is not None and p >= context:
            raise ValueError(f"kv-prefix: prefix_tokens={p} leaves no room for queries within the context ({context})")
        pressed = None
        if self.options.init == "auto" and init == "press":  # a press kvpress refuses on this model: the document start
            try:
                pressed = self._press(model, prompt, p, codec)
            except ValueError:
                init = "document"
        return {"p": p, "codec": codec, "init": init, "pressed": pressed}  # codec: KVzip writes its prompt with it

    @torch.no_grad()
    def _press(self, model, prompt: torch.Tensor, p: int, codec) -> Cache:
        """The press's cache of the whole document keeping p of its m pairs (or `ratio` where given: kv-press's own
        budget), queries after the document; in eval mode."""
        o, was_training = self.options, model.training
        share = o.ratio if o.ratio is not None and o.prefix_tokens is None else p / prompt.shape[0]
        model.eval()
        try:
            return press_cache(model, prompt[None], o.press, share, codec, where="kv-prefix")
        finally:
            model.train(was_training)

    @torch.no_grad()
    def start(self, model, prompt: torch.Tensor, p: int, codec=None, init: str | None = None,
              pressed: Cache | None = None) -> Cache:
        """The prefix's first state for `init` (None: the options'); `pressed`: the press's cache, made already."""
        o = self.options if init is None else dataclasses.replace(self.options, init=init)
        if o.init == "document":
            return model.prefill(prompt[None, :p])
        if o.init.startswith("press"):
            pressed = pressed if pressed is not None else self._press(model, prompt, p, codec)
            if o.init == "press":  # a per-head press's kept pairs alone (the sink, frozen, in place): what is trained
                return compact_cache(pressed, tuple(FROZEN))
            return rerotated_press(model, prompt, pressed, o.press)
        return spread_prefix(model, prompt, p, chunk_spans(prompt.shape[0], o.study.chunk_tokens, model.config.max_seq_len))

    def student(self, model, prompt, generator, sequences, p: int, codec=None, init: str | None = None,
                pressed: Cache | None = None) -> Student:
        context, longest = model.config.max_seq_len, max((item[0].shape[0] for item in sequences), default=0)
        start = self.start(model, prompt, p, codec, init, pressed)
        if context is not None and start.position + longest > context:
            at = "" if start.position == p else f" (queries after the press start's {start.position} positions)"
            raise ValueError(f"kv-prefix: prefix_tokens={p} and the data stage's sequences of up to {longest} tokens "
                             f"exceed the context ({context}){at}; lower prefix_tokens or study.chunk_tokens")
        return self.prefix_student(model, start, list(FROZEN))

    def prefix_student(self, model, template: Cache, frozen: list[int] | list[list[int]]) -> Student:
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

    def adapted(self, model, student: Student) -> "TrainedPrefix":
        flat = [t.detach().to(student.dtype) for t in student.params]
        out = TrainedPrefix(model, with_kv(student.template, list(zip(flat[0::2], flat[1::2]))))
        start = max(float(t.abs().max()) for pair in cache_kv(student.template) for t in pair)
        out.initial_scales = {name: start for name, _ in out.named_buffers(recurse=False)}
        return out

    def join(self, adapted: list["TrainedPrefix"]) -> "TrainedPrefix":
        return compose_prefixes(*adapted)

    def join_student(self, joined: "TrainedPrefix", adapted: list) -> tuple[Student, Any]:
        # each document's first pair, in every layer (a compacted press start holds fewer pairs than positions)
        state = joined.state()
        lengths = [[k.shape[2] for k, _ in cache_kv(a.state())] for a in adapted[:-1]]
        starts = [list(accumulate((n[i] for n in lengths), initial=0)) for i in range(len(state.layers))]
        frozen = [[s + f for s in layer for f in FROZEN] for layer in starts for _ in ("keys", "values")]
        student = self.prefix_student(joined.base, state, frozen)
        return student, lambda s: TrainedPrefix(joined.base, with_kv(joined.state(), [
            (k.detach().to(s.dtype), v.detach().to(s.dtype)) for k, v in zip(s.params[0::2], s.params[1::2])]))


