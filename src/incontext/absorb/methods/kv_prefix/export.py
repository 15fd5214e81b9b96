"""A trained K/V prefix (absorb/methods/kv_prefix/method.py) on the Hugging Face backend as a PEFT CARTRIDGE adapter, and back.

    save_cartridge(adapted, folder)           # adapter_config.json + adapter_model.safetensors, written by peft itself
    peft_model = PeftModel.from_pretrained(<the family's transformers model>, folder)
    adapted = load_cartridge(folder, model)   # a TrainedPrefix on `model` (an HFCausalLM) again

peft builds the adapter (CartridgeConfig on the wrapped transformers model), takes our per-layer K/V through its own
`initialize_kv_prefix_from_past_key_values` and saves it with `save_pretrained`: one flattened tensor
`prompt_embeddings` of shape (num_virtual_tokens, layers * 2 * kv_heads * head_dim), layer i's keys at slot 2i and its
values at 2i + 1; the keys after RoPE, as both caches hold them.

Positions: peft serves a CARTRIDGE as a cache of its num_virtual_tokens = n tokens (positions 0..n-1) and shifts the
queries' position ids by n (its forward also prepends n ones to the attention mask); our prefix sits at 0..p-1 with
queries from p, so n = p. A model that reads its BOS first (Gemma, Llama 3: HFCausalLM.read_bos_first) holds the
BOS's K/V at position 0 before the prefix, so n = p + 1 and the cartridge carries it: give peft the query without a
BOS. A sliding-window layer keeps only its last positions; it is written with zeros in front (positions its window
no longer reaches, in peft's cache as in ours) and read back from its last positions. A family whose layers hold K/V
of different shapes has no single CARTRIDGE layout: a one-line ValueError names it (none of the families table).

Training stays on our loop (KVPrefix): it trains these same K/V tensors through the causal-LM protocol, for our
Transformer (CUDA graphs, autocast casts) and transformers' models alike, and the round trip (tests/interop/
test_cartridge.py) checks that what it writes is the cartridge peft serves. peft's CartridgeEncoder holds the same
numbers as one flattened parameter (frozen first tokens apart) and is trained only through PeftModel's forward on a
transformers model, so it would add a second training path for one backend without changing what is learned.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from ....fileio import sha256_file
from ....models.lm import cache_kv, with_kv
from ...protocol import PEFT_FOLDER, register_peft_form
from .adapted import TrainedPrefix

PEFT_TYPE = "CARTRIDGE"


def _peft():
    """peft's CARTRIDGE pieces, or a ValueError naming what is missing."""
    try:
        from peft import CartridgeConfig, PeftConfig, get_peft_model
        from peft.tuners.cartridge.utils import (
            initialize_kv_prefix_from_past_key_values,
        )
        from peft.utils.save_and_load import load_peft_weights
    except ImportError:
        raise ValueError("a PEFT CARTRIDGE needs a peft with CARTRIDGE adapters (0.21 has them); the installed one has none") from None
    return CartridgeConfig, PeftConfig, get_peft_model, initialize_kv_prefix_from_past_key_values, load_peft_weights


def _bos_shift(model) -> int:
    return int(getattr(model, "bos_id", None) is not None)


def _check_model(model) -> None:
    if getattr(model, "backend", None) != "hf":
        raise ValueError("a PEFT CARTRIDGE serves a transformers model (the Hugging Face backend); a prefix of our "
                         "Transformer saves as adapted.safetensors")
    if model.family is None:
        from ....models.families import FAMILIES

        raise ValueError(f"model_type {model.config.model_type!r} is not in the families table ({', '.join(FAMILIES)})")


def _sliding(model, layer: int) -> bool:
    """Whether the transformers model's layer `layer` is a sliding-window layer (it keeps only its last positions)."""
    config = model.hf.config
    types = getattr(config, "layer_types", None)
    if types:
        return types[layer] == "sliding_attention"
    return bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True)


