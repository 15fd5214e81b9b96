"""`incontext absorb` and `incontext export-model`: the command line over absorb.job (absorb one document, or several,
with one method and write the absorb folder and its record) and over the model's transformers export.

    incontext absorb --model smollm2 --method distill-lora --prompt-file facts.txt --out adapted/
    incontext generate --model smollm2 --adapted adapted/ "Q: Where was Alia Brenno born?\\nA:"

cli/commands.py imports this module only when one of its commands runs (it imports torch).
"""

from __future__ import annotations

from pathlib import Path

from ..absorb.folder import check_absorb_out, check_export_out, export_transformers_folder
from ..absorb.job import AbsorbJob, absorb_to_folder, check_job, placed, prepare, read_train_queries_for
from ..absorb.job import absorb_many as absorb_documents
from ..absorb.protocol import PEFT_FOLDER
from ..config import parse_overrides
from ..interop.models import load_model
from ..runtime import Runtime
from ..tasks.queries import read_train_queries

# ----------------------------------------------------------------------------- reading the command's input


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


def prompt_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise FileNotFoundError(f"--prompts {folder}: no such folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".txt")
    if not files:
        raise ValueError(f"--prompts {folder} holds no .txt files (one prompt per file)")
    return files


def job_of(args) -> AbsorbJob:
    """The AbsorbJob of an `incontext absorb` command line."""
    return AbsorbJob(method=args.method, model=args.model, options=parse_overrides(args.set, flat=True),
                     placement=getattr(args, "placement", "raw"), writer=getattr(args, "writer", "") or "",
                     tf32=getattr(args, "tf32", False), device=args.device, dtype=args.dtype,
                     with_train_queries=getattr(args, "train_queries", None) is not None)


# ----------------------------------------------------------------------------- absorb


def absorb(args, runtime: Runtime) -> int:
    """`incontext absorb`, on the command's Runtime (its --device / --dtype, resolved once by cli/commands.py)."""
    if getattr(args, "prompts", None) is not None:
        return absorb_many(args, runtime)
    prompt_text = read_prompt(args.prompt, args.prompt_file)
    if args.train_queries is not None:  # a missing or empty file fails before the model loads, naming its flag
        try:
            read_train_queries(args.train_queries)
        except (OSError, ValueError) as error:
            raise type(error)(f"--train-queries: {error}") from None
    job = job_of(args)
    check_absorb_out(args.out)
    method, loaded = prepare(job, runtime)
    placement, placed_text, ids = placed(job, loaded, prompt_text, "the prompt")
    train = None if args.train_queries is None else read_train_queries_for(loaded, args.train_queries, placed_text,
                                                                           ids, placement)
    record = absorb_to_folder(job, method, loaded, prompt_text, ids, args.out, train, placement)
    print(f"absorbed {len(ids)} prompt tokens into {loaded.description} with {args.method} in {record['absorb_seconds']:.1f} s")
    init = (record.get("history") or {}).get("init")
    if init is not None and getattr(method.options, "init", None) == "auto":  # kv-prefix's default start, resolved
        print(f"start: init=auto took {init}" + (f" ({method.options.press}'s kept pairs)" if init == "press" else
                                                  " (the press start cannot be made for this model or prompt)"))
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


def absorb_many(args, runtime: Runtime) -> int:
    """`incontext absorb --prompts DIR`: one absorb folder per .txt file, into --out/<file stem>/ (absorb.job.absorb_many;
    under torchrun each process takes its shard)."""
    if args.prompt is not None or args.prompt_file is not None:
        raise ValueError("give the prompts with exactly one of --prompt, --prompt-file and --prompts")
    if getattr(args, "train_queries", None) is not None:
        raise ValueError("--train-queries goes with one prompt (--prompt or --prompt-file), not with --prompts")
    files = prompt_files(args.prompts)
    texts = {path.stem: read_prompt(None, path) for path in files}
    job = job_of(args)
    check_job(job)  # options checked before any model loads
    summary = absorb_documents(job, texts, args.out, runtime, source=str(args.prompts))
    if summary is not None:
        print(f"absorbed {len(files)} prompts into {summary.pop('model_description')} with {args.method} "
              f"({summary['processes']} process{'es' if summary['processes'] > 1 else ''}): {args.out}/<name>/ for each "
              f"of {', '.join(sorted(texts)[:5])}{', ...' if len(texts) > 5 else ''}")
    return 0


# ----------------------------------------------------------------------------- export-model


def export_model(args, runtime: Runtime) -> int:
    """`incontext export-model`: the model as a transformers folder (absorb/folder.py's export_transformers_folder),
    the base of an absorb folder's peft_adapter/."""
    check_export_out(args.out)  # before the model loads and converts (minutes for a large one)
    loaded = load_model(args.model, runtime=runtime)
    export_transformers_folder(loaded.model, getattr(loaded.tokenizer, "tokenizer", None), args.out, name=args.model)
    files = sorted(p.name for p in args.out.iterdir())
    print(f"wrote {args.out}: {', '.join(files)}")
    print(f"load: AutoModelForCausalLM.from_pretrained({str(args.out)!r}); an absorb folder's adapter: "
          f"PeftModel.from_pretrained(model, 'FOLDER/{PEFT_FOLDER}')")
    return 0
