"""The "absorb a context" protocol shared by every method that removes a prompt from the context.

    adapted = method.absorb(model, prompt_ids)   # pay once per prompt
    logits  = adapted(query_ids)                 # pay per query; the prompt is no longer in the context

`adapted` is an `AdaptedModel` (an nn.Module) that saves to and loads from a folder like any model
(safetensors weights and buffers + a JSON description). The two reference points speak the same protocol:
`KeepPrompt` (the prompt stays in the context) and `DropPrompt` (the prompt is simply removed).
"""

from __future__ import annotations

import dataclasses
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from ..config import build_options, check_float_limit, from_dict, parse_options, to_dict
from ..fileio import sha256_file
from ..models import Cache, Transformer, TransformerConfig
from ..models.lm import copy_cache, internals_reason, is_causal_lm
from ..registry import Registry
from ..runtime import dtype_name, parse_dtype

PEFT_FOLDER = "peft_adapter"  # where an absorb folder keeps an adapted model's PEFT form (AdaptedModel.peft_adapter)

# the registries a method package fills (incontext/registry.py): defining a method's class registers it in METHODS
# (by `name`), defining its adapted model's class in ADAPTED (by `method`: adapted.json names it), and a method
# with a PEFT form registers its export and load in PEFT_FORMS (register_peft_form, in its export.py)
METHODS: Registry[type["AbsorbMethod"]] = Registry("absorb method")
ADAPTED: Registry[type["AdaptedModel"]] = Registry("adapted model", known="known")


@dataclasses.dataclass(frozen=True)
class PeftForm:
    """How one method's adapted model is written as a PEFT adapter and read back (absorb/folder.py uses both).

    export(adapted, base, folder) -> absorb.json's note ({"written": True, ...} or {"written": False, "reason": ...})
    load(folder, model, note) -> the adapted model on `model` (ValueError naming the problem); `folder`: the absorb
    folder's PEFT_FOLDER, `note`: the export's note as absorb.json holds it."""

    export: Callable[["AdaptedModel", nn.Module, Path], dict[str, Any]]
    load: Callable[[Path, nn.Module, dict[str, Any]], "AdaptedModel"]


PEFT_FORMS: Registry[PeftForm] = Registry("PEFT form", known="methods with one")


def register_peft_form(adapted_type: type["AdaptedModel"], export, load) -> PeftForm:
    """Register the PEFT form (PeftForm's export and load) of the adapted models of `adapted_type`'s method."""
    return PEFT_FORMS.register(adapted_type.method, PeftForm(export, load))


