"""The absorb folder: what `incontext absorb` writes and `generate`, `chat`, `compare` and the lm-eval model read.

    from incontext.absorb import load_adapted
    adapted = load_adapted(Path(FOLDER), model, "smollm2")   # checked against the model it was absorbed into
    logits = adapted(query_ids)

A folder holds adapted.safetensors + adapted.json (the adapted model, AdaptedModel.save), or a PEFT adapter in
peft_adapter/ (the PEFT form its method registers, protocol.PEFT_FORMS: distill-lora's adapter alone, kv-prefix's
CARTRIDGE beside the saved prefix; this module imports no method), and absorb.json, written last: its presence
marks a finished folder. `write_folder` writes one through a hidden staging folder that takes the folder's place by
renames (a kill leaves no half-written folder); `load_adapted` reads one back, `composed_folders` composes several
of one method."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ..config import to_dict
from ..fileio import sha256_file, strict_json
from ..outputs import EXPERIMENT_MARKER, claim_output_folder, code_version
from .protocol import PEFT_FOLDER, PEFT_FORMS, AdaptedModel, get_absorb_method

ADAPTED_FILES = ("adapted.safetensors", "adapted.json")




PEFT_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md"}  # what peft's save_pretrained writes


ABSORB_RECORD = "absorb.json"  # written last: its presence marks a finished absorb folder


RECORD_FIELDS = {"model": str, "model_fingerprint": str, "model_fingerprint_bf16": str, "prompt_tokens": int,
                 "peft_adapter": dict}  # absorb.json's fields that generate reads, and their types


def check_absorb_out(out: Path) -> None:
    """An absorb folder may be new, empty, or an earlier absorb folder (absorb's marker) holding only this command's
    files; it must be writable."""
    claim_output_folder(out, "absorb", create=False)
    if not out.is_dir() or not any(out.iterdir()):
        return
    ours = set(ADAPTED_FILES) | {PEFT_FOLDER, ABSORB_RECORD, EXPERIMENT_MARKER}
    foreign = sorted(p.name for p in out.iterdir() if p.name not in ours)
    peft = out / PEFT_FOLDER
    if peft.exists():
        foreign += [f"{PEFT_FOLDER}/{p.name}" for p in sorted(peft.iterdir())
                    if p.name not in PEFT_FILES or not p.is_file()] if peft.is_dir() else [PEFT_FOLDER]
    if foreign or not (out / ABSORB_RECORD).is_file():
        listed = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "") if foreign else f"no {ABSORB_RECORD}"
        raise FileExistsError(f"the output folder {out} is not empty and not an earlier absorb folder ({listed}); "
                              "choose an empty or new folder")


def model_fingerprint(model: torch.nn.Module, rounded: bool = False) -> str:
    """sha256 of every tensor's name, shape and 4096 evenly spaced values: tells models of one architecture apart
    without hashing every weight. `rounded`: the values rounded to bfloat16 first, so the same model loaded in
    float32, bfloat16 or float64 has one fingerprint."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().flatten()
        sample = flat[:: max(1, flat.numel() // 4096)][:4096]
        if rounded and sample.is_floating_point():
            sample = sample.to(torch.bfloat16)
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(sample.to(torch.float64).cpu().numpy().tobytes())
    return digest.hexdigest()


def staging_folder(out: Path) -> Path:
    """A new hidden sibling of `out` where an absorb's files are written before they take out's place (a kill while
    writing leaves no half-written absorb folder). Leftovers of killed absorbs into the same folder go first."""
    import os
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    for kind in ("partial", "old"):
        for leftover in out.parent.glob(f".{out.name}.{kind}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    umask = os.umask(0)
    os.umask(umask)
    stage.chmod(0o777 & ~umask)  # mkdtemp's folder is private (0700); the absorb folder gets a folder's usual mode
    return stage


def swap_into(stage: Path, out: Path) -> None:
    """The finished `stage` becomes `out` by renames: a new or empty `out` is replaced at once; an earlier absorb
    folder (check_absorb_out made sure it is only ours) loses its absorb.json first (an unfinished folder, should
    a kill come now), moves aside, and is removed once the new folder is in place."""
    import os

    from ..fileio import fsync_dir

    if out.is_dir() and any(out.iterdir()):
        (out / ABSORB_RECORD).unlink(missing_ok=True)
        old = stage.with_name(stage.name.replace(".partial-", ".old-"))
        os.replace(out, old)
        os.replace(stage, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if out.is_dir():
            out.rmdir()
        os.replace(stage, out)
    fsync_dir(out.parent)


def load_adapted(folder: Path, model, spec: str) -> AdaptedModel:
    """The adapted model in `folder`, after checking it was absorbed into `model` (the one named `spec`): the whole
    adapted model (adapted.safetensors + adapted.json) where it was saved, else the PEFT adapter on `model` (distill-lora's
    LoRA; kv-prefix's CARTRIDGE, written beside adapted.safetensors on a Hugging Face model)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"absorb folder {folder}: no such folder")
    record_file = folder / ABSORB_RECORD
    if not record_file.is_file():  # absorb writes it last; without it nothing ties the folder to the model it came from
        if not (folder / "adapted.json").is_file() and not (folder / PEFT_FOLDER).exists():
            raise FileNotFoundError(f"absorb folder {folder} holds no adapted model (adapted.json is missing, and there is "
                                    f"no {ABSORB_RECORD} of an absorb)")
        raise ValueError(f"absorb folder {folder} is damaged or unfinished: {ABSORB_RECORD} is missing (absorb writes it "
                         "last), so nothing says which model it was absorbed into; absorb again")
    try:
        record = json.loads(record_file.read_text())
        peft_note = record.get("peft_adapter") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise ValueError(f"absorb folder {folder}: {ABSORB_RECORD} is corrupt") from None
    for key, kind in RECORD_FIELDS.items():
        if key in record and not isinstance(record[key], kind) or not isinstance(peft_note, dict):
            raise ValueError(f"absorb folder {folder}: {ABSORB_RECORD} is corrupt "
                             f"({'peft_adapter' if not isinstance(peft_note, dict) else key} has the wrong type)")
    absorbed_into = record.get("model", "another model")
    fingerprint = model_fingerprint(model)  # a record without a fingerprint: checked by the saved config alone
    if record.get("model_fingerprint", fingerprint) != fingerprint:
        same_in_another_dtype = ("model_fingerprint_bf16" in record
                                 and record["model_fingerprint_bf16"] == model_fingerprint(model, rounded=True))
        if not same_in_another_dtype:
            raise ValueError(f"absorb folder {folder} was absorbed into {absorbed_into!r}, not into {spec!r}" if absorbed_into != str(spec)
                             else f"absorb folder {folder} was absorbed into {spec!r} with other weights (their fingerprint "
                                  "differs: another version of the model, or weights not rounded from this dtype)")
    if not (folder / ADAPTED_FILES[0]).is_file() and peft_note.get("written"):  # the PEFT adapter alone
        return _load_peft(folder, record, peft_note, model)
    description_file = folder / "adapted.json"
    if not description_file.is_file():
        raise FileNotFoundError(f"absorb folder {folder} holds no adapted model (adapted.json is missing, and "
                                f"{ABSORB_RECORD} records no PEFT adapter)")
    try:
        base_config = json.loads(description_file.read_text())["base_config"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"absorb folder {folder}: adapted.json is corrupt") from None
    if base_config != to_dict(model.config):
        raise ValueError(f"absorb folder {folder} was absorbed into {absorbed_into!r}, not into {spec!r}" if absorbed_into != str(spec)
                         else f"absorb folder {folder} was absorbed into a {spec!r} of another configuration "
                              f"({', '.join(k for k in base_config if base_config.get(k) != to_dict(model.config).get(k))[:120]} differ)")
    try:
        return AdaptedModel.load(folder, base=model)
    except (RuntimeError, KeyError, TypeError, FileNotFoundError) as error:  # safetensors / load_state_dict complaints
        raise ValueError(f"absorb folder {folder} is corrupt ({str(error).splitlines()[0]})") from None


def _load_peft(folder: Path, record: dict[str, Any], note: dict[str, Any], model) -> AdaptedModel:
    """The adapted model of `folder`'s PEFT adapter on `model`, read back by the PEFT form the record's method registered
    (protocol.PEFT_FORMS: distill-lora's LoRA merged into a copy of `model`, kv-prefix's CARTRIDGE on `model`),
    after checking the adapter's weights against absorb.json."""
    weights = folder / PEFT_FOLDER / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"absorb folder {folder}: {PEFT_FOLDER}/adapter_model.safetensors is missing")
    if "sha256" in note and sha256_file(weights) != note["sha256"]:
        raise ValueError(f"absorb folder {folder}: {PEFT_FOLDER}/adapter_model.safetensors is corrupt (its sha256 differs "
                         f"from the one in {ABSORB_RECORD})")
    form = PEFT_FORMS.find(record.get("method"))
    if form is None:
        raise ValueError(f"absorb folder {folder}: {ABSORB_RECORD} records a PEFT adapter of method {record.get('method')!r}, "
                         f"which has no PEFT form ({PEFT_FORMS.known}: {', '.join(PEFT_FORMS.names())})")
    try:
        return form.load(folder / PEFT_FOLDER, model, note)
    except ValueError as error:
        raise ValueError(f"absorb folder {error}") from None


def adapted_placement(folders: list[Path]) -> str:
    """Where the absorbed documents of `folders` were placed (absorb.json's placement; raw, absorb's default, where
    the record names none or there is no record, which load_adapted then refuses): one placement for all, or a
    one-line error."""
    found = set()
    for folder in folders:
        try:
            record = json.loads((folder / ABSORB_RECORD).read_text()) if (folder / ABSORB_RECORD).is_file() else {}
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"absorb folder {folder}: {ABSORB_RECORD} is corrupt") from None
        found.add(record.get("placement", "raw") if isinstance(record, dict) else "raw")
    if len(found) > 1:
        raise ValueError("absorb folders: they placed their documents differently (placement "
                         f"{' and '.join(sorted(found))}); compose folders of one placement")
    placement = found.pop() if found else "raw"
    if placement not in ("raw", "system"):
        raise ValueError(f"absorb folder: {ABSORB_RECORD} records an unknown placement {placement!r}")
    return placement


def composed_folders(folders: list[Path], model, spec: str) -> AdaptedModel:
    """One absorb folder's adapted model, or several folders' composed by their method (kv-prefix: the prefixes
    concatenated in the order given; distill-lora: the adapters added): documents absorbed one by one, answered
    together."""
    adapted = [load_adapted(folder, model, spec) for folder in folders]
    if len(adapted) == 1:
        return adapted[0]
    kinds = sorted({a.method for a in adapted})
    if len(kinds) > 1:
        raise ValueError(f"absorb folders: they were absorbed by different methods ({', '.join(kinds)}); "
                         "compose folders of one method")
    method = get_absorb_method(kinds[0])
    if not callable(getattr(method, "compose", None)):
        raise ValueError(f"absorb folders: {kinds[0]} does not compose; give one folder")
    return method.compose(adapted)


def write_folder(out: Path, adapted: AdaptedModel, model, record: dict[str, Any]) -> dict[str, Any]:
    """Write the absorb folder `out`: the adapted model (saved whole, AdaptedModel.save) and its PEFT form where the
    method has one (AdaptedModel.peft_adapter: beside it, or instead of it for a `peft_only` model), then absorb.json
    last: `record` (what the command knows: method, options, model spec, prompt, ...) with the model's fingerprints,
    the code's commit, the files, the PEFT note, a line of Python that loads the folder and the training history.
    Written into a staging folder that takes `out`'s place by renames; returns the record written."""
    check_absorb_out(out)  # again: the folder may have changed while the method ran
    stage = staging_folder(out)
    try:
        claim_output_folder(stage, "absorb")
        note = adapted.peft_adapter(model, stage / PEFT_FOLDER)
        peft = sorted(f"{PEFT_FOLDER}/{p.name}" for p in (stage / PEFT_FOLDER).iterdir()) \
            if note is not None and note["written"] else []
        if not peft:
            shutil.rmtree(stage / PEFT_FOLDER, ignore_errors=True)
        written = [] if peft and adapted.peft_only else list(ADAPTED_FILES)  # the adapter alone: generate puts it back
        if written:
            adapted.save(stage)
        spec = record["model"]
        record = {**record, "code": code_version(), "model_fingerprint": model_fingerprint(model),
                  "model_fingerprint_bf16": model_fingerprint(model, rounded=True),
                  "files": [EXPERIMENT_MARKER] + written + peft + [ABSORB_RECORD]}
        if note is not None:
            record["peft_adapter"] = note
        record["python"] = (f"from pathlib import Path; from incontext.interop.models import load_model; "
                            f"from incontext.absorb import load_adapted; model = load_model({spec!r}).model; "
                            f"adapted = load_adapted(Path(FOLDER), model, {spec!r}); logits = adapted(query_ids)")
        history = getattr(adapted, "history", None)
        if history:
            record["history"] = history
        (stage / ABSORB_RECORD).write_text(strict_json(json.loads(json.dumps(record, default=str))))
        swap_into(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record


def check_export_out(out: Path) -> None:
    """Refuse, in one line, an output folder that export_transformers_folder could not write: not new or empty, or
    not creatable (checked before a model loads)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"the output folder {out} is not a new or empty folder; a model is exported only into one")
    parent = out.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"the output folder {out} cannot be created ({error.strerror or type(error).__name__})") from None
    if not os.access(parent, os.W_OK):
        raise ValueError(f"the output folder {out} cannot be created: {parent} is not writable")


def export_transformers_folder(model, tokenizer, out: Path, name: str = "the model") -> None:
    """`model` as a plain transformers folder at `out` (its transformers twin, interop.hf.hf_twin, saved by
    transformers itself, and `tokenizer`, a transformers tokenizer with its chat template, or None): written in a
    staging folder and renamed into place, no marker of ours in it."""
    from ..interop.hf import hf_twin

    check_export_out(out)
    try:
        twin = hf_twin(model)
    except ValueError as error:
        raise ValueError(f"{name} has no transformers form ({error})") from None
    stage = staging_folder(out)
    try:
        stage.mkdir(parents=True, exist_ok=True)
        twin.save_pretrained(stage, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(stage)
        swap_into(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
