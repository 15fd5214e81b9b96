"""distill-lora's export: the distilled adapter as a PEFT LoRA folder for the family's own transformers class (on the
Llama or GPT-2 export of our Transformer, or directly on the Hugging Face backend), and back (load_peft_adapter).
The shared pieces (attach_lora, save_adapter, the fused-projection split) are interop/lora_export.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from ....fileio import sha256_file
from ....interop.lora_export import Factors, attach_lora, save_adapter
from ...protocol import PEFT_FOLDER, check_tensors, register_peft_form
from .adapted import DistilledLoRA


def hf_lora_factors(adapted: DistilledLoRA, family: str | None = None) -> tuple[Factors, bool]:
    """The adapter's factors named as in the family's transformers class (families table; default: the first family
    our base exports to), and whether they need fan_in_fan_out."""
    from ....interop.hf import export_family, exported_families
    from ....models.families import FAMILIES, to_family_factors

    if family is None:
        family = export_family(adapted.base)[0]
    if family not in exported_families():
        raise ValueError(f"family must be one our Transformer exports to ({', '.join(exported_families())}), got {family!r}")
    fused = {name: (b.detach(), a.detach(), None) for name, (a, b) in adapted.lora_factors().items()}
    return to_family_factors(family, adapted.base.config, fused), FAMILIES.get(family).fan_in_fan_out


def peft_adapter_model(adapted: DistilledLoRA, hf_base, family: str | None = None):
    """`hf_base` (the Hugging Face export of the model the adapter was distilled on, e.g. `to_hf_llama(model)`)
    with the distilled adapter, as a PeftModel; hf_base gets the LoRA layers in place."""
    factors, fan_in_fan_out = hf_lora_factors(adapted, family or hf_base.config.model_type)
    return attach_lora(hf_base, factors, adapted.spec.rank, adapted.spec.alpha, fan_in_fan_out=fan_in_fan_out)


def save_hf_backend_adapter(adapted: DistilledLoRA, base_lm, folder: str | Path) -> Path:
    """The adapter of a distilled LoRA trained on the Hugging Face backend (peft layers on the family's own modules
    of `base_lm`, the unchanged model it was absorbed into) as a PEFT folder for
    `PeftModel.from_pretrained(<the family's transformers model>, folder)`."""
    import copy

    factors = {name.removeprefix("hf."): (b.detach(), a.detach(), None) for name, (a, b) in adapted.lora_factors().items()}
    fan_in_fan_out = bool(base_lm.family and base_lm.family.fan_in_fan_out)
    peft_model = attach_lora(copy.deepcopy(base_lm.hf), factors, adapted.spec.rank, adapted.spec.alpha,
                             fan_in_fan_out=fan_in_fan_out)
    return save_adapter(peft_model, folder)


def save_peft_adapter(adapted: DistilledLoRA, hf_base, folder: str | Path, family: str | None = None) -> Path:
    """Save the distilled adapter as a PEFT folder for `PeftModel.from_pretrained(hf_base, folder)`; hf_base
    gives the module layout and is handed back without the LoRA layers."""
    peft_model = peft_adapter_model(adapted, hf_base, family)
    folder = save_adapter(peft_model, folder)
    peft_model.unload()  # take the LoRA layers out of hf_base again
    return folder


def load_peft_adapter(folder: str | Path, model, offset: int) -> DistilledLoRA:
    """The inverse of `save_peft_adapter`: the PEFT folder of a distilled adapter, put back on (a copy of) `model`, the
    base it was distilled on, as a merged DistilledLoRA whose queries start at position `offset` (the absorbed
    prompt's length). Same logits as `PeftModel.from_pretrained(<the export of model>, folder)` without transformers
    or a second copy of the base. A ValueError naming the problem for an adapter that is not a plain LoRA, does not
    parse, or does not fit `model` (another base model)."""
    import copy

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from ...lora import LoRASpec

    folder = Path(folder)
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
    except FileNotFoundError:
        raise ValueError(f"{folder}: adapter_config.json is missing") from None
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{folder}: adapter_config.json is corrupt") from None
    if config.get("peft_type") != "LORA" or any(config.get(k) for k in ("use_dora", "use_rslora", "lora_bias")):
        raise ValueError(f"{folder}: not a plain LoRA adapter (peft_type {config.get('peft_type')!r}, DoRA, rsLoRA or "
                         "bias shifts are not supported)")
    try:
        tensors = load_file(str(folder / "adapter_model.safetensors"))
    except FileNotFoundError:
        raise ValueError(f"{folder}: adapter_model.safetensors is missing") from None
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{folder}: adapter_model.safetensors is corrupt ({str(error).splitlines()[0]})") from None

    if getattr(model, "backend", "incontext") == "hf":
        factors = _hf_backend_factors(folder, tensors, model, rank)
    else:
        factors = _our_factors(folder, tensors, model, rank)

    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    spec = LoRASpec(rank, alpha, tuple(sorted(factors, key=order.__getitem__)))
    dtype = next(model.parameters()).dtype
    adapted = DistilledLoRA(copy.deepcopy(model), spec, offset, merged=True)
    stored = adapted.lora_factors()
    with torch.no_grad():
        for name, (a, b) in factors.items():
            stored[name][0].copy_(a)
            stored[name][1].copy_(b)
            weight = adapted.base.get_submodule(name).weight
            delta = spec.scaling * (b.to(dtype) @ a.to(dtype))  # as peft's merge: W + (alpha / r) B A
            weight += delta if isinstance(adapted.base.get_submodule(name), torch.nn.Linear) else delta.T  # Conv1D: (in, out)
    return adapted.eval()


def _hf_backend_factors(folder: Path, tensors: dict[str, torch.Tensor], model, rank: int) -> dict[str, tuple]:
    """Module of the wrapped transformers model -> (A, B), from a PEFT folder saved for that family."""
    from ...lora import linear_shape

    pieces: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        name, dot, factor = key.rpartition(".lora_")
        if not (dot and key.startswith("base_model.model.") and factor in ("A.weight", "B.weight")):
            raise ValueError(f"{folder}: tensor {key!r} is not a LoRA factor")
        pieces.setdefault("hf." + name.removeprefix("base_model.model."), {})[factor[0]] = value
    if not pieces:
        raise ValueError(f"{folder}: the adapter holds no LoRA factors")
    factors = {}
    for name, found in pieces.items():
        try:
            layer = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{folder} was made for another base model (this one has no {name.removeprefix('hf.')})") from None
        if sorted(found) != ["A", "B"]:
            raise ValueError(f"{folder}: {name.removeprefix('hf.')} lacks one of its two factors")
        n_in, n_out = linear_shape(layer)
        a, b = found["A"], found["B"]
        if a.shape != (rank, n_in) or b.shape != (n_out, rank):
            raise ValueError(f"{folder} was made for another base model ({name.removeprefix('hf.')}: factors "
                             f"{tuple(a.shape)} and {tuple(b.shape)} do not fit {n_out} x {n_in} at rank {rank})")
        factors[name] = (a.to(layer.weight.device), b.to(layer.weight.device))
    return factors


def _our_factors(folder: Path, tensors: dict[str, torch.Tensor], model, rank: int) -> dict[str, tuple]:
    """Fused module of our Transformer -> (A, B), from a PEFT folder for its Llama or GPT-2 export (the adapter's
    own module names tell which)."""
    from ....interop.hf import exported_families
    from ....models.families import FAMILIES, from_family_parts

    exported = exported_families()  # the layouts our exports write
    family = next((name for name in exported if any(k.startswith(f"base_model.model.{FAMILIES.get(name).blocks}.")
                                                    for k in tensors)), exported[0])
    blocks, parts, parts_per_role = from_family_parts(family)
    prefix = f"base_model.model.{blocks}."
    pieces: dict[str, dict[int, dict[str, torch.Tensor]]] = {}  # our module -> part -> {"A", "B"}
    for key, value in tensors.items():
        name, dot, factor = key.rpartition(".lora_")
        index, _, hf_module = name.removeprefix(prefix).partition(".")
        if not (dot and key.startswith(prefix) and index.isdigit() and hf_module in parts and factor in ("A.weight", "B.weight")):
            raise ValueError(f"{folder}: tensor {key!r} is not a LoRA factor of a {family} model like this one")
        module, part = parts[hf_module]
        pieces.setdefault(f"blocks.{index}.{module}", {}).setdefault(part, {})[factor[0]] = value
    if not pieces:
        raise ValueError(f"{folder}: the adapter holds no LoRA factors")
    factors = {}
    for name, found in pieces.items():
        try:
            linear = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{folder} was made for another base model (this one has no {name})") from None
        n_parts = parts_per_role[name.split(".", 2)[2]]
        if sorted(found) != list(range(n_parts)) or any(sorted(f) != ["A", "B"] for f in found.values()):
            raise ValueError(f"{folder}: the adapter does not cover all parts of {name} with both factors")
        a = found[0]["A"]
        if any(not torch.equal(found[i]["A"], a) for i in found):  # incontext exports one A per fused projection
            raise ValueError(f"{folder}: the parts of {name} have different A factors (not an adapter incontext wrote)")
        b = torch.cat([found[i]["B"] for i in range(n_parts)])
        if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
            raise ValueError(f"{folder} was made for another base model ({name}: factors {tuple(a.shape)} and "
                             f"{tuple(b.shape)} do not fit a {linear.out_features} x {linear.in_features} weight at rank {rank})")
        factors[name] = (a.to(linear.weight.device), b.to(linear.weight.device))
    return factors


def peft_note(adapted: DistilledLoRA, model, folder: Path) -> dict[str, Any]:
    """The distilled adapter as a PEFT folder for the family's own transformers class: directly on the Hugging Face
    backend, through the export of our Transformer (the first family in the table that takes it) otherwise."""
    from ....interop.hf import export_family

    check_tensors(((f"{name}.lora_{ab}", t) for name, pair in adapted.lora_factors().items() for ab, t in zip("AB", pair)),
                  "distill-lora")  # absorb checked the adapted model; the adapter's own tensors again, as written
    if getattr(model, "backend", "incontext") == "hf":
        if model.family is None:
            return {"written": False, "reason": f"model_type {model.config.model_type!r} is not in the families table"}
        save_hf_backend_adapter(adapted, model, folder)
        family, cls = model.family.model_type, type(model.hf).__name__
    else:
        try:
            chosen, hf_base = export_family(model)
        except ValueError as error:  # e.g. linear attention: no transformers counterpart
            if folder.is_dir():
                shutil.rmtree(folder)
            return {"written": False, "reason": str(error)}
        save_peft_adapter(adapted, hf_base, folder, chosen)
        family, cls = chosen, type(hf_base).__name__
    return {"written": True, "family": family, "folder": PEFT_FOLDER, "query_position": adapted.offset,
            "sha256": sha256_file(folder / "adapter_model.safetensors"),
            "load": f"PeftModel.from_pretrained(<the base as transformers' {cls}>, '{PEFT_FOLDER}'); "
                    f"queries at positions from query_position on"}


def load_peft_note(folder: Path, model, note: dict[str, Any]) -> DistilledLoRA:
    """The PEFT adapter in `folder` (an absorb folder's peft_adapter/) merged into a copy of `model`, its queries at
    the note's query_position (absorb.json's peft_adapter: what peft_note wrote)."""
    offset = note.get("query_position")
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{Path(folder).parent}: absorb.json records no query_position for the PEFT adapter")
    return load_peft_adapter(folder, model, offset)


register_peft_form(DistilledLoRA, export=peft_note, load=load_peft_note)  # how absorb folders write and read it
