"""Absorb a document with one method and write the absorb folder and its record: what `incontext absorb` does, with
typed arguments (the command line only parses, builds the Runtime, calls these and prints).

    job = AbsorbJob(method="distill-lora", model="smollm2")
    method, loaded = prepare(job, runtime)
    ids = document_ids(loaded, placed_document(loaded.tokenizer, text, "raw"), job.model, "the document")
    record = absorb_to_folder(job, method, loaded, text, ids, Path("adapted"))

absorb_many shards several documents over torchrun's processes, one absorb folder each.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import to_dict
from ..outputs import claim_output_folder
from ..runtime import Runtime, device_of
from ..tasks.placement import placed_document, resolve_placement
from ..tasks.queries import TrainQueries, train_queries
from .distill import Speed, distiller_args
from .folder import ABSORB_RECORD, check_absorb_out, write_folder
from .protocol import get_absorb_method, max_context

MANY_RECORD = "absorb-many.json"  # marks a folder of several documents' absorbs: one absorb folder per document


@dataclass
class AbsorbJob:
    """What one absorb is asked to do (recorded in absorb.json)."""
    method: str
    model: str  # the model's spec (a shipped name or a folder)
    options: dict[str, Any] = field(default_factory=dict)  # the method's options as given (checked by the method)
    placement: str = "raw"  # where the document goes: raw, system, user or auto (tasks.placement)
    writer: str = ""  # a model (spec) that writes the data stage's questions; "": the model itself
    tf32: bool = False  # the trained methods' float32 matmuls in TF32 on a CUDA device
    device: str = "cpu"  # as asked (recorded)
    dtype: str = "float32"
    with_train_queries: bool = False  # training questions will be given (checked against the method)


def codec_of(loaded, spec: str):
    """The loaded model's tokenizer; a one-line error for a model that cannot read text."""
    if loaded.tokenizer is None or not hasattr(loaded.tokenizer, "encode"):
        raise ValueError(f"model {spec!r} has no tokenizer (a model of a synthetic task): it cannot read text")
    return loaded.tokenizer


def load_writer(spec: str, runtime: Runtime) -> tuple:
    """(model, tokenizer) of the local model that writes a data stage's questions and messages."""
    from ..interop.models import load_model

    written_by = load_model(spec, runtime=runtime)
    return written_by.model, codec_of(written_by, spec)


def check_job(job: AbsorbJob):
    """The method with its options checked, before any model loads; one-line errors for a job that cannot work."""
    method = get_absorb_method(job.method, **{**distiller_args(job.method, Speed(tf32=job.tf32)), **job.options})
    if job.writer and not method.takes_codec:
        raise ValueError(f"{job.method} writes no questions, so it takes no writer model (distill-lora and kv-prefix do)")
    if job.with_train_queries and not method.takes_codec:
        raise ValueError(f"{job.method} does not learn from training questions (distill-lora and kv-prefix do)")
    if method.needs_train_groups and not job.with_train_queries:
        raise ValueError(f"{job.method}: study.wording_ensemble=true groups training questions by question, and there "
                         "are none")
    nothing = method.learns_nothing()
    if nothing is not None:  # a no-op that would look like a result
        raise ValueError(f"{job.method}: {nothing}; nothing was written")
    return method


def prepare(job: AbsorbJob, runtime: Runtime):
    """(method, loaded model) on `runtime`'s device in its dtype: the job checked first (check_job), then the model
    loaded and the method checked against it; the writer model loaded where the job names one."""
    from ..interop.models import load_model

    method = check_job(job)
    loaded = load_model(job.model, runtime=runtime)
    method.check_options_fit(loaded.model)  # a float option the model's dtype cannot hold (absorb checks it again)
    reason = method.unsupported(loaded.model)
    if reason is not None:
        raise ValueError(f"{job.method} does not apply to model {job.model!r}: {reason}")
    codec_of(loaded, job.model)
    if job.writer:  # the model that writes the data stage's questions
        method.writer = load_writer(job.writer, runtime)
    return method, loaded


def document_ids(loaded, text: str, spec: str, where: str) -> list[int]:
    """The placed document's token ids; a one-line error when it is empty or longer than the model reads."""
    ids = codec_of(loaded, spec).encode(text)
    if not ids:
        raise ValueError(f"{where} encodes to no tokens: there is nothing to absorb")
    limit = max_context(loaded.model)
    if limit is not None and len(ids) >= limit:
        raise ValueError(f"{where} has {len(ids)} tokens; model {spec!r} reads at most {limit} "
                         "(and the question needs room after it)")
    return ids


def placed(job: AbsorbJob, loaded, text: str, where: str = "the document") -> tuple[str, str, list[int]]:
    """(placement resolved, the placed document's text, its ids) of one document for this job."""
    codec = codec_of(loaded, job.model)
    placement = resolve_placement(job.placement, codec)
    text = placed_document(codec, text, placement)
    return placement, text, document_ids(loaded, text, job.model, where)


