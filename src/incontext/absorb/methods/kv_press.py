"""KV-cache presses (NVIDIA kvpress): the document's K/V compressed without training, the practical peer of a
trained prefix. The document is prefilled once under the press, which keeps a share of its keys and values; each
question is then answered on that cache with its positions continuing after the whole document, as kvpress's own
pipeline (KVPressTextGenerationPipeline) does.

    adapted = get_absorb_method("kv-press", press="kvzip", ratio=0.25).absorb(model, prompt, codec=tokenizer)
    logits = adapted(query)               # positions M, M+1, ... after the M-token document; 25% of its K/V kept

- the presses are kvpress's own, unmodified (`press_classes()`: every press of kvpress that takes a
  compression_ratio alone; `ratio` is the share KEPT, kvpress's compression_ratio = 1 - ratio);
- the press runs on the model's transformers twin (interop.hf.hf_twin: the Hugging Face backend's own model, or the
  export of our Transformer with the same weights); its kept K/V come back as a cache of the model's own backend;
- a press that keeps a different number of pairs in each head (kvpress's KVzip, AdaKV: a full-length cache with the
  evicted pairs masked) gives a masked cache (ops.masked_kv.MaskedKV) on either backend: our Transformer attends to
  the kept pairs alone; on the Hugging Face backend each attention layer gets its own per-head mask while a query
  continues the cache (models/hf_backend.py: exact, -inf where evicted; kvpress's own decoding instead overwrites
  the evicted keys with a key whose weight underflows to zero);
- kept bytes are the kept pairs' keys and values, counted pair by pair (a masked layer's evicted pairs are not kept;
  the positions a compacted per-head layout would also store are not counted);
- a system-turn document: KVzip measures the template's tokens before the document on a user turn and reconstructs
  what follows; `document_start` (default: found from the tokenizer's chat template) tells it where the document
  starts instead, so that the press reconstructs the document and not the template's own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...config import limit, option
from ...interop.hf import hf_twin
from ...models.lm import is_causal_lm
from ..kvzap import kvzap_cache
from ..presses import CacheBuffers, check_press, load_scorer, press_cache
from ..protocol import AbsorbMethod, AdaptedModel


class PressedCache(CacheBuffers):
    """The document's cache as a kvpress press left it: queries continue at position M after the whole document."""

    method = "kv-press"
    prefix = "press"


@dataclass
class KVPressOptions:
    press: str = option("kvzip",
        "a press of the installed kvpress that takes a ratio alone (kvzip, snapkv, tova, knorm, "
        "...)")
    ratio: float = limit(0.25, gt=0, max=1, help=
        "the share of the document's K/V kept (kvpress's compression_ratio = 1 - ratio)")
    document_start: int | None = limit(None, min=0, help=
        "the template's tokens before the document (default: from the chat template)")
    weights: str | None = option(None, "press=kvzap: a folder of KVzap scorer weights trained for this model "
                                 "(incontext run kvzap-train writes one)")
    select: Literal["global", "kvpress"] = option("global", "press=kvzap: KVzip's eviction rule on the scorer's "
        "scores (sinks kept, the lowest pairs over all layers and heads evicted; one prefill), or kvpress's KVzapPress "
        "(each head keeps the same share)")


class KVPress(AbsorbMethod):
    """A kvpress press compresses the document's K/V once, no training (see the module docstring)."""

    name = "kv-press"
    Options = KVPressOptions
    takes_codec = True  # the tokenizer: where a system-turn document starts, KVzip's reconstruction prompt
    needs = "a causal LM with softmax attention that has a transformers twin (the Hugging Face backend, or a Llama export)"
    summary = "the document's K/V compressed by a kvpress press (press=NAME, ratio=R kept), no training (NVIDIA kvpress)"

    def setup(self) -> None:
        check_press(self.options.press, weights=self.options.weights)
        if self.options.select != "global" and self.options.press != "kvzap":
            raise ValueError(f"kv-press: select is read only by press=kvzap (this is press={self.options.press})")

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model) or not model.config.tokens:
            return "needs a token-input causal LM"
        if getattr(model.config, "attention", "softmax") != "softmax":
            return "needs softmax attention (a linear-attention state holds no K/V to press)"
        try:
            hf_twin(model)
        except ValueError as error:
            return str(error)
        return None

    def _absorb(self, model, given) -> AdaptedModel:
        prompt, codec, o = given.prompt, given.codec, self.options
        if o.document_start is not None and o.document_start >= prompt.shape[-1]:
            raise ValueError(f"kv-press: document_start={o.document_start} is at or past the end of the "
                             f"{prompt.shape[-1]}-token prompt (it counts the template's tokens before the document)")
        if o.press == "kvzap" and o.select == "global":  # one prefill, KVzip's rule on the trained scorer's scores
            scorer = load_scorer(o.weights, hf_twin(model))
            return PressedCache(model, kvzap_cache(model, prompt, scorer, o.ratio)).eval()
        return PressedCache(model, press_cache(model, prompt, o.press, o.ratio, codec, o.document_start,
                                               weights=o.weights)).eval()
