"""NVIDIA kvpress's presses run on a model, and a cache held as an adapted model's buffers: what the kv-press method
and kv-prefix's press start share (methods/kv_press.py, methods/kv_prefix). The presses are kvpress's own,
unmodified (`press_classes()`: every press of kvpress that takes a compression_ratio alone); a press runs on the
model's transformers twin (interop.hf.hf_twin) and its kept K/V come back as a cache of the model's own backend."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..interop.hf import hf_twin
from ..models import Cache
from ..models.hf_backend import HFLayerState
from ..models.lm import cache_kv, copy_cache
from ..ops.masked_kv import MaskedKV
from .protocol import AdaptedModel, tensor_bytes

_INSTALL = "the kv-press method needs NVIDIA kvpress: pip install 'incontext[press]' (kvpress==0.5.5)"


def press_classes() -> dict[str, type]:
    """kvpress's presses that take a compression_ratio and nothing else required, by lower-case name without
    "Press" (KVzipPress -> "kvzip"): the list comes from the installed kvpress. ValueError when it is missing."""
    try:
        import kvpress
    except ImportError:
        raise ValueError(_INSTALL) from None
    out = {}
    for name in kvpress.__all__:
        cls = getattr(kvpress, name, None)
        if not (isinstance(cls, type) and issubclass(cls, kvpress.BasePress) and dataclasses.is_dataclass(cls)):
            continue
        fields = dataclasses.fields(cls)
        required = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if any(f.name == "compression_ratio" for f in fields) and not required:
            out[name.removesuffix("Press").lower()] = cls
    return dict(sorted(out.items()))


# presses whose scorer or restore weights kvpress downloads from the Hugging Face hub, released only for large models
# (KVzap's MLPs, FastKVzip's gates, RestoreKV's tokens and LoRA): nothing here can fetch them, so they are refused
# before any model runs (kvpress would otherwise retry the network for half a minute); KVzap runs with a scorer
# trained here (absorb/kvzap.py: `weights=FOLDER`)
HUB_WEIGHTS = {"kvzap": "nvidia/KVzap-*", "fastkvzip": "Jang-Hyun/Fast-KVzip", "restorekv": "higokri/RestoreKV-*"}
TRAINED_HERE = {"kvzap"}


def check_press(press: str, where: str = "kv-press", weights: str | None = None) -> None:
    """One-line ValueError for a press that is not kvpress's or that needs weights from the hub (KVzap: unless
    `weights` names a scorer trained here)."""
    classes = press_classes()
    if press not in classes:
        raise ValueError(f"{where}: unknown press {press!r}; kvpress's: {', '.join(classes)}")
    if weights is not None and press not in TRAINED_HERE:
        raise ValueError(f"{where}: weights are read only by press=kvzap (this is press={press})")
    if press in HUB_WEIGHTS and not (press in TRAINED_HERE and weights is not None):
        here = (" give weights=FOLDER, a scorer trained here for the model (incontext run kvzap-train)"
                if press in TRAINED_HERE else " none ship for the models here")
        raise ValueError(f"{where}: press={press} needs trained weights that kvpress downloads from the Hugging Face hub "
                         f"({HUB_WEIGHTS[press]}, released for large models only);{here}")


def document_start(codec, ids: list[int]) -> int:
    """Where the document starts in a prompt `ids` that the chat template placed as a system turn: the number of the
    template's tokens before it (0 for a raw document, a tokenizer without a template, or a prompt that does not
    start with them)."""
    if codec is None or not hasattr(codec, "chat"):
        return 0
    mark = "\u2063DOCUMENT\u2063"
    try:
        text = codec.chat([{"role": "system", "content": mark}])
    except (ValueError, TypeError, AttributeError, KeyError):
        return 0
    if text.count(mark) != 1:
        return 0
    head = codec.encode(text.partition(mark)[0])
    return len(head) if head and ids[: len(head)] == head else 0


def reconstructs(cls: type) -> bool:
    """KVzip and its kind (KVgrad, FastKVzip, ... inherit it): `prepare` writes a reconstruction prompt with the
    tokenizer, after a template prefix it measures on a user turn."""
    return any("prepare" in vars(c) for c in cls.__mro__)


def _placed(cls: type, start: int) -> type:
    """`cls` (a press that reconstructs) told that the document starts at `start` instead; other presses as they are."""
    if not reconstructs(cls):
        return cls

    class Placed(cls):
        def prepare(self, model, tokenizer, *args, **kwargs):
            self.prefix_length = start
            return super().prepare(model, tokenizer, *args, **kwargs)

    Placed.__name__ = cls.__name__
    return Placed


def with_cache_position(press):
    """The one adapter kvpress 0.5.5 needs on transformers 5.23: its BasePress.forward_hook reads the attention's
    `cache_position` keyword, which transformers no longer passes; it is rebuilt from the cache (the positions of the
    tokens this forward added). The press itself is unmodified. tests/absorb/test_kv_press.py fails once upstream
    passes it again (the adapter is then dead code)."""
    hook = press.forward_hook

    def forward_hook(module, args, kwargs, output):
        if "cache_position" not in kwargs:
            seen = kwargs["past_key_values"].get_seq_length(module.layer_idx)
            new = kwargs["hidden_states"].shape[1]
            kwargs = {**kwargs, "cache_position": torch.arange(seen - new, seen, device=kwargs["hidden_states"].device)}
        return hook(module, args, kwargs, output)

    press.forward_hook = forward_hook  # the instance's: what BasePress.__call__ registers on every attention layer
    return press


@contextlib.contextmanager
def _quiet_kvpress():
    """kvpress's warnings (KVzip's cost notice, "model not tested") kept off the user's stderr."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("kvpress")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


