"""The "absorb a context" protocol shared by every method that removes a prompt from the context.

    adapted = method.absorb(model, prompt_ids)   # pay once per prompt
    logits  = adapted(query_ids)                 # pay per query; the prompt is no longer in the context

`adapted` is an `AdaptedModel` (an nn.Module) that saves to and loads from a folder like any model
(safetensors weights and buffers + a JSON description). The two reference points speak the same protocol:
`KeepPrompt` (the prompt stays in the context) and `DropPrompt` (the prompt is simply removed).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from ..fileio import sha256_file
from ..models import Cache, Transformer, TransformerConfig

_ADAPTED: dict[str, type["AdaptedModel"]] = {}
_METHODS: dict[str, type["AbsorbMethod"]] = {}


class AdaptedModel(nn.Module, ABC):
    """A model with a prompt absorbed: forward(query) gives logits for the query tokens only."""

    method: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "method", None):
            _ADAPTED[cls.method] = cls

    def __init__(self, base: Transformer):
        super().__init__()
        self.base = base

    @abstractmethod
    def forward(self, query: torch.Tensor) -> torch.Tensor: ...

    def extra_state(self) -> dict[str, Any]:
        """JSON-able constructor arguments besides the base model (sizes of buffers, offsets)."""
        return {}

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "AdaptedModel":
        """An instance with buffers of the right shapes, to load saved values into."""
        raise NotImplementedError

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_model(self, str(folder / "adapted.safetensors"))
        dtype = str(next(self.base.parameters()).dtype).removeprefix("torch.")
        description = {"method": self.method, "dtype": dtype, "base_config": self.base.config.to_dict(),
                       "extra": self.extra_state(), "sha256": sha256_file(folder / "adapted.safetensors")}
        (folder / "adapted.json").write_text(json.dumps(description, indent=2))
        return folder

    @staticmethod
    def load(folder: str | Path) -> "AdaptedModel":
        folder = Path(folder)
        if not (folder / "adapted.json").is_file():
            raise FileNotFoundError(f"{folder} holds no adapted model (adapted.json is missing)")
        description = json.loads((folder / "adapted.json").read_text())
        cls = _ADAPTED.get(description["method"])
        if cls is None:
            raise ValueError(f"unknown absorb method {description['method']!r}; known: {sorted(_ADAPTED)}")
        dtype = getattr(torch, description.get("dtype", "float32"))
        base = Transformer(TransformerConfig.from_dict(description["base_config"])).to(dtype)
        model = cls.empty(base, description["extra"]).to(dtype)
        weights = folder / "adapted.safetensors"
        if "sha256" in description and sha256_file(weights) != description["sha256"]:  # older saves have none
            raise ValueError(f"{weights} is corrupt: its sha256 differs from the one recorded in adapted.json")
        load_model(model, str(weights))
        return model.eval()


class AbsorbMethod(ABC):
    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if getattr(cls, "name", None):
            _METHODS[cls.name] = cls

    @abstractmethod
    def absorb(self, model: Transformer, prompt: torch.Tensor) -> AdaptedModel: ...


def absorb_methods() -> list[str]:
    return sorted(_METHODS)


def get_absorb_method(name: str, **options) -> AbsorbMethod:
    if name not in _METHODS:
        raise KeyError(f"unknown absorb method {name!r}; registered: {sorted(_METHODS)}")
    return _METHODS[name](**options)


# ----------------------------------------------------------------------------- the two reference points


class PromptInContext(AdaptedModel):
    """The prompt stays in the context: its keys/values (or linear state) are cached once, and each query
    continues from a copy of that cache (the cost the other methods try to avoid)."""

    method = "keep-prompt"

    def __init__(self, base: Transformer, prompt: torch.Tensor):
        super().__init__(base)
        self.register_buffer("prompt", prompt)
        self._cache: Cache | None = None

    def prompt_cache(self) -> Cache:
        if self._cache is None:
            cache = Cache.empty(self.base.config.n_layer)
            with torch.no_grad():
                self.base(self.prompt, cache=cache)
            self._cache = cache
        return Cache(layers=list(self._cache.layers), position=self._cache.position)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.prompt_cache())

    def extra_state(self) -> dict[str, Any]:
        return {"prompt_shape": list(self.prompt.shape)}

    @classmethod
    def empty(cls, base, extra):
        return cls(base, torch.zeros(extra["prompt_shape"], dtype=torch.long))


class WithoutPrompt(AdaptedModel):
    method = "drop-prompt"

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query)

    @classmethod
    def empty(cls, base, extra):
        return cls(base)


class KeepPrompt(AbsorbMethod):
    name = "keep-prompt"

    def absorb(self, model: Transformer, prompt: torch.Tensor) -> AdaptedModel:
        return PromptInContext(model, prompt)


class DropPrompt(AbsorbMethod):
    name = "drop-prompt"

    def absorb(self, model: Transformer, prompt: torch.Tensor) -> AdaptedModel:
        return WithoutPrompt(model)
