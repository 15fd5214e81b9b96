"""`incontext absorb` and `incontext generate`: absorb one prompt into a model and save it, then talk to the result.

    incontext absorb --model smollm2 --method distill-lora --prompt-file facts.txt --out adapted/
    incontext generate --model smollm2 --adapted adapted/ "Q: Where was Alia Brenno born?\\nA:"

cli/commands.py imports this module only when one of the two commands runs (it imports torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..absorb import get_absorb_method
from ..absorb.folder import (
    ABSORB_RECORD,
    check_absorb_out,
    staging_folder,
    swap_into,
    write_folder,
)
from ..absorb.distill import Speed, distiller_args
from ..absorb.protocol import PEFT_FOLDER, max_context
from ..config import parse_overrides, to_dict
from ..interop.models import load_model
from ..outputs import claim_output_folder
from ..runtime import Runtime, device_of
from ..tasks.placement import chat_turn, placed_document, resolve_placement, unmarked

# ----------------------------------------------------------------------------- shared checks


def read_prompt(text: str | None, file: Path | None) -> str:
    if (text is None) == (file is None):
        raise ValueError("give the prompt with exactly one of --prompt TEXT and --prompt-file FILE")
    if file is not None:
        if file.is_dir():
            raise ValueError(f"--prompt-file {file} is a folder, not a file (several documents: --prompts DIR)")
        if not file.is_file():
            raise FileNotFoundError(f"--prompt-file {file}: no such file")
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"--prompt-file {file} is not UTF-8 text") from None
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
    start = "" if unmarked(prompt_text).endswith("\n") or placement == "system" else "\n"
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
    speed = Speed(tf32=getattr(args, "tf32", False))  # a distiller's (distiller_args); names, types, ranges checked
    method = get_absorb_method(args.method, **{**distiller_args(args.method, speed), **options})
    if getattr(args, "writer", "") and not method.takes_codec:
        raise ValueError(f"{args.method} writes no questions (--writer: distill-lora, kv-prefix)")
    if getattr(args, "train_queries", None) is not None and not method.takes_codec:
        raise ValueError(f"{args.method} does not learn from training queries (--train-queries: distill-lora, kv-prefix)")
    if method.needs_train_groups and getattr(args, "train_queries", None) is None:
        raise ValueError(f"{args.method}: study.wording_ensemble=true groups training questions by question, and there are "
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
    """`incontext absorb`, on the command's Runtime (its --device / --dtype, resolved once by cli/commands.py)."""
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

    record = {
        "method": args.method, "options": options, "resolved_options": to_dict(method.options),
        "model": args.model, "model_description": loaded.description,
        "prompt_sha256": hashlib.sha256(prompt_text.encode()).hexdigest(),
        "prompt_tokens": len(ids), "placement": placement, "writer": getattr(args, "writer", "") or None,
        "absorb_seconds": round(seconds, 3), "device": args.device, "dtype": args.dtype,
    }
    if train is not None:  # what the absorb trained on besides the prompt (the file's text, not its path)
        text = "\n\n".join("\n".join(wordings) for wordings in train.lines)
        record["train_queries"] = {"questions": len(train.lines), "wordings": len(train.ids),
                                   "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return write_folder(out, adapted, model, record)


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

    from ..train.distributed import init_distributed, shutdown

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
        from ..runtime import resolve_runtime

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


# ----------------------------------------------------------------------------- export-model


def export_model(args, runtime: Runtime) -> int:
    """`incontext export-model`: the model as a transformers folder (its transformers twin, interop.hf.hf_twin, saved by
    transformers itself, and its tokenizer with the chat template), the base of an absorb folder's peft_adapter/."""
    from ..interop.hf import hf_twin

    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        raise FileExistsError(f"--out {args.out} is not a new or empty folder; export-model writes only into one")
    parent = args.out.resolve().parent
    try:  # where the folder goes must be writable before the model loads and converts (minutes for a large one)
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--out {args.out} cannot be created ({error.strerror or type(error).__name__})") from None
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--out {args.out} cannot be created: {parent} is not writable")
    loaded = load_model(args.model, runtime=runtime)
    try:
        twin = hf_twin(loaded.model)
    except ValueError as error:
        raise ValueError(f"export-model: {args.model} has no transformers form ({error})") from None
    tokenizer = getattr(loaded.tokenizer, "tokenizer", None)
    stage = staging_folder(args.out)
    try:
        stage.mkdir(parents=True, exist_ok=True)  # a plain transformers folder: no marker of ours in it
        twin.save_pretrained(stage, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(stage)
        swap_into(stage, args.out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    files = sorted(p.name for p in args.out.iterdir())
    print(f"wrote {args.out}: {', '.join(files)}")
    print(f"load: AutoModelForCausalLM.from_pretrained({str(args.out)!r}); an absorb folder's adapter: "
          f"PeftModel.from_pretrained(model, 'FOLDER/{PEFT_FOLDER}')")
    return 0


# ----------------------------------------------------------------------------- generate