class AdaptedModel(nn.Module, ABC):
    """A model with a prompt absorbed: forward(query) gives logits for the query tokens only."""

    method: ClassVar[str]
    # whether save() writes the base model's tensors too (a self-contained file); False: only this model's own
    # tensors (a K/V prefix of a few MB instead of the whole model), and load() needs the base it was absorbed into
    saves_base: ClassVar[bool] = True
    # the PEFT adapter alone stands for the adapted model in an absorb folder (no adapted.safetensors beside it)
    peft_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "method" in cls.__dict__:  # defining the class registers it (a base class without a method does not)
            ADAPTED.register(cls.method, cls)

    def __init__(self, base: nn.Module):
        super().__init__()
        self.base = base

    @abstractmethod
    def forward(self, query: torch.Tensor) -> torch.Tensor: ...

    def extra_state(self) -> dict[str, Any]:
        """JSON-able constructor arguments besides the base model (sizes of buffers, offsets)."""
        return {}

    def peft_adapter(self, base: nn.Module, folder: Path) -> dict[str, Any] | None:
        """Write this adapted model's PEFT form into `folder` (its method's export, registered beside the method with
        register_peft_form) and return absorb.json's note of it ({"written": True, ...} or {"written": False,
        "reason": ...}); None: the method has no PEFT form. `base`: the model it was absorbed into."""
        form = PEFT_FORMS.find(self.method)
        return None if form is None else form.export(self, base, folder)

    def query_cache(self) -> Cache | None:
        """A fresh cache from which `self.base(query, cache=cache)` gives `self(query)` and then decodes further
        tokens (generation at one base pass per token); None when there is none (re-run on the whole sequence)."""
        return None

    def kept_bytes(self, base: nn.Module) -> int:
        """Bytes this adapted model keeps per prompt beyond `base`: its tensors whose storage base does not own."""
        shared = {t.untyped_storage().data_ptr() for t in base.state_dict().values()}
        return tensor_bytes(t for t in self.state_dict().values() if t.untyped_storage().data_ptr() not in shared)

    @classmethod
    def empty(cls, base: Transformer, extra: dict[str, Any]) -> "AdaptedModel":
        """An instance with buffers of the right shapes, to load saved values into."""
        raise NotImplementedError

    def own_state(self) -> dict[str, torch.Tensor]:
        """What save() writes: the whole state, or without the base's tensors when `saves_base` is False."""
        state = self.state_dict()
        return state if self.saves_base else {k: v for k, v in state.items() if not k.startswith("base.")}

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        check_tensors(self.state_dict().items(), self.method)
        dtype = dtype_name(next(self.base.parameters()).dtype)
        backend = getattr(self.base, "backend", "incontext")
        description = {"method": self.method, "dtype": dtype, "backend": backend, "base_config": to_dict(self.base.config),
                       "extra": self.extra_state(), "base_saved": self.saves_base}
        try:
            json.dumps(description, allow_nan=False)
        except ValueError:
            raise ValueError(f"{self.method}: the adapted model's description holds a non-finite number; nothing was written") from None
        folder.mkdir(parents=True, exist_ok=True)
        if self.saves_base:
            save_model(self, str(folder / "adapted.safetensors"))
        else:
            save_file({k: v.detach().contiguous() for k, v in self.own_state().items()}, str(folder / "adapted.safetensors"))
        description["sha256"] = sha256_file(folder / "adapted.safetensors")
        (folder / "adapted.json").write_text(json.dumps(description, indent=2))
        return folder

    @staticmethod
    def load(folder: str | Path, base: nn.Module | None = None) -> "AdaptedModel":
        """The adapted model saved in `folder`. A model of the Hugging Face backend needs its `base` (a copy of it
        receives the saved tensors); ours is rebuilt from the saved config."""
        folder = Path(folder)
        if not (folder / "adapted.json").is_file():
            raise FileNotFoundError(f"{folder} holds no adapted model (adapted.json is missing)")
        try:
            description = json.loads((folder / "adapted.json").read_text())
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{folder / 'adapted.json'} is not valid JSON") from None
        where = folder / "adapted.json"
        if not isinstance(description, dict) or not isinstance(description.get("method"), str):
            raise ValueError(f"{where} is not an adapted model's description")
        cls = ADAPTED.find(description["method"])
        if cls is None:
            raise ValueError(f"{where}: unknown absorb method {description['method']!r}; known: {ADAPTED.names()}")
        for key, kind in (("dtype", str), ("backend", str), ("base_config", dict), ("extra", dict), ("sha256", str)):
            if not isinstance(description.get(key), kind):
                raise ValueError(f"{where} is corrupt: {key} is {'missing' if key not in description else 'not a ' + kind.__name__}"
                                 f"{' (no checksum of adapted.safetensors)' if key == 'sha256' else ''}")
        if description["backend"] not in ("incontext", "hf"):
            raise ValueError(f"{where} is corrupt: backend {description['backend']!r} is neither 'incontext' nor 'hf'")
        try:
            dtype = parse_dtype(description["dtype"])
        except ValueError as error:
            raise ValueError(f"{where} is corrupt: {error}") from None
        if description["backend"] == "hf" and base is None:
            raise ValueError(f"{folder} was absorbed into a Hugging Face model: load it with its base model")
        if description.get("base_saved", True) is False and base is None:
            raise ValueError(f"{folder} holds a {description['method']} without its base model: load it with the base "
                             "it was absorbed into (AdaptedModel.load(folder, base=model))")
        weights = folder / "adapted.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"{weights} is missing")
        if sha256_file(weights) != description["sha256"]:
            raise ValueError(f"{weights} is corrupt: its sha256 differs from the one recorded in adapted.json")
        try:
            return AdaptedModel._load(weights, description, cls, dtype, base)
        except (KeyError, TypeError, ValueError, RuntimeError, SafetensorError) as error:  # shapes, buffers, header
            raise ValueError(f"{where} and adapted.safetensors do not make an adapted model "
                             f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None

    @staticmethod
    def _load(weights: Path, description: dict[str, Any], cls: type["AdaptedModel"], dtype: torch.dtype,
              base: nn.Module | None) -> "AdaptedModel":
        if description.get("base_saved", True) is False:  # the file holds this model's own tensors; `base` is shared
            model = cls.empty(base, description["extra"])
            tensors = load_file(str(weights), device=str(next(base.parameters()).device))
            missing, unexpected = model.load_state_dict(tensors, strict=False)
            if unexpected or any(not name.startswith("base.") for name in missing):
                raise ValueError(f"the saved tensors do not fit a {description['method']} of this base (missing "
                                 f"{[n for n in missing if not n.startswith('base.')][:3]}, unexpected {unexpected[:3]})")
            return model.eval()
        if description["backend"] == "incontext":
            base_model = Transformer(from_dict(TransformerConfig, description["base_config"])).to(dtype)
            if base is not None:
                base_model = base_model.to(next(base.parameters()).device)
        else:
            import copy

            base_model = copy.deepcopy(base)
        model = cls.empty(base_model, description["extra"]).to(device=next(base_model.parameters()).device, dtype=dtype)
        load_model(model, str(weights), device=str(next(model.parameters()).device))
        return model.eval()


class ConversionError(ValueError):
    """A model cannot be converted (iclca, iclca-approx): the message says why and what to use instead."""


EXPLODED = 1e4  # an updated tensor whose largest |value| exceeds this many times what the base holds has exploded


def check_tensors(named, where: str, scale: float | dict[str, float] | None = None) -> None:
    """One-line ValueError naming the first floating tensor of `named` ((name, tensor) pairs) that holds NaN or an
    infinity, or whose largest |value| exceeds EXPLODED times its reference `scale` (one number for all, or per name;
    None: finiteness only). The one check before anything adapted is written (adapted models, PEFT adapters)."""
    for name, tensor in named:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{where}: {name} holds non-finite values (NaN or infinity); nothing was written "
                             "(lower the learning rate or the number of steps)")
        reference = scale.get(name) if isinstance(scale, dict) else scale
        if reference is not None:
            top = float(tensor.detach().abs().max())
            if top > EXPLODED * max(reference, torch.finfo(tensor.dtype).tiny):
                raise ValueError(f"{where}: the update exploded: {name} reaches |{top:.3g}|, more than {EXPLODED:g} times "
                                 f"the largest |value| before the update ({reference:.3g}); lower the learning rate")