def read_train_queries_for(loaded, file: Path, placed_text: str, ids: list[int], placement: str) -> TrainQueries:
    """A training-questions file tokenized after this placed document (tasks.queries.train_queries)."""
    return train_queries(file, loaded.tokenizer, max_context(loaded.model), placed_text, len(ids), placement)


def absorb_to_folder(job: AbsorbJob, method, loaded, document: str, ids: list[int], out: Path,
                     train: TrainQueries | None = None, placement: str = "raw") -> dict[str, Any]:
    """Absorb one document (`ids`: the document as `placement` placed it) and write its folder (adapted model or PEFT
    adapter, then absorb.json last); `train`: training questions (tasks.queries.train_queries), or None. Returns the
    record written."""
    model = loaded.model
    device = device_of(model)
    given = {} if train is None else {"train_queries": [torch.tensor(q, device=device) for q in train.ids],
                                      "train_groups": train.groups}
    start = time.perf_counter()
    # checked: finite, not exploded; the tokenizer lets a data stage write questions about the prompt (chat turns too)
    adapted = method.absorb(model, torch.tensor(ids, device=device), codec=loaded.tokenizer, **given)
    seconds = time.perf_counter() - start

    record = {
        "method": job.method, "options": job.options, "resolved_options": to_dict(method.options),
        "model": job.model, "model_description": loaded.description,
        "prompt_sha256": hashlib.sha256(document.encode()).hexdigest(),
        "prompt_tokens": len(ids), "placement": placement, "writer": job.writer or None,
        "absorb_seconds": round(seconds, 3), "device": job.device, "dtype": job.dtype,
    }
    if train is not None:  # what the absorb trained on besides the prompt (the file's text, not its path)
        text = "\n\n".join("\n".join(wordings) for wordings in train.lines)
        record["train_queries"] = {"questions": len(train.lines), "wordings": len(train.ids),
                                   "sha256": hashlib.sha256(text.encode()).hexdigest()}
    return write_folder(out, adapted, model, record)


def check_many_out(out: Path, stems: list[str]) -> None:
    """A folder of several absorbs may be new, empty, or an earlier one (its marker present, only its own
    per-document folders in it); each per-document folder is checked like a single absorb's."""
    claim_output_folder(out, "absorb-many", create=False)
    if not out.is_dir() or not any(out.iterdir()):
        return
    for stem in stems:
        check_absorb_out(out / stem)


def absorb_many(job: AbsorbJob, documents: dict[str, str], out: Path, runtime: Runtime, source: str = "",
                progress: bool = True) -> dict[str, Any] | None:
    """One absorb folder per document (`documents`: name -> text) into out/<name>/; under torchrun each process takes
    every world_size-th document (its shard), on its own GPU where the runtime is CUDA. The last step (rank 0, after
    all have finished) writes absorb-many.json and returns its record (None on the other ranks)."""
    import os

    from tqdm.auto import tqdm

    from ..train.distributed import init_distributed, shutdown

    check_many_out(out, list(documents))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1 and runtime.device == torch.device("cuda"):  # one GPU per process: its own, checked as the runtime was
        from ..runtime import resolve_runtime

        runtime = resolve_runtime(f"cuda:{local_rank}", runtime.dtype)
    if runtime.device.type == "cuda":
        torch.cuda.set_device(runtime.device)  # nccl's barrier runs on the process's own GPU
    info = init_distributed(runtime.device)
    try:
        method, loaded = prepare(job, runtime)
        ids = {name: placed(job, loaded, text, f"document {name}") for name, text in documents.items()}
        # every rank checks every document: all refuse alike, before writing
        if info.is_main:  # one process claims (folder, marker); the others would race it between check and write
            claim_output_folder(out, "absorb-many")
        info.barrier()
        mine = list(documents)[info.rank::info.world_size]
        for name in tqdm(mine, desc=f"absorb ({job.method})", disable=not (progress and info.is_main)):
            check_absorb_out(out / name)
            placement, _, doc_ids = ids[name]
            absorb_to_folder(job, method, loaded, documents[name], doc_ids, out / name, placement=placement)
        info.barrier()
        if not info.is_main:
            return None
        records = {name: json.loads((out / name / ABSORB_RECORD).read_text()) for name in documents}
        summary = {"method": job.method, "options": job.options, "model": job.model, "prompts": source,
                   "processes": info.world_size, "model_description": loaded.description,
                   "adapted": {name: {"folder": name, "prompt_sha256": r["prompt_sha256"],
                                      "prompt_tokens": r["prompt_tokens"], "absorb_seconds": r["absorb_seconds"]}
                               for name, r in records.items()}}
        (out / MANY_RECORD).write_text(json.dumps(summary, indent=2))
        return summary
    finally:
        shutdown(info)