@contextlib.contextmanager
def _tokenizer_folder(hf, codec):
    """KVzip reads the tokenizer from `model.config.name_or_path`: point it at the codec's folder (written to a
    temporary one when the tokenizer has none) while the press runs."""
    folder = getattr(codec, "folder", None)
    tokenizer = getattr(codec, "tokenizer", None) if codec is not None else None
    saved = hf.config.name_or_path
    with tempfile.TemporaryDirectory() as scratch:
        if folder is None and tokenizer is not None:
            path = getattr(tokenizer, "name_or_path", "")
            if path and (Path(path) / "tokenizer_config.json").is_file():
                folder = path
            else:
                tokenizer.save_pretrained(scratch)
                folder = scratch
        if folder is not None:
            hf.config.name_or_path = str(folder)
        try:
            yield
        finally:
            hf.config.name_or_path = saved


def with_bos(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(1, M) ids with the BOS the model reads first in front (the Hugging Face backend's HFCausalLM.read_bos_first):
    what a press on its transformers twin must see; unchanged for a model without one."""
    bos = getattr(model, "bos_id", None)
    return ids if bos is None else torch.cat([torch.full_like(ids[:, :1], bos), ids], 1)


@torch.no_grad()
def press_cache(model: nn.Module, prompt: torch.Tensor, press: str, ratio: float, codec=None,
                start: int | None = None, where: str = "kv-press", weights: str | None = None) -> Cache:
    """The prompt's ((1, M) ids) cache after `press` kept the share `ratio` of its K/V, as a cache of `model`'s own
    backend at position M (queries continue after the whole document). `start`: where the document starts (KVzip's
    reconstruction; None: found from the codec's chat template). `where`: the method its errors name. `weights`:
    press=kvzap's scorer folder (absorb/kvzap.py)."""
    check_press(press, where, weights)
    classes = press_classes()
    hf = hf_twin(model)
    m = prompt.shape[1]
    ids, bos = with_bos(model, prompt), getattr(model, "bos_id", None)
    if codec is None and reconstructs(classes[press]):
        raise ValueError(f"{where}: {press} writes its reconstruction prompt with the model's tokenizer: give codec= "
                         "(incontext absorb and compare do)")
    start = document_start(codec, prompt[0].tolist()) if start is None else start
    with _quiet_kvpress():
        cls = _placed(classes[press], start + (bos is not None))
        try:
            instance = with_cache_position(cls(compression_ratio=1.0 - ratio, **(
                {"model_type": "linear"} if press == "kvzap" else {})))
        except (AssertionError, ValueError, TypeError) as error:
            raise ValueError(f"{where}: kvpress's {press} refuses ratio={ratio}: {error}") from None
        if press == "kvzap":  # kvpress's own KVzapPress with our scorer: the name it would load is marked loaded
            instance.kvzap_model = load_scorer(weights, hf)
            instance.kvzap_model_name = f"nvidia/KVzap-linear-{hf.config.name_or_path.split('/')[-1]}"
        from transformers import DynamicCache

        cache = DynamicCache(config=hf.config)
        attention = [layer.self_attn for layer in hf.model.layers]
        try:
            tokenizer = _tokenizer_folder(hf, codec) if reconstructs(classes[press]) else contextlib.nullcontext()
            with tokenizer, instance(hf):  # only a press that reconstructs reads the tokenizer from a folder
                hf.model(input_ids=ids.to(next(hf.parameters()).device), past_key_values=cache)
            masks = [getattr(module, "masked_key_indices", None) for module in attention]
        except (AssertionError, ValueError, RuntimeError, OSError, KeyError, AttributeError, IndexError) as error:
            raise ValueError(f"{where}: kvpress's {press} failed on this model ({type(error).__name__}: "
                             f"{str(error).splitlines()[0] if str(error) else ''})") from None
        finally:
            for module in attention:  # kvpress's attention patch reads them in every later decode: never leave them
                module.masked_key_indices = None
    keeps = []
    for i, layer in enumerate(cache.layers):
        keep = None
        if masks[i] is not None:
            keep = torch.ones(layer.keys.shape[:3], dtype=torch.bool, device=layer.keys.device)
            keep[masks[i]] = False
        keeps.append(keep)
    return backend_cache(model, cache, keeps, m, ids.shape[1])


def backend_cache(model: nn.Module, cache, keeps: list, position: int, seen: int) -> Cache:
    """A transformers DynamicCache of the prompt (`seen` tokens: with the BOS the backend reads first) as a cache of
    `model`'s own backend at `position`: layer i masked by keeps[i] ((1, H_kv, S) bool, None: all kept) where given."""
    ours = getattr(model, "backend", "incontext") != "hf"
    layers: list[Any] = []
    for layer, keep in zip(cache.layers, keeps):
        k, v = layer.keys, layer.values
        if keep is not None:  # both backends continue a masked cache (the Hugging Face one by a per-head mask)
            layers.append(MaskedKV(k, v, keep))
        elif ours:
            layers.append((k, v))
        else:
            layers.append(HFLayerState(k, v, getattr(layer, "cumulative_length", seen)))
    return Cache(layers=layers, position=position)


def load_scorer(folder: str | Path, hf):
    """kvpress's KVzapModel from a folder `solve`'s save_pretrained wrote, checked against the transformers model `hf`
    it will score (one-line errors for a missing folder or a scorer of another model's shape)."""
    from kvpress.presses.kvzap_press import KVzapModel

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"press=kvzap: weights={folder} holds no KVzap scorer (config.json); write one with "
                         "`incontext run kvzap-train`")
    scorer = KVzapModel.from_pretrained(folder).eval()
    c, h = scorer.config, hf.config
    if (c.n_modules, c.input_dim, c.output_dim) != (h.num_hidden_layers, h.hidden_size, h.num_key_value_heads):
        raise ValueError(f"press=kvzap: the scorer in {folder} has {c.n_modules} layers of width {c.input_dim} and "
                         f"{c.output_dim} K/V heads; this model has {h.num_hidden_layers}, {h.hidden_size} and "
                         f"{h.num_key_value_heads}: train one for it")
    return scorer


def compact_cache(cache: Cache, always: tuple[int, ...] = ()) -> Cache:
    """`cache` with each masked layer (a per-head press: MaskedKV) compacted to its kept pairs (MaskedKV.compacted;
    `always`: positions kept in place, kept or not), the others as they are; the same attention at the same position."""
    return Cache(layers=[layer.compacted(always) if isinstance(layer, MaskedKV) else layer for layer in cache.layers],
                 position=cache.position)


def kept_pair_bytes(cache: Cache) -> int:
    """Bytes of the kept pairs' keys and values (a masked layer's evicted pairs not counted)."""
    total = 0
    for layer, (k, v) in zip(cache.layers, cache_kv(cache)):
        if isinstance(layer, MaskedKV):
            total += layer.kept_pairs() * (k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size())
        else:
            total += tensor_bytes([k, v])
    return total


def cache_layout(cache: Cache) -> dict[str, Any]:
    """What rebuilds an empty cache of this layout (PressedCache.empty; kv-prefix's press start)."""
    kv = cache_kv(cache)
    return {"position": cache.position, "shapes": [list(k.shape) for k, _ in kv], "value_shapes": [list(v.shape) for _, v in kv],
            "masked": [isinstance(layer, MaskedKV) for layer in cache.layers],
            "seen": [int(getattr(layer, "seen", k.shape[-2])) for layer, (k, _) in zip(cache.layers, kv)]}


def empty_cache(base: nn.Module, layout: dict[str, Any]) -> Cache:
    """A cache of `layout` (cache_layout) in `base`'s dtype and device, for loading saved tensors into."""
    parameter = next(base.parameters())
    layers: list[Any] = []
    for shape, vshape, masked, seen in zip(layout["shapes"], layout["value_shapes"], layout["masked"], layout["seen"]):
        k = torch.zeros(shape, dtype=parameter.dtype, device=parameter.device)
        v = torch.zeros(vshape, dtype=parameter.dtype, device=parameter.device)
        if masked:  # either backend
            layers.append(MaskedKV(k, v, torch.ones(shape[:3], dtype=torch.bool, device=parameter.device)))
        elif getattr(base, "backend", "incontext") == "hf":
            layers.append(HFLayerState(k, v, seen))
        else:
            layers.append((k, v))
    return Cache(layers=layers, position=layout["position"])


class CacheBuffers(AdaptedModel):
    """An adapted model that holds a cache of the base's own backend as buffers (keys, values and, for a masked
    layer, its keep mask) and answers every query after it; saves the cache alone (`saves_base = False`)."""

    saves_base = False
    prefix = "cache"

    def __init__(self, base: nn.Module, state: Cache):
        super().__init__(base)
        self.layout = cache_layout(state)
        self.position = state.position
        self._layers = []
        for i, (layer, (k, v)) in enumerate(zip(state.layers, cache_kv(state))):
            self.register_buffer(f"{self.prefix}_k_{i}", k.detach().clone())
            self.register_buffer(f"{self.prefix}_v_{i}", v.detach().clone())
            if isinstance(layer, MaskedKV):
                self.register_buffer(f"{self.prefix}_keep_{i}", layer.keep.clone())
            self._layers.append(layer)
        self.n_prefix_layers = len(self._layers)

    def _tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(getattr(self, f"{self.prefix}_k_{i}"), getattr(self, f"{self.prefix}_v_{i}")) for i in range(self.n_prefix_layers)]

    def state(self) -> Cache:
        layers = []
        for i, (layer, (k, v)) in enumerate(zip(self._layers, self._tensors())):
            if isinstance(layer, MaskedKV):
                layers.append(MaskedKV(k, v, getattr(self, f"{self.prefix}_keep_{i}")))
            elif isinstance(layer, tuple):
                layers.append((k, v))
            else:
                layers.append(layer.with_tensors(k, v))
        return Cache(layers=layers, position=self.position)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.state())

    def query_cache(self) -> Cache:
        return copy_cache(self.state())

    def kept_bytes(self, base: nn.Module) -> int:
        return kept_pair_bytes(self.state())

    def extra_state(self) -> dict[str, Any]:
        return dict(self.layout)

    @classmethod
    def empty(cls, base, extra):
        return cls(base, empty_cache(base, extra))