def cartridge_kv(adapted: TrainedPrefix) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    """The prefix's K/V per layer ((1, kv_heads, n, head_dim) each) as a cartridge holds them, and n (the query's first
    position: the prefix's length, plus the BOS a model that reads one first holds). A ValueError naming the family
    where the layers' K/V shapes differ, or where a layer holds positions the queries do not follow."""
    model = adapted.base
    _check_model(model)
    name = model.config.model_type
    n = adapted.position + _bos_shift(model)
    state = adapted.state()
    kv = cache_kv(state)
    shapes = {(k.shape[1], k.shape[3]) for k, _ in kv} | {(v.shape[1], v.shape[3]) for _, v in kv}
    if len(shapes) != 1:
        raise ValueError(f"model_type {name}: its layers hold K/V of different shapes ({sorted(shapes)} as (heads, "
                         "head_dim)); a PEFT CARTRIDGE holds one shape for every layer")
    out = []
    for i, (layer, (k, v)) in enumerate(zip(state.layers, kv)):
        held = k.shape[-2]
        seen = getattr(layer, "seen", held)
        if getattr(layer, "keep", None) is not None:
            raise ValueError(f"layer {i} of this prefix keeps a different number of pairs in each head (a press start "
                             "such as KVzip's); a PEFT CARTRIDGE attends to every pair it holds, so it has no layout for it")
        if held > n or seen != n:
            raise ValueError(f"model_type {name}: layer {i} of this prefix holds {seen} positions but its queries start at "
                             f"{n}; a PEFT CARTRIDGE's queries follow every position it holds")
        if held < n and not _sliding(model, i):
            raise ValueError(f"this prefix holds {held} pairs whose queries start at position {n} (a press start keeps "
                             "pairs of the whole document at their own positions); a PEFT CARTRIDGE's queries follow "
                             "the pairs it holds, so it has no layout for it (init=press-rerotated has one)")
        if held < n:  # a sliding window kept its last positions: the earlier ones, out of every query's reach, as zeros
            pad = k.new_zeros(k.shape[0], k.shape[1], n - held, k.shape[3])
            k, v = torch.cat([pad, k], 2), torch.cat([pad.to(v.dtype), v], 2)
        out.append((k.detach(), v.detach()))
    return out, n


def peft_cartridge_model(adapted: TrainedPrefix, hf_model, num_frozen_tokens: int = 1):
    """`hf_model` (the prefix's base as transformers' model, or a copy of it) as a PeftModel whose CARTRIDGE holds the
    prefix: CartridgeConfig sized by peft from the model's config, the K/V loaded by peft's
    initialize_kv_prefix_from_past_key_values. peft freezes hf_model's parameters (prompt learning)."""
    CartridgeConfig, _, get_peft_model, initialize, _ = _peft()
    kv, n = cartridge_kv(adapted)
    name = adapted.base.config.model_type
    config = CartridgeConfig(task_type="CAUSAL_LM", num_virtual_tokens=n, num_frozen_tokens=min(max(num_frozen_tokens, 0), n))
    with torch.random.fork_rng(devices=[]):  # peft initialises the encoder from the global generator; values replaced
        peft_model = get_peft_model(hf_model, config)
    sized = peft_model.peft_config[peft_model.active_adapter]
    heads, head_dim = kv[0][0].shape[1], kv[0][0].shape[3]
    if (sized.num_layers, sized.num_attention_heads, sized.token_dim) != (len(kv), heads, heads * head_dim):
        raise ValueError(f"model_type {name}: peft sizes its CARTRIDGE as {sized.num_layers} layers of "
                         f"{sized.num_attention_heads} heads and {sized.token_dim} values per token, but its cache holds "
                         f"{len(kv)} layers of {heads} K/V heads of {head_dim}")
    encoder = peft_model.prompt_encoder[peft_model.active_adapter]
    encoder.to(kv[0][0].dtype)  # the prefix's own dtype: written as it is (peft casts to the model's dtype to serve)
    initialize(peft_model, past_key_values=kv)
    return peft_model.eval()


def on_transformers_twin(adapted: TrainedPrefix) -> TrainedPrefix:
    """A prefix of our Transformer as the same prefix (the same tensors) on its transformers twin (interop.hf.hf_twin,
    on the Hugging Face backend); a ValueError naming why where our Transformer exports to no family."""
    from ....interop.hf import hf_twin, wrap_hf

    try:
        twin = hf_twin(adapted.base)
    except ValueError as error:
        raise ValueError(f"this model has no transformers form for a PEFT CARTRIDGE ({error})") from None
    return TrainedPrefix(wrap_hf(twin).eval(), adapted.state())


def save_cartridge(adapted: TrainedPrefix, folder: str | Path, num_frozen_tokens: int = 1) -> dict[str, Any]:
    """The prefix as a PEFT CARTRIDGE folder (what `PeftModel.save_pretrained` writes: adapter_config.json,
    adapter_model.safetensors, README.md), built by peft on the prefix's own transformers model (its parameters'
    requires_grad flags are put back after). Returns num_virtual_tokens and the family; a ValueError (one line)
    where peft's CARTRIDGE cannot serve the model. A prefix of our Transformer is written for its transformers twin
    (the family it exports to: the shipped SmolLM2 as Llama; `incontext export-model` writes that base)."""
    if getattr(adapted.base, "backend", None) != "hf":
        adapted = on_transformers_twin(adapted)
    model = adapted.base
    cartridge_kv(adapted)  # refused before peft touches the model
    hf = model.hf
    flags = [p.requires_grad for p in hf.parameters()]
    try:
        peft_model = peft_cartridge_model(adapted, hf, num_frozen_tokens)
        folder = Path(folder)
        peft_model.save_pretrained(str(folder))
        n = peft_model.peft_config[peft_model.active_adapter].num_virtual_tokens
    finally:
        for p, flag in zip(hf.parameters(), flags):
            p.requires_grad_(flag)
    return {"num_virtual_tokens": int(n), "family": model.family.model_type, "class": type(hf).__name__}