def check_adapted(adapted: nn.Module, model: nn.Module, where: str) -> None:
    """Checks what absorbing `model` produced before it is used or saved: every tensor `adapted` does not share with
    `model` is finite, and those that update one of `model`'s tensors (same name, after `base.`, and shape), or that
    the adapted model says it trained from a start (`initial_scales`: name -> largest |value| at the start), have not
    grown EXPLODED times beyond the model's largest |value| (or that start)."""
    own = model.state_dict()
    shared = {t.untyped_storage().data_ptr() for t in own.values()}
    fresh = [(name, t) for name, t in adapted.state_dict().items()
             if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in shared]
    if not fresh:
        return
    check_tensors(fresh, where)
    scales = dict(getattr(adapted, "initial_scales", {}))
    updated = [name for name, t in fresh if own.get(name.removeprefix("base."), torch.empty(0)).shape == t.shape
               and name not in scales and t.is_floating_point()]
    if updated:
        largest = max((float(t.detach().abs().max()) for t in own.values() if t.is_floating_point() and t.numel()),
                      default=0.0)
        scales.update({name: largest for name in updated})
    check_tensors([(name, t) for name, t in fresh if name in scales], where, scales)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


@dataclasses.dataclass
class AbsorbInput:
    """The one input of every method's `_absorb`: what `absorb` checked. A method reads what it uses."""

    prompt: torch.Tensor  # (B, M) token ids or (B, M, d) vectors
    loss_mask: torch.Tensor | None = None  # (B, M) bool: the prompt positions whose next token a training method learns
    train_queries: list[torch.Tensor] | None = None  # queries a task provides to train on (never evaluation queries)
    train_groups: list[int] | None = None  # each training query's question id (its wordings share one)
    codec: Any = None  # the model's tokenizer (encode, decode; chat where it has a template), or None


