"""The data stage's disk cache (`study.cache=DIR`): one safetensors + JSON pair per model, document, queries and
settings, written through temporary names."""

from __future__ import annotations

import torch

from .writers import _has_template

FINGERPRINT_TEXT = "Q: Where was Abe Lonn born?\nA: In Rome, 1987 (\u00fcber caf\u00e9)."


def tokenizer_fingerprint(codec) -> str | None:
    """None without a tokenizer; else a short sha256 of what the data stage reads of it: its ids for a probe text,
    its end-of-turn id and its chat template's rendering of a probe turn (where it has one). Two tokenizers that
    write different questions or chat turns get different data stages."""
    if codec is None:
        return None
    import hashlib
    import json

    parts = {"type": type(codec).__name__, "ids": list(map(int, codec.encode(FINGERPRINT_TEXT))),
             "eos": getattr(codec, "eos_token_id", None)}
    if _has_template(codec):
        parts["chat"] = codec.chat([{"role": "user", "content": FINGERPRINT_TEXT}], add_generation_prompt=True)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stage_key(model, prompt: torch.Tensor, queries: list[torch.Tensor], settings: dict) -> str:
    """sha256 naming one data stage: the model (a sample of its weights), the document, the training queries and
    every setting that shapes the sequences (options, k, seed, the tokenizer's fingerprint)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().flatten()
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(flat[:: max(1, flat.numel() // 1024)][:1024].to(torch.float64).cpu().numpy().tobytes())
    for ids in [prompt, *queries]:
        digest.update(ids.detach().cpu().numpy().astype("int64").tobytes() + b"|")
    return digest.hexdigest()


def save_stage(folder, key: str, sequences: list, counts: dict, settings: dict):
    """The stage as <key>.safetensors + <key>.json in `folder`, written through temporary names and renamed (an
    interrupted write leaves no half file under the real name)."""
    import json
    import os
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, item in enumerate(sequences):
        for j, tensor in enumerate(item):
            tensors[f"{i}.{j}"] = tensor.detach().contiguous().cpu()
    weights, record = folder / f"{key}.safetensors", folder / f"{key}.json"
    partial = folder / f".{key}.{os.getpid()}.partial"
    try:
        save_file(tensors, str(partial))
        partial.replace(weights)
        partial.write_text(json.dumps({"settings": settings, "counts": counts, "sequences": len(sequences),
                                       "parts": len(sequences[0]) if sequences else 0}, indent=1, default=str))
        partial.replace(record)
    finally:
        partial.unlink(missing_ok=True)


def load_stage(folder, key: str, settings: dict, device) -> tuple[list, dict] | None:
    """The cached stage of `key` when both files are there and its recorded settings are these; else None."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    weights, record = Path(folder) / f"{key}.safetensors", Path(folder) / f"{key}.json"
    if not (weights.is_file() and record.is_file()):
        return None
    try:
        meta = json.loads(record.read_text())
        if json.loads(json.dumps(settings, default=str)) != meta["settings"]:
            return None
        tensors = load_file(str(weights), device=str(device))
        sequences = [tuple(tensors[f"{i}.{j}"] for j in range(meta["parts"])) for i in range(meta["sequences"])]
    except (ValueError, KeyError, OSError):
        return None  # a damaged cache entry is rebuilt (under the same name, by save_stage)
    return sequences, meta["counts"]
