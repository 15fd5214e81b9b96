"""`incontext absorb` and `incontext generate`: absorb one prompt into a model and save it, then talk to the result.

    incontext absorb --model smollm2 --method distill-lora --prompt-file facts.txt --out adapted/
    incontext generate --model smollm2 --adapted adapted/ "Q: Where was Alia Brenno born?\\nA:"

cli.py imports this module only when one of the two commands runs (it imports torch).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .absorb import AdaptedModel, get_absorb_method
from .absorb.base import Speed
from .absorb.base import check_tensors, max_context
from .absorb.distill_lora import DistilledLoRA
from .absorb.generation import END_OF_TURN, context_room, stream_tokens
from .absorb.kv_prefix import TrainedPrefix
from .config import parse_overrides, to_dict
from .fileio import sha256_file, strict_json
from .interop.models import load_model
from .outputs import EXPERIMENT_MARKER, claim_output_folder, code_version
from .runtime import Runtime, device_of, generator_for
from .tasks.placement import chat_turn, placed_document, resolve_placement

ADAPTED_FILES = ("adapted.safetensors", "adapted.json")
PEFT_FOLDER = "peft_adapter"
PEFT_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md"}  # what peft's save_pretrained writes
ABSORB_RECORD = "absorb.json"  # written last: its presence marks a finished absorb folder
RECORD_FIELDS = {"model": str, "model_fingerprint": str, "model_fingerprint_bf16": str, "prompt_tokens": int,
                 "peft_adapter": dict}  # absorb.json's fields that generate reads, and their types


# ----------------------------------------------------------------------------- shared checks


def read_prompt(text: str | None, file: Path | None) -> str:
    if (text is None) == (file is None):
        raise ValueError("give the prompt with exactly one of --prompt TEXT and --prompt-file FILE")
    if file is not None:
        if not file.is_file():
            raise FileNotFoundError(f"--prompt-file {file}: no such file")
        text = file.read_text(encoding="utf-8")
        where = f"--prompt-file {file}"
    else:
        where = "--prompt"
    if not text.strip():
        raise ValueError(f"{where} is empty: there is nothing to absorb")
    return text


TRAIN_QUERY = "Q: {}\nA:"  # a question of --train-queries, asked after the document as the `facts` task asks its own


def train_query_text(line: str) -> str:
    """A --train-queries line as the text read after the document: a question or request (ending in ?, . or !) as
    TRAIN_QUERY; a line without closing punctuation as it is, the start of a statement the document completes ("Ada
    Lovelace was born in"), as the `facts` task's statement cut before its answer."""
    return TRAIN_QUERY.format(line) if line.endswith(("?", ".", "!")) else line


def read_train_queries(file: Path) -> list[list[str]]:
    """--train-queries FILE: questions the absorb may train on (never the ones it will be scored with), one a line
    (train_query_text); the lines of one block are wordings of one question (wording_ensemble teaches them one
    target), a blank line starts the next question."""
    if not file.is_file():
        raise FileNotFoundError(f"--train-queries {file}: no such file")
    groups, block = [], []
    for line in file.read_text(encoding="utf-8-sig").splitlines() + [""]:  # a BOM is not part of the first line
        if line.strip():
            block.append(line.strip())
        elif block:
            groups.append(block)
            block = []
    if not groups:
        raise ValueError(f"--train-queries {file} holds no questions (one a line, a blank line between questions)")
    return groups


class TrainQueries(NamedTuple):
    """A --train-queries file read (read_train_queries) and tokenized (train_query_ids) for absorb(...)."""
    lines: list[list[str]]  # the file's questions, each its block of wordings (read_train_queries)
    ids: list[list[int]]  # each wording's token ids, in order
    groups: list[int]  # each wording's question index


def train_query_ids(groups: list[list[str]], codec, model, prompt_text: str, prompt_tokens: int,
                    placement: str = "raw") -> tuple[list[list[int]], list[int]]:
    """Each wording's token ids (train_query_text, on a new line when the prompt does not end in one; after a
    system-placed document a question is the user's turn, as generate --chat asks it) and its question's index
    (absorb's train_groups)."""
    limit = max_context(model)
    start = "" if prompt_text.endswith("\n") or placement == "system" else "\n"
    ids, questions = [], []
    for question, wordings in enumerate(groups):
        for text in wordings:
            asked = placement == "system" and text.endswith(("?", ".", "!"))
            query = codec.encode(chat_turn(codec, text, placement) if asked else start + train_query_text(text))
            if limit is not None and prompt_tokens + len(query) >= limit:
                raise ValueError(f"--train-queries: {text[:40]!r} has {len(query)} tokens; after the {prompt_tokens}-token "
                                 f"prompt the model reads at most {limit} (and the answer needs room)")
            ids.append(query)
            questions.append(question)
    return ids, questions


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
        raise FileExistsError(f"--out {out} is not empty and not an earlier absorb folder ({listed}); "
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


def _codec(loaded, spec: str):
    if loaded.tokenizer is None or not hasattr(loaded.tokenizer, "encode"):
        raise ValueError(f"model {spec!r} has no tokenizer (a model of a synthetic task): it cannot read text")
    return loaded.tokenizer


def load_writer(spec: str, runtime: Runtime) -> tuple:
    """(model, tokenizer) of `--writer`, the local model that writes a data stage's questions and messages."""
    written_by = load_model(spec, runtime=runtime)
    return written_by.model, _codec(written_by, spec)


# ----------------------------------------------------------------------------- absorb


MANY_RECORD = "absorb-many.json"  # marks a folder of `absorb --prompts`: one absorb folder per prompt file


def _prompt_ids(codec, text: str, model, spec: str, where: str) -> list[int]:
    ids = codec.encode(text)
    if not ids:
        raise ValueError(f"{where} encodes to no tokens: there is nothing to absorb")
    limit = max_context(model)
    if limit is not None and len(ids) >= limit:
        raise ValueError(f"{where} has {len(ids)} tokens; model {spec!r} reads at most {limit} "
                         "(and the question needs room after it)")
    return ids


def _prepare(args, runtime: Runtime):
    """The method (options checked), the loaded model on `runtime`'s device in its dtype and its codec; one-line errors
    first."""
    options = parse_overrides(args.set, flat=True)
    method = get_absorb_method(args.method, **{"speed": Speed(tf32=getattr(args, "tf32", False)),
                                               **options})  # names, types and ranges checked (config.parse_options)
    if getattr(args, "writer", "") and not method.takes_codec:
        raise ValueError(f"{args.method} writes no questions (--writer: distill-lora, kv-prefix)")
    if getattr(args, "train_queries", None) is not None and not method.takes_codec:
        raise ValueError(f"{args.method} does not learn from training queries (--train-queries: distill-lora, kv-prefix)")
    if method.needs_train_groups and getattr(args, "train_queries", None) is None:
        raise ValueError(f"{args.method}: wording_ensemble=true groups training questions by question, and there are "
                         "none (give them with --train-queries FILE)")
    nothing = method.learns_nothing()
    if nothing is not None:  # a no-op that would look like a result
        raise ValueError(f"{args.method}: {nothing}; nothing was written")
    loaded = load_model(args.model, runtime=runtime)
    method.check_options_fit(loaded.model)  # a float option the model's dtype cannot hold (absorb checks it again)
    reason = method.unsupported(loaded.model)
    if reason is not None:
        raise ValueError(f"{args.method} does not apply to model {args.model!r}: {reason}")
    codec = _codec(loaded, args.model)
    if getattr(args, "writer", ""):  # the model that writes the data stage's questions (checked options first)
        method.writer = load_writer(args.writer, runtime)
    return method, options, loaded, codec


def absorb(args, runtime: Runtime) -> int:
    """`incontext absorb`, on the command's Runtime (its --device / --dtype, resolved once by cli.py)."""
    if getattr(args, "prompts", None) is not None:
        return absorb_many(args, runtime)
    prompt_text = read_prompt(args.prompt, args.prompt_file)
    groups = None if args.train_queries is None else read_train_queries(args.train_queries)
    check_absorb_out(args.out)
    method, options, loaded, codec = _prepare(args, runtime)
    placement = resolve_placement(getattr(args, "placement", "raw"), codec)
    placed = placed_document(codec, prompt_text, placement)
    ids = _prompt_ids(codec, placed, loaded.model, args.model, "the prompt")
    train = None if groups is None else TrainQueries(groups, *train_query_ids(groups, codec, loaded.model, placed,
                                                                               len(ids), placement))
    record = _absorb_into(method, options, loaded, args, prompt_text, ids, args.out, train, placement)
    print(f"absorbed {len(ids)} prompt tokens into {loaded.description} with {args.method} in {record['absorb_seconds']:.1f} s")
    if (record.get("history") or {}).get("steps") == 0:  # e.g. kv-prefix with steps=0: its initial prefix
        print(f"nothing was trained (0 steps): the adapted model is {args.method}'s starting point")
    held = (record.get("history") or {}).get("heldout_kl")
    if held:  # the true KL on fresh continuations training never saw (distill.heldout_kl)
        print(f"held-out KL(teacher || student): {held['before']:.4f} -> {held['after']:.4f} nats per position "
              f"({held['sequences']} fresh continuations, {held['positions']} positions)")
    rollbacks = (record.get("history") or {}).get("rollbacks", 0)
    if rollbacks:  # the divergence guard acted (absorb/distill.py, Rollback)
        print(f"training diverged {rollbacks} time(s); each time it went back to its best snapshot at half the "
              f"learning rate (absorb.json: history)")
    print(f"wrote {args.out}: {', '.join(record['files'])}")
    note = record.get("peft_adapter")
    if note is not None and not note["written"]:
        print(f"no PEFT adapter: {note['reason']}")
    print(f"next: incontext generate --model {args.model} --adapted {args.out} \"...\"")
    return 0


def _absorb_into(method, options, loaded, args, prompt_text: str, ids: list[int], out: Path,
                 train: TrainQueries | None = None, placement: str = "raw") -> dict[str, Any]:
    """Absorb one prompt (`ids`: the document as `placement` placed it) and write its folder (adapted model or PEFT
    adapter, then absorb.json last); `train`: the --train-queries file's questions (train_query_ids), or None."""
    model = loaded.model
    device = device_of(model)
    given = {} if train is None else {"train_queries": [torch.tensor(q, device=device) for q in train.ids],
                                      "train_groups": train.groups}
    start = time.perf_counter()
    # checked: finite, not exploded; the tokenizer lets a data stage write questions about the prompt (chat turns too)
    adapted = method.absorb(model, torch.tensor(ids, device=device), codec=loaded.tokenizer, **given)
    seconds = time.perf_counter() - start

    check_absorb_out(out)  # again: the folder may have changed while the method ran
    stage = _staging_folder(out)
    try:
        claim_output_folder(stage, "absorb")
        written, peft_note = [], None
        if isinstance(adapted, DistilledLoRA):  # the adapter alone (a few MB): generate puts it back on the base
            peft_note = _save_peft(adapted, model, stage / PEFT_FOLDER)
            if peft_note["written"]:
                written += sorted(f"{PEFT_FOLDER}/{p.name}" for p in (stage / PEFT_FOLDER).iterdir())
        if not written:  # no low-rank update to save alone: the whole adapted model (safetensors + JSON)
            adapted.save(stage)
            written = list(ADAPTED_FILES)
        if isinstance(adapted, TrainedPrefix):
            # beside it, the same prefix as a PEFT CARTRIDGE adapter for the family's own transformers class (our
            # Transformer's: for the family it exports to, whose base `incontext export-model` writes)
            peft_note = _save_cartridge(adapted, stage / PEFT_FOLDER)
            if peft_note["written"]:
                written += sorted(f"{PEFT_FOLDER}/{p.name}" for p in (stage / PEFT_FOLDER).iterdir())
        if not peft_note or not peft_note["written"]:
            shutil.rmtree(stage / PEFT_FOLDER, ignore_errors=True)
        record = {
            "method": args.method, "options": options, "resolved_options": to_dict(method.options), "code": code_version(),
            "model": args.model, "model_description": loaded.description,
            "model_fingerprint": model_fingerprint(model), "model_fingerprint_bf16": model_fingerprint(model, rounded=True),
            "prompt_sha256": hashlib.sha256(prompt_text.encode()).hexdigest(),
            "prompt_tokens": len(ids), "placement": placement, "writer": getattr(args, "writer", "") or None,
            "absorb_seconds": round(seconds, 3), "device": args.device, "dtype": args.dtype,
            "files": [EXPERIMENT_MARKER] + written + [ABSORB_RECORD],
        }
        if train is not None:  # what the absorb trained on besides the prompt (the file's text, not its path)
            text = "\n\n".join("\n".join(wordings) for wordings in train.lines)
            record["train_queries"] = {"questions": len(train.lines), "wordings": len(train.ids),
                                       "sha256": hashlib.sha256(text.encode()).hexdigest()}
        if peft_note is not None:
            record["peft_adapter"] = peft_note
        record["python"] = (f"from pathlib import Path; from incontext.interop.models import load_model; "
                            f"from incontext.cli_absorb import load_adapted; model = load_model({args.model!r}).model; "
                            f"adapted = load_adapted(Path(FOLDER), model, {args.model!r}); logits = adapted(query_ids)")
        history = getattr(adapted, "history", None)
        if history:
            record["history"] = history
        (stage / ABSORB_RECORD).write_text(strict_json(json.loads(json.dumps(record, default=str))))
        _swap_into(stage, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return record


def _staging_folder(out: Path) -> Path:
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


def _swap_into(stage: Path, out: Path) -> None:
    """The finished `stage` becomes `out` by renames: a new or empty `out` is replaced at once; an earlier absorb
    folder (check_absorb_out made sure it is only ours) loses its absorb.json first (an unfinished folder, should
    a kill come now), moves aside, and is removed once the new folder is in place."""
    import os

    from .fileio import fsync_dir

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


def prompt_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise FileNotFoundError(f"--prompts {folder}: no such folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".txt")
    if not files:
        raise ValueError(f"--prompts {folder} holds no .txt files (one prompt per file)")
    return files


def check_many_out(out: Path, stems: list[str]) -> None:
    """A folder of `absorb --prompts` may be new, empty, or an earlier one (its marker present, only its own
    per-prompt folders in it); each per-prompt folder is checked like a single absorb's."""
    claim_output_folder(out, "absorb-many", create=False)
    if not out.is_dir() or not any(out.iterdir()):
        return
    for stem in stems:
        check_absorb_out(out / stem)


def absorb_many(args, runtime: Runtime) -> int:
    """One adapted model per prompt file of --prompts, into --out/<file stem>/; under torchrun each process takes
    every world_size-th file (its shard), on its own GPU where --device is cuda; the outputs are the files one
    process writes. The last step (rank 0, after all have finished) writes absorb-many.json."""
    import os

    from tqdm.auto import tqdm

    from .train.distributed import init_distributed, shutdown

    if args.prompt is not None or args.prompt_file is not None:
        raise ValueError("give the prompts with exactly one of --prompt, --prompt-file and --prompts")
    if getattr(args, "train_queries", None) is not None:
        raise ValueError("--train-queries goes with one prompt (--prompt or --prompt-file), not with --prompts")
    files = prompt_files(args.prompts)
    check_many_out(args.out, [p.stem for p in files])
    texts = {}
    for path in files:
        texts[path.stem] = read_prompt(None, path)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and runtime.device == torch.device("cuda"):  # one GPU per process: its own, checked as --device was
        from .runtime import resolve_runtime

        runtime = resolve_runtime(f"cuda:{local_rank}", runtime.dtype)
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)  # nccl's barrier runs on the process's own GPU
    info = init_distributed(runtime.device)
    try:
        method, options, loaded, codec = _prepare(args, runtime)
        placement = resolve_placement(getattr(args, "placement", "raw"), codec)
        ids = {stem: _prompt_ids(codec, placed_document(codec, text, placement), loaded.model, args.model,
                                 f"prompt file {stem}.txt")
               for stem, text in texts.items()}  # every rank checks every file: all refuse alike, before writing
        if info.is_main:  # one process claims (folder, marker); the others would race it between check and write
            claim_output_folder(args.out, "absorb-many")
        info.barrier()
        mine = [p.stem for p in files][info.rank::info.world_size]
        for stem in tqdm(mine, desc=f"absorb ({args.method})", disable=not info.is_main):
            check_absorb_out(args.out / stem)
            _absorb_into(method, options, loaded, args, texts[stem], ids[stem], args.out / stem, placement=placement)
        info.barrier()
        if info.is_main:
            records = {stem: json.loads((args.out / stem / ABSORB_RECORD).read_text()) for stem in texts}
            summary = {"method": args.method, "options": options, "model": args.model, "prompts": str(args.prompts),
                       "processes": info.world_size,
                       "adapted": {stem: {"folder": stem, "prompt_sha256": r["prompt_sha256"],
                                          "prompt_tokens": r["prompt_tokens"], "absorb_seconds": r["absorb_seconds"]}
                                   for stem, r in records.items()}}
            (args.out / MANY_RECORD).write_text(json.dumps(summary, indent=2))
            print(f"absorbed {len(files)} prompts into {loaded.description} with {args.method} "
                  f"({info.world_size} process{'es' if info.world_size > 1 else ''}): {args.out}/<name>/ for each of "
                  f"{', '.join(sorted(texts)[:5])}{', ...' if len(texts) > 5 else ''}")
    finally:
        shutdown(info)
    return 0


def _save_peft(adapted: DistilledLoRA, model, folder: Path) -> dict[str, Any]:
    """The distilled adapter as a PEFT folder for the family's own transformers class: directly on the Hugging Face
    backend, through the export of our Transformer (the first family in the table that takes it) otherwise."""
    from .interop.hf import export_family
    from .absorb.distill_lora_export import save_hf_backend_adapter, save_peft_adapter

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


def _save_cartridge(adapted: TrainedPrefix, folder: Path) -> dict[str, Any]:
    """A kv-prefix absorbed into a Hugging Face model as a PEFT CARTRIDGE folder (interop/cartridge.py), written by
    peft; or why not (a family peft's CARTRIDGE cannot serve, no peft)."""
    from .absorb.kv_prefix_export import save_cartridge

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


# ----------------------------------------------------------------------------- export-model


def export_model(args, runtime: Runtime) -> int:
    """`incontext export-model`: the model as a transformers folder (its transformers twin, interop.hf.hf_twin, saved by
    transformers itself, and its tokenizer with the chat template), the base of an absorb folder's peft_adapter/."""
    from .interop.hf import hf_twin

    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise FileExistsError(f"--out {args.out} is not a new or empty folder; export-model writes only into one")
    loaded = load_model(args.model, runtime=runtime)
    try:
        twin = hf_twin(loaded.model)
    except ValueError as error:
        raise ValueError(f"export-model: {args.model} has no transformers form ({error})") from None
    tokenizer = getattr(loaded.tokenizer, "tokenizer", None)
    stage = _staging_folder(args.out)
    try:
        stage.mkdir(parents=True, exist_ok=True)  # a plain transformers folder: no marker of ours in it
        twin.save_pretrained(stage, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(stage)
        _swap_into(stage, args.out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    files = sorted(p.name for p in args.out.iterdir())
    print(f"wrote {args.out}: {', '.join(files)}")
    print(f"load: AutoModelForCausalLM.from_pretrained({str(args.out)!r}); an absorb folder's adapter: "
          f"PeftModel.from_pretrained(model, 'FOLDER/{PEFT_FOLDER}')")
    return 0


# ----------------------------------------------------------------------------- generate


def load_adapted(folder: Path, model, spec: str) -> AdaptedModel:
    """The adapted model in `folder`, after checking it was absorbed into `model` (the one named `spec`): the whole
    adapted model (adapted.safetensors + adapted.json) where it was saved, else the PEFT adapter on `model` (distill-lora's
    LoRA; kv-prefix's CARTRIDGE, written beside adapted.safetensors on a Hugging Face model)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"--adapted {folder}: no such folder")
    record_file = folder / ABSORB_RECORD
    if not record_file.is_file():  # absorb writes it last; without it nothing ties the folder to the model it came from
        if not (folder / "adapted.json").is_file() and not (folder / PEFT_FOLDER).exists():
            raise FileNotFoundError(f"--adapted {folder} holds no adapted model (adapted.json is missing, and there is "
                                    f"no {ABSORB_RECORD} of an absorb)")
        raise ValueError(f"--adapted {folder} is damaged or unfinished: {ABSORB_RECORD} is missing (absorb writes it "
                         "last), so nothing says which model it was absorbed into; absorb again")
    try:
        record = json.loads(record_file.read_text())
        peft_note = record.get("peft_adapter") or {}
    except (ValueError, AttributeError, UnicodeDecodeError):
        raise ValueError(f"--adapted {folder}: {ABSORB_RECORD} is corrupt") from None
    for key, kind in RECORD_FIELDS.items():
        if key in record and not isinstance(record[key], kind) or not isinstance(peft_note, dict):
            raise ValueError(f"--adapted {folder}: {ABSORB_RECORD} is corrupt "
                             f"({'peft_adapter' if not isinstance(peft_note, dict) else key} has the wrong type)")
    absorbed_into = record.get("model", "another model")
    fingerprint = model_fingerprint(model)  # a record without a fingerprint: checked by the saved config alone
    if record.get("model_fingerprint", fingerprint) != fingerprint:
        same_in_another_dtype = ("model_fingerprint_bf16" in record
                                 and record["model_fingerprint_bf16"] == model_fingerprint(model, rounded=True))
        if not same_in_another_dtype:
            raise ValueError(f"--adapted {folder} was absorbed into {absorbed_into!r}, not into {spec!r}")
    if not (folder / ADAPTED_FILES[0]).is_file() and peft_note.get("written"):
        # folders written before query_position was recorded: distill-lora's queries start after the prompt
        return _load_peft(folder, {"query_position": record.get("prompt_tokens"), **peft_note}, model)
    description_file = folder / "adapted.json"
    if not description_file.is_file():
        raise FileNotFoundError(f"--adapted {folder} holds no adapted model (adapted.json is missing, and "
                                f"{ABSORB_RECORD} records no PEFT adapter)")
    try:
        base_config = json.loads(description_file.read_text())["base_config"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"--adapted {folder}: adapted.json is corrupt") from None
    if base_config != to_dict(model.config):
        raise ValueError(f"--adapted {folder} was absorbed into {absorbed_into!r}, not into {spec!r}")
    try:
        return AdaptedModel.load(folder, base=model)
    except (RuntimeError, KeyError, TypeError, FileNotFoundError) as error:  # safetensors / load_state_dict complaints
        raise ValueError(f"--adapted {folder} is corrupt ({str(error).splitlines()[0]})") from None


def _load_peft(folder: Path, note: dict[str, Any], model) -> AdaptedModel:
    """The distilled LoRA of `folder`'s PEFT adapter merged into a copy of `model`, or a kv-prefix's CARTRIDGE on
    `model` (checked against absorb.json)."""
    from .absorb.distill_lora_export import load_peft_adapter

    weights = folder / PEFT_FOLDER / "adapter_model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"--adapted {folder}: {PEFT_FOLDER}/adapter_model.safetensors is missing")
    if "sha256" in note and sha256_file(weights) != note["sha256"]:
        raise ValueError(f"--adapted {folder}: {PEFT_FOLDER}/adapter_model.safetensors is corrupt (its sha256 differs "
                         f"from the one in {ABSORB_RECORD})")
    if note.get("peft_type") == "CARTRIDGE":  # a kv-prefix's cartridge: the prefix back on `model` itself
        from .absorb.kv_prefix_export import load_cartridge

        try:
            return load_cartridge(folder / PEFT_FOLDER, model)
        except ValueError as error:
            raise ValueError(f"--adapted {error}") from None
    offset = note.get("query_position")
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"--adapted {folder}: {ABSORB_RECORD} records no query_position for the PEFT adapter")
    try:
        return load_peft_adapter(folder / PEFT_FOLDER, model, offset)
    except ValueError as error:
        raise ValueError(f"--adapted {error}") from None


def adapted_placement(folders: list[Path]) -> str:
    """Where the absorbed documents of `folders` were placed (absorb.json's placement; raw for folders written
    before it was recorded, and for none): one placement for all, or a one-line error."""
    found = set()
    for folder in folders:
        try:
            record = json.loads((folder / ABSORB_RECORD).read_text()) if (folder / ABSORB_RECORD).is_file() else {}
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"--adapted {folder}: {ABSORB_RECORD} is corrupt") from None
        found.add(record.get("placement", "raw") if isinstance(record, dict) else "raw")
    if len(found) > 1:
        raise ValueError("--adapted: the folders placed their documents differently (absorb --placement "
                         f"{' and '.join(sorted(found))}); compose folders of one placement")
    placement = found.pop() if found else "raw"
    if placement not in ("raw", "system"):
        raise ValueError(f"--adapted: {ABSORB_RECORD} records an unknown placement {placement!r}")
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
        raise ValueError(f"--adapted: the folders were absorbed by different methods ({', '.join(kinds)}); "
                         "compose folders of one method")
    method = get_absorb_method(kinds[0])
    if not callable(getattr(method, "compose", None)):
        raise ValueError(f"--adapted: {kinds[0]} does not compose; give one folder")
    return method.compose(adapted)


def check_generation_options(args, dtype: torch.dtype) -> None:
    """--max-new-tokens, --sample, --temperature and --top-k checked (generate, generate --prompts-file, chat); `dtype`:
    the model's (the command's Runtime)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.sample and (args.temperature is not None or args.top_k is not None):
        raise ValueError("--temperature and --top-k only apply with --sample")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ValueError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.temperature is not None:
        tiny = torch.finfo(dtype).tiny
        if args.temperature < tiny:
            raise ValueError(f"--temperature {args.temperature:g} underflows {args.dtype} (its smallest normal number is "
                             f"{tiny:g}): logits / temperature would overflow")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")


def generate(args, runtime: Runtime) -> int:
    """`incontext generate TEXT`, on the command's Runtime (its --device / --dtype, resolved once by cli.py)."""
    check_generation_options(args, runtime.dtype)
    if not args.text:
        raise ValueError("TEXT is empty: give the text to continue")
    placement = adapted_placement(args.adapted or []) if args.chat else "raw"  # before the model loads
    loaded = load_model(args.model, runtime=runtime)
    codec = _codec(loaded, args.model)
    runner = loaded.model if not args.adapted else composed_folders(args.adapted, loaded.model, args.model)
    stop = set()
    if getattr(codec, "eos_token_id", None) is not None:
        stop.add(codec.eos_token_id)
    text = args.text
    if args.chat:
        if not hasattr(codec, "chat"):
            raise ValueError(f"--chat: model {args.model!r} has no chat template")
        text = chat_turn(codec, args.text, placement)
        vocab = codec.tokenizer.get_vocab()
        stop |= {vocab[token] for token in END_OF_TURN if token in vocab}
    ids = codec.encode(text)
    room = context_room(runner, len(ids))
    if room is not None and room < 1:
        raise ValueError(f"the text has {len(ids)} tokens: no room is left in the model's context")
    new_tokens = args.max_new_tokens if room is None else min(args.max_new_tokens, room)
    generator = generator_for(device_of(loaded.model), args.seed)  # same seed, same device: same sample
    produced, shown = [], ""
    for token in stream_tokens(runner, ids, new_tokens, greedy=not args.sample,
                               temperature=args.temperature or 1.0, top_k=args.top_k, stop_ids=stop,
                               generator=generator):
        produced.append(token)
        text_so_far = codec.decode(produced)
        if not text_so_far.endswith("\ufffd"):  # wait for the rest of a character split across tokens
            sys.stdout.write(text_so_far[len(shown):])
            sys.stdout.flush()
            shown = text_so_far
    sys.stdout.write(codec.decode(produced)[len(shown):] + "\n")
    if new_tokens < args.max_new_tokens and len(produced) == new_tokens:
        print(f"(stopped after {new_tokens} tokens: the model's context is full)", file=sys.stderr)
    return 0