@torch.no_grad()
def load_cartridge(folder: str | Path, model) -> TrainedPrefix:
    """The PEFT CARTRIDGE in `folder` (written by save_cartridge, composed by peft's compose_cartridge_adapters, or
    trained with peft) as a TrainedPrefix on `model` (an HFCausalLM of the base it was made for; shared, not copied):
    its queries start at num_virtual_tokens, as peft's. Read with peft's own PeftConfig and load_peft_weights; a
    ValueError naming the problem for another adapter type or a cartridge of another model's shapes."""
    _, PeftConfig, _, _, load_peft_weights = _peft()
    _check_model(model)
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder}: adapter_config.json is missing")
    try:
        config = PeftConfig.from_pretrained(str(folder))
    except (ValueError, TypeError, KeyError, OSError) as error:
        raise ValueError(f"{folder}: adapter_config.json is corrupt ({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    peft_type = getattr(config.peft_type, "value", config.peft_type)
    if peft_type != PEFT_TYPE:
        raise ValueError(f"{folder}: not a CARTRIDGE adapter (peft_type {peft_type!r})")
    device = next(model.parameters()).device
    try:
        embeddings = load_peft_weights(str(folder), device="cpu")["prompt_embeddings"]
    except KeyError:
        raise ValueError(f"{folder}: the adapter holds no prompt_embeddings") from None
    except Exception as error:  # safetensors' and torch's own errors for a missing or damaged file
        raise ValueError(f"{folder}: adapter_model.safetensors is missing or corrupt ({type(error).__name__})") from None
    n, layers, heads = int(config.num_virtual_tokens), int(config.num_layers), int(config.num_attention_heads)
    head_dim = int(config.token_dim) // heads
    if tuple(embeddings.shape) != (n, layers * 2 * heads * head_dim):
        raise ValueError(f"{folder} is corrupt: prompt_embeddings has shape {tuple(embeddings.shape)}, its config says "
                         f"({n}, {layers * 2 * heads * head_dim})")
    p = n - _bos_shift(model)
    if layers != model.config.n_layer or p < 1:
        raise ValueError(f"{folder} was made for another base model ({layers} layers and {n} virtual tokens; this one has "
                         f"{model.config.n_layer} layers{' and reads a BOS first' if _bos_shift(model) else ''})")
    template = model.prefill(torch.zeros(1, p, dtype=torch.long, device=device))  # the layers' kinds and bookkeeping
    packed = embeddings.reshape(n, layers * 2, heads, head_dim)
    kv = []
    for i, (k, v) in enumerate(cache_kv(template)):
        if (k.shape[1], k.shape[3]) != (heads, head_dim):
            raise ValueError(f"{folder} was made for another base model (K/V of {heads} heads of {head_dim}; layer {i} of "
                             f"this one holds {k.shape[1]} of {k.shape[3]})")
        held = k.shape[-2]  # a sliding window's layer: its last positions
        kv.append(tuple(packed[n - held:, 2 * i + j].transpose(0, 1)[None].to(device=device, dtype=t.dtype).contiguous()
                        for j, t in enumerate((k, v))))
    return TrainedPrefix(model, with_kv(template, kv)).eval()


def cartridge_note(adapted: TrainedPrefix, folder: Path) -> dict[str, Any]:
    """A kv-prefix absorbed into a Hugging Face model as a PEFT CARTRIDGE folder (save_cartridge), written by peft;
    or why not (a family peft's CARTRIDGE cannot serve, no peft)."""
    try:
        info = save_cartridge(adapted, folder)  # num_frozen_tokens=1: kv-prefix's sink, its first position
    except ValueError as error:
        shutil.rmtree(folder, ignore_errors=True)
        return {"written": False, "reason": str(error)}
    except (TypeError, AttributeError, KeyError, RuntimeError) as error:  # peft itself failed: the prefix is still saved
        shutil.rmtree(folder, ignore_errors=True)
        return {"written": False, "reason": f"peft could not write the CARTRIDGE ({type(error).__name__}: "
                                            f"{str(error).splitlines()[0] if str(error) else ''})"}
    n = info["num_virtual_tokens"]
    return {"written": True, "peft_type": "CARTRIDGE", "family": info["family"], "folder": PEFT_FOLDER,
            "num_virtual_tokens": n, "query_position": n, "sha256": sha256_file(folder / "adapter_model.safetensors"),
            "load": f"PeftModel.from_pretrained(<the base as transformers' {info['class']}>, '{PEFT_FOLDER}'); queries "
                    f"at positions from num_virtual_tokens = {n} on, as peft's forward gives them"
                    + (" (the cartridge holds the BOS the model reads first: give the query without it)"
                       if n != adapted.position else "")}


register_peft_form(TrainedPrefix, export=lambda adapted, base, folder: cartridge_note(adapted, folder),
                   load=lambda folder, model, note: load_cartridge(folder, model))  # kv-prefix's CARTRIDGE