@dataclasses.dataclass
class NoOptions:
    """The options of a method that takes none."""


class AbsorbMethod(ABC):
    """A way to absorb a prompt into a model. Subclasses set `name` (the registry key), `summary` (what the
    method does with the context, one line) and `needs` (what it needs of the model), which `compare --help`,
    `absorb --help` and `absorb --list` show (through cli/catalog.json), `Options` (a dataclass of the
    constructor's keyword options with their types, defaults and ranges: `get_absorb_method` checks given options
    against it through config.parse_options), and implement `_absorb` for one prompt (or, with `batched = True`,
    for a batch of prompts); `absorb` checks the input once for every method. Why a method does not apply to a
    given model is `unsupported(model)` (the harness's "n/a: <reason>")."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions
    needs: ClassVar[str] = "a causal LM"
    batched: ClassVar[bool] = False  # _absorb takes (B, M) prompts; otherwise one prompt at a time
    long_prompts: ClassVar[bool] = False  # absorbs a prompt longer than the model's context (in chunks)
    takes_codec: ClassVar[bool] = False  # it reads the codec and the training questions (its data stage writes text)

    def __init__(self, *, progress: bool = True, **options):
        """The one constructor of every method: `options` (Python values, or YAML scalars from `--set`) checked
        through `Options` (config.parse_options: one-line errors naming the option), the defaults filled in and each
        kept in `self.options` (a nested options class, such as the distillers' `study`, as its instance); then `setup`.
        `progress`: the method's progress bars. (The distillers also take `speed` and `writer`: distill.Distiller.)"""
        if not isinstance(progress, bool):
            raise ValueError(f"{self.name}: progress must be true or false, got {progress!r}")
        self.progress = progress
        self._set_options(options)
        self.setup()

    def setup(self) -> None:
        """What a method derives from its options once they are set (checks across them, loaded files)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # defining the class registers it (a base class without a name does not)
            METHODS.register(cls.name, cls)

    needs_internals: ClassVar[bool] = False  # runs on our Transformer (model.as_transformer()), not the protocol alone

    def _set_options(self, options: dict[str, Any]) -> None:
        """`options` checked through `Options` (config.parse_options, the one check of every method's options, from
        Python as from `--set`: one-line errors naming the option) into `self.options`, the defaults filled in: the one
        place they live (a method reads `self.options.steps`)."""
        given = parse_options(self.Options, options, where=self.name)
        self.given_options = given  # converted to their types, nested ones as "study.x" (check_options_fit)
        self.options = build_options(self.Options, given)  # every option (results record them: harness.compare)

    def check_options_fit(self, model: nn.Module) -> None:
        """One-line ValueError naming the first float option given a value that the dtype of `model`'s weights cannot
        hold (|value| above its largest finite number: a float32 model takes no learning_rate=1e300); the range
        checks of parse_options know no model, this one runs where the model is known (absorb, `incontext absorb`)."""
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        if dtype is not None:
            check_float_limit(self.Options, getattr(self, "given_options", {}), torch.finfo(dtype).max, self.name,
                              f"the largest finite {dtype_name(dtype)}: the model's dtype")

    def learns_nothing(self) -> str | None:
        """Why an absorb with these options would hold nothing of the prompt (a count of zero that leaves the result
        the base model, e.g. distill-lora's steps=0: B factors still zero), else None. `incontext absorb` refuses
        such an absorb rather than write a no-op that looks like a result; from Python (and in `compare`) the
        untrained result stays a reference point."""
        return None

    @property
    def needs_train_groups(self) -> bool:
        """Whether an absorb needs train_groups (a distiller's `wording_ensemble`): callers without them refuse the
        method in one line rather than let the option be ignored."""
        return False

    def runs_on(self, model: nn.Module) -> nn.Module:
        """The model the method works on: `model` itself, or for a method that needs our internals its conversion
        to our Transformer (ValueError naming why there is none)."""
        if self.needs_internals and is_causal_lm(model):
            return model.as_transformer()
        return model

    def unsupported(self, model: nn.Module) -> str | None:
        """None when the method applies to `model` (either backend), else why not (e.g. "needs linear attention")."""
        if self.needs_internals and is_causal_lm(model):
            reason = internals_reason(model)
            if reason is not None:
                return reason
        return self.check_model(self.runs_on(model))

    def check_model(self, model: nn.Module) -> str | None:
        """What the method needs of the model it runs on (see `runs_on`); subclasses narrow it."""
        if not is_causal_lm(model):
            return f"needs a causal LM, got {type(model).__name__}"
        return None

    def absorb(self, model: nn.Module, prompt: torch.Tensor, *, loss_mask: torch.Tensor | None = None,
               train_queries: list[torch.Tensor] | None = None, codec=None,
               train_groups: list[int] | None = None) -> AdaptedModel:
        """Absorb `prompt` ((M,) or (B, M) token ids; (M, d) or (B, M, d) vectors for a vector model) into
        `model`; the result answers queries without the prompt. `loss_mask` ((M,) or (B, M) bool) marks
        the prompt positions whose next token a training-based method learns (None: all); `train_queries`
        are task-provided queries a method may train on (never the evaluation queries); `codec` is the model's
        tokenizer (encode, decode; chat where it has a template): a method whose data stage writes text
        (`takes_codec`: distill-lora, kv-prefix) then also trains on questions about the prompt, the others
        ignore it. `incontext absorb` and the harness both give it, so both run the same algorithm. `train_groups`
        (one int per training query; the wordings of one question share it) tells such a method which training
        queries ask the same question (None: each query its own; its `wording_ensemble` option needs them)."""
        self.check_options_fit(model)
        reason = self.unsupported(model)
        if reason is not None:
            raise ValueError(f"{self.name} does not apply to this model: {reason}")
        if codec is not None and not (hasattr(codec, "encode") and hasattr(codec, "decode")):
            raise ValueError(f"{self.name}: the codec must be a tokenizer with encode and decode, "
                             f"got {type(codec).__name__}")
        if train_groups is not None:
            train_groups = [int(g) for g in train_groups]
            if len(train_groups) != len(train_queries or []):
                raise ValueError(f"{self.name}: train_groups has {len(train_groups)} ids for "
                                 f"{len(train_queries or [])} training queries")
        if self.needs_train_groups and train_groups is None:  # it would be ignored: say so
            raise ValueError(f"{self.name}: study.wording_ensemble=true needs train_groups (one question id per training "
                             "query); none were given")
        model = self.runs_on(model)
        prompt = check_prompt(model, prompt, long=self.long_prompts)
        if self.takes_codec:  # a method that trains on them: 1-D id tensors that fit after the prompt
            train_queries = check_train_queries(self.name, train_queries, prompt.shape[1], max_context(model),
                                                self.long_prompts)
        if loss_mask is not None:
            loss_mask = loss_mask.to(torch.bool)
            if loss_mask.dim() == 1:
                loss_mask = loss_mask[None].expand(prompt.shape[0], -1)
            if tuple(loss_mask.shape) != tuple(prompt.shape[:2]):
                raise ValueError(f"loss_mask has shape {tuple(loss_mask.shape)}; the prompt is {tuple(prompt.shape[:2])}")
        given = AbsorbInput(prompt, loss_mask, train_queries, train_groups, codec)
        if self.batched or prompt.shape[0] == 1:
            return self._checked(model, self._absorb(model, given))
        return PerPrompt([self._checked(model, self._absorb(model, dataclasses.replace(
            given, prompt=prompt[i: i + 1], loss_mask=None if loss_mask is None else loss_mask[i: i + 1])))
            for i in range(prompt.shape[0])])

    def _checked(self, model: nn.Module, adapted: AdaptedModel) -> AdaptedModel:
        check_adapted(adapted, model, self.name)
        return adapted

    @abstractmethod
    def _absorb(self, model: nn.Module, given: "AbsorbInput") -> AdaptedModel:
        """Absorb `given` (its prompt checked and batched, (B, M) or (B, M, d); B == 1 unless the method is
        `batched`) into `model` (the model the method runs on: runs_on)."""


def max_context(model: nn.Module) -> int | None:
    """The longest sequence the model takes (its configured context, max_seq_len), or None."""
    config = getattr(model, "config", None)
    return getattr(config, "max_seq_len", None)


def check_prompt(model: nn.Module, prompt: torch.Tensor, long: bool = False) -> torch.Tensor:
    """The prompt as a batch ((B, M) ids or (B, M, d) vectors); one-line errors for what cannot be a prompt (one the
    model's context does not hold, unless `long`: a method that reads it in chunks)."""
    if not isinstance(prompt, torch.Tensor):
        raise TypeError(f"the prompt must be a tensor, got {type(prompt).__name__}")
    tokens = getattr(getattr(model, "config", None), "tokens", True)
    if tokens:
        if prompt.is_floating_point() or prompt.dtype == torch.bool or prompt.dim() not in (1, 2):
            raise ValueError(f"the prompt must be token ids of shape (M,) or (B, M); got {tuple(prompt.shape)} {prompt.dtype}")
        prompt = prompt[None] if prompt.dim() == 1 else prompt
    else:
        if not prompt.is_floating_point() or prompt.dim() not in (2, 3):
            raise ValueError(f"the prompt must be float vectors of shape (M, d) or (B, M, d); got {tuple(prompt.shape)} {prompt.dtype}")
        prompt = prompt[None] if prompt.dim() == 2 else prompt
        if not bool(torch.isfinite(prompt).all()):
            raise ValueError("the prompt holds NaN or infinite values")
    if prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError("the prompt is empty: there is nothing to absorb")
    limit = max_context(model)
    if limit is not None and prompt.shape[1] >= limit and not long:
        raise ValueError(f"the prompt has {prompt.shape[1]} tokens; the model's context holds {limit} "
                         "(and the query needs room after the prompt)")
    return prompt


def check_train_queries(name: str, queries, m: int, limit: int | None, long: bool = False) -> list[torch.Tensor]:
    """The training queries as 1-D int64 id tensors ((1, L) rows taken as (L,)); one-line errors for one that is no
    sequence of ids, or (unless `long`) does not fit the model's context (`limit`) after the m-token prompt."""
    out = []
    for i, query in enumerate(queries or []):
        if not isinstance(query, torch.Tensor) or query.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"{name}: train_queries[{i}] must be a tensor of token ids")
        query = query[0] if query.dim() == 2 and query.shape[0] == 1 else query
        if query.dim() != 1 or query.shape[0] == 0:
            raise ValueError(f"{name}: train_queries[{i}] must be a non-empty 1-D sequence, got shape {tuple(query.shape)}")
        if not long and limit is not None and m + query.shape[0] > limit:
            raise ValueError(f"{name}: train_queries[{i}] ({query.shape[0]} tokens) after the {m}-token prompt "
                             f"exceeds max_seq_len={limit}")
        out.append(query.long())
    return out


class PerPrompt(AdaptedModel):
    """Several prompts absorbed one at a time: row i of a query batch runs through adapted model i."""

    method = "per-prompt"

    def __init__(self, adapted: list[AdaptedModel]):
        nn.Module.__init__(self)
        self.adapted = nn.ModuleList(adapted)
        self.base = adapted[0].base

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        if query.shape[0] != len(self.adapted):
            raise ValueError(f"{len(self.adapted)} prompts were absorbed; the query batch has {query.shape[0]} rows")
        return torch.cat([model(query[i : i + 1]) for i, model in enumerate(self.adapted)])

    def save(self, folder: str | Path) -> Path:
        raise NotImplementedError("save each prompt's adapted model (PerPrompt.adapted[i]) on its own")


def absorb_methods() -> list[str]:
    return METHODS.names()


def method_options(name: str) -> list[str]:
    """The names of a method's options (the fields of its `Options` dataclass; a nested options class as
    "study.*")."""
    return [f"{f.name}.*" if dataclasses.is_dataclass(f.default_factory) else f.name
            for f in dataclasses.fields(METHODS.get(name).Options)]


def method_class(name: str) -> type[AbsorbMethod]:
    """The registered class of method `name` (KeyError naming the registered ones)."""
    return METHODS.get(name)


def get_absorb_method(name: str, *, progress: bool = True, **options) -> AbsorbMethod:
    """The method `name` with `options` (Python values, or YAML scalars from `--set KEY=VALUE`) checked and converted
    through the method's `Options` (config.parse_options): one-line ValueError for an unknown option, a value of
    the wrong type, a non-finite number or one out of range."""
    return method_class(name)(progress=progress, **options)


# ----------------------------------------------------------------------------- the two reference points


class PromptInContext(AdaptedModel):
    """The prompt stays in the context: its keys/values (or linear state) are cached once, and each query
    continues from a copy of that cache (the cost the other methods try to avoid)."""

    method = "keep-prompt"

    def __init__(self, base: nn.Module, prompt: torch.Tensor):
        super().__init__(base)
        self.register_buffer("prompt", prompt)
        self._cache: Cache | None = None

    def prompt_cache(self) -> Cache:
        if self._cache is None:
            with torch.no_grad():
                self._cache = self.base.prefill(self.prompt)
        return copy_cache(self._cache)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, cache=self.prompt_cache())

    def query_cache(self) -> Cache:
        return self.prompt_cache()

    def extra_state(self) -> dict[str, Any]:
        return {"prompt_shape": list(self.prompt.shape)}

    def kept_bytes(self, base: nn.Module) -> int:
        """The K/V cache (or linear-attention state) of the prompt: what keeping it in context costs."""
        cache = self.prompt_cache()
        return sum(tensor_bytes(layer if isinstance(layer, tuple) else vars(layer).values()) for layer in cache.layers)

    @classmethod
    def empty(cls, base, extra):
        return cls(base, torch.zeros(extra["prompt_shape"], dtype=torch.long, device=next(base.parameters()).device))


class BaseAlone(AdaptedModel):
    """The base model alone answers the queries, which start at position 0 (no prompt in the context); a
    subclass names its `method`."""

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer)

    @classmethod
    def empty(cls, base, extra):
        return cls(base)


