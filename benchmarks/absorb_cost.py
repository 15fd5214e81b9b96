"""Absorb cost of the prompt-free methods that train on the data stage (kv-prefix, distill-lora) on SmolLM2-135M:
CPU time per thread of one absorb (process CPU time / torch threads, which a shared machine's load distorts far
less than wall-clock; CUDA events on a GPU), split into the data stage (the teacher's sequences and targets) and
training, for `facts` prompts of about 160, 512 and 2,000 tokens (2, 7 and 27 invented people), or SQuAD validation
paragraphs (--squad N); beside them a KV press (kv-press, `--set kv-press.press=kvzip`: the peer a trained absorber's
cost is measured against, its ratio in the table's last column).

Methods run interleaved (repeat r starts with method r mod k) on the same prompts; each absorb builds its own data
stage (no cache), as a first absorb of a document does.

    python benchmarks/absorb_cost.py                             # 160 / 512 / 2000 tokens, 1 repeat, 2 threads
    python benchmarks/absorb_cost.py --people 2 --repeats 3 --set kv-prefix.steps=96
    python benchmarks/absorb_cost.py --people 2 --document benchmarks/documents/driftwood.txt  # a document of your own
    python benchmarks/absorb_cost.py --task-set questions=paraphrases:3     # training questions: three wordings each
    python benchmarks/absorb_cost.py --people --squad 3 --methods kv-press,kv-prefix --set kv-press.ratio=0.1 \
        --set kv-prefix.ratio=0.1                                 # issue 79: kv-prefix's default against KVzip
    python benchmarks/absorb_cost.py --device cuda                # on a GPU: CUDA events
    python benchmarks/absorb_cost.py --device cuda --random-weights --tokenizer DIR --warmup  # no SmolLM2 file there

--random-weights: a random model of SmolLM2-135M's shapes (benchmarks/gpu_backends.py's SMOLLM2) with SmolLM2's
tokenizer (`--tokenizer`: a folder saved with `save_pretrained`, default the one in the shipped GGUF), for a machine
that cannot hold the model file. Same work per absorb, except that the text the model writes (continuations,
answers, questions) runs to its token limits: random weights do not stop early, so this is an upper bound.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch

from incontext import runtime
from incontext.absorb import get_absorb_method
from incontext.absorb.study import answer as study_answer
from incontext.absorb.distill import Speed, distiller_args
from incontext.harness.compare import CostTimer
from incontext.config import scalar
from incontext.interop.models import HFCodec, load_model
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.splits import episode_seed

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("kv-prefix", "distill-lora", "kv-press")
# data-stage peers: METHOD:VARIANT with one of these variants answers the training queries another way, measured in the
# same run (study_answer._answer picks the static decode for our Transformer, else full passes on a GPU and batched
# incremental decoding elsewhere)
ANSWERS = {
    "one-query-at-a-time": lambda model, cache, queries, n_answers, decode="always", **_: [
        study_answer._answered(model, study_answer._copy(cache), q, n) for q, n in zip(queries, n_answers)],
    "batched-decode": lambda model, cache, queries, n_answers, decode="always", **_: study_answer._answered_batched(
        model, cache, queries, n_answers),
    "full-passes": lambda model, cache, queries, n_answers, decode="always", **_: study_answer._answered_full_passes(
        model, cache, queries, n_answers),
}


# peers that flip a speed switch (absorb.distill.Speed, passed as get_absorb_method(..., speed=Speed(...)) to a distiller): METHOD:VARIANT
# where VARIANT (or one of its "+"-joined parts) names one of these; `--set LABEL.FIELD=VALUE` with FIELD a Speed field
# (cuda_graph, tf32, static_decode, cast_once, fixed_shapes) sets one for that label too
SPEEDS = {
    "plain-decode": {"static_decode": "never"},  # decode on a growing cache: no CUDA graph in the data stage
    "cast-per-step": {"cast_once": False},  # under autocast, the frozen weights cast at every step (autocast's)
    "eager": {"cuda_graph": False},  # the training step run eagerly, not replayed as a CUDA graph
}
SPEED_FIELDS = tuple(f.name for f in dataclasses.fields(Speed))


def speed_of(label: str, options: dict) -> Speed:
    """The speed switches of a label: its variant's SPEEDS parts, then the Speed fields its --set options name
    (removed from `options`: they are no method options)."""
    variant = label.partition(":")[2]
    switches = {k: v for part in variant.split("+") for k, v in SPEEDS.get(part, {}).items()}
    switches.update({name: options.pop(name) for name in SPEED_FIELDS if name in options})
    return Speed(**switches)


@contextlib.contextmanager
def answers_by(label: str):
    """For a label METHOD:VARIANT with VARIANT in ANSWERS, the data stage's answers given that way instead (the
    speed-up of batching measured in the same run)."""
    variant = label.partition(":")[2]
    chosen = study_answer._answer
    if variant in ANSWERS:
        study_answer._answer = ANSWERS[variant]
    try:
        yield
    finally:
        study_answer._answer = chosen


def base(label: str) -> str:
    """The method of a label METHOD[:VARIANT] (a variant is the method with its own --set options)."""
    return label.partition(":")[0]


def option(text: str) -> tuple[str, str, object]:
    """METHOD.OPTION=VALUE, the value read as `--set` reads it (a YAML scalar: config.scalar)."""
    key, _, value = text.partition("=")
    method, _, name = key.partition(".")
    if base(method) not in METHODS or not name:
        raise SystemExit(f"--set {text!r}: expected LABEL.OPTION=VALUE with LABEL one of {', '.join(METHODS)}[:VARIANT]")
    return method, name, scalar(value)


def task_option(text: str) -> tuple[str, object]:
    """OPTION=VALUE of the `facts` task, checked against its options (people comes from --people)."""
    from incontext.tasks.episodes import FactsConfig

    name, sep, value = text.partition("=")
    allowed = sorted(set(FactsConfig.__dataclass_fields__) - {"people"})
    if not sep or name not in allowed:
        raise argparse.ArgumentTypeError(f"{text!r}: expected OPTION=VALUE with OPTION one of {', '.join(allowed)}")
    return name, scalar(value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--people", type=int, nargs="*", default=[2, 7, 27],
                   help="invented people per `facts` prompt (sets its length); none: no `facts` prompt")
    p.add_argument("--squad", type=int, default=0, metavar="N",
                   help="also N SQuAD validation paragraphs (the episodes compare draws, the document as the system turn)")
    p.add_argument("--document", type=Path, action="append", default=[], metavar="FILE",
                   help="also a document of your own (text, placed as the chat template's system turn, as absorb does), "
                        "e.g. benchmarks/documents/driftwood.txt")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the model's weights (kv-prefix trains a float32 copy of its prefix whatever the dtype)")
    p.add_argument("--methods", default="kv-prefix,distill-lora",
                   help=f"labels METHOD[:VARIANT], METHOD of {', '.join(METHODS)}; a variant runs METHOD with the options "
                        f"--set gives its label (after METHOD's own); METHOD:{'/'.join(ANSWERS)} also answers the data "
                        "stage's queries that way; METHOD:plain-decode decodes on a growing cache (no CUDA graph); "
                        "METHOD:cast-per-step lets autocast cast the frozen weights at every step; METHOD:eager trains "
                        "without a CUDA graph; join variants with +")
    p.add_argument("--set", action="append", default=[], type=option,
                   help=f"LABEL.OPTION=VALUE: a method option, or a speed switch ({', '.join(SPEED_FIELDS)}), or dtype")
    p.add_argument("--task-set", action="append", default=[], type=task_option, metavar="OPTION=VALUE",
                   help="a `facts` task option (as compare's --set gives it), e.g. questions=paraphrases:3; people comes from --people")
    p.add_argument("--random-weights", action="store_true", help="random weights of SmolLM2's shapes (see above)")
    p.add_argument("--tokenizer", type=Path, default=None, help="with --random-weights: a saved tokenizer folder")
    p.add_argument("--warmup", action="store_true", help="one untimed absorb per method first (CUDA start-up, caches)")
    p.add_argument("--out", type=Path, default=RESULTS / "absorb_cost")
    args = p.parse_args()
    if not args.people and not args.squad and not args.document:
        p.error("no prompt: give --people N.., --squad N or --document FILE")
    try:  # a bad task value (questions=paraphrases:7) is named before the model loads
        get_episode_source("facts", **dict(args.task_set))
    except (ValueError, TypeError) as error:
        p.error(f"--task-set: {error}")
    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    options = {m: {"progress": False} for m in methods}
    for method, name, value in args.set:
        options.setdefault(method, {"progress": False})[name] = value
    for m in methods:  # a variant runs its method's options, then its own
        if m != base(m):
            options[m] = {**options.get(base(m), {}), **options.get(m, {})}
    # `--set LABEL.dtype=bfloat16` is the benchmark's, not the method's: that label runs on the model in that dtype
    dtypes = {m: options[m].pop("dtype", args.dtype) for m in methods}
    try:  # speed switches are no method options: each label's Speed, bad options named before the model loads
        speeds = {m: speed_of(m, options[m]) for m in methods}
        for m in methods:
            get_absorb_method(base(m), **distiller_args(base(m), speeds[m]), **options[m])
    except (ValueError, TypeError) as error:
        p.error(str(error))
    models = {}
    for dtype in dict.fromkeys([args.dtype, *dtypes.values()]):
        if args.random_weights:
            models[dtype], codec, description = random_smollm2(args.device, args.tokenizer, dtype)
        else:
            loaded = load_model("smollm2", args.device, dtype)
            models[dtype], codec, description = loaded.model, loaded.tokenizer, loaded.description
    timer = CostTimer(torch.device(args.device))
    rows = []
    from incontext.tasks.placement import placed_document, resolve_placement

    prompts = []
    for people in args.people:
        episode = get_episode_source("facts", **dict(args.task_set), people=people).episodes(1, seed=0, tokenizer=codec)[0]
        prompts.append((people, None, episode.prompt.to(args.device), [t.to(args.device) for t in episode.train_queries]))
    for episode in get_episode_source("squad").episodes(args.squad, seed=episode_seed("validation", 0), tokenizer=codec) \
            if args.squad else []:
        prompts.append((None, "squad", episode.prompt.to(args.device), []))
    for file in args.document:
        text = file.read_text().strip()
        ids = codec.encode(placed_document(codec, text, resolve_placement("auto", codec)))
        prompts.append((None, file.name, torch.tensor(ids, device=args.device), []))
    for index, (people, document, prompt, train) in enumerate(prompts):
        if args.warmup and index == 0:
            for m in methods:
                with answers_by(m):
                    get_absorb_method(base(m), **distiller_args(base(m), speeds[m]), **options[m]).absorb(
                        models[dtypes[m]], prompt, train_queries=train, codec=codec)
        times = {m: [] for m in methods}
        splits = {m: [] for m in methods}
        for r in range(args.repeats):
            for m in methods[r % len(methods):] + methods[: r % len(methods)]:
                method = get_absorb_method(base(m), **distiller_args(base(m), speeds[m]), **options[m])
                model = models[dtypes[m]]
                wall = time.perf_counter()
                with answers_by(m):
                    adapted, ms = timer(lambda: method.absorb(model, prompt, train_queries=train, codec=codec))
                wall = time.perf_counter() - wall
                times[m].append(ms / 1000)
                h = getattr(adapted, "history", None) or {}  # a press trains nothing: no history
                splits[m].append({"wall_s": wall, "teacher_wall_s": h.get("teacher_seconds"),
                                  "train_wall_s": h.get("train_seconds"), "steps": h.get("steps"), "cuda_graph": h.get("cuda_graph"),
                                  "kept_bytes": adapted.kept_bytes(model)})
                print(f"{prompt.shape[0]:5d} tokens  {m:12s} {ms / 1000:7.1f} s per thread ({wall:.1f} s wall)", flush=True)
                adapted = None
        for m in methods:
            rows.append({"prompt": index, "prompt_tokens": int(prompt.shape[0]), "people": people, "document": document, "method": m,
                         "options": options[m],
                         "speed": dataclasses.asdict(speeds[m]), "dtype": dtypes[m],
                         "absorb_s": statistics.median(times[m]), "absorb_s_all": times[m], "runs": splits[m]})
        write(rows, description, args)  # after each prompt length: a run cut short keeps what it measured


def random_smollm2(device: str, tokenizer: Path | None, dtype: str = "float32"):
    """(model, codec, description): random weights of SmolLM2-135M's shapes and SmolLM2's tokenizer."""
    from gpu_backends import SMOLLM2  # this folder's sibling script: one table of SmolLM2's shapes

    from incontext.models import Transformer, TransformerConfig

    if tokenizer is not None:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(tokenizer)
    else:
        from incontext.interop.pretrained import load_smollm2
        tok = load_smollm2()[1]
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(**SMOLLM2)).to(device, getattr(torch, dtype)).eval()
    return model, HFCodec(tok), "random weights of SmolLM2-135M's shapes"


def write(rows: list[dict], description: str, args) -> None:
    results = {"model": description, "device": args.device, "machine": runtime.machine(args.device), "dtype": args.dtype,
               "threads": args.threads, "repeats": args.repeats,
               "task_options": dict(args.task_set),
               "torch": torch.__version__, "clock": "CUDA events" if args.device.startswith("cuda") else "CPU time per thread",
               "rows": rows}
    lines = [f"Absorb cost on {description}, {results['clock']} ({args.threads} threads, {args.device}, {args.dtype}), "
             f"median of {args.repeats}; {_prompts_text(rows)}{_task_text(args.task_set)}, each absorb building its own data "
             "stage; x press: the absorb time over the `kv-press` row's (its variants aside) on the same prompt.", "",
             "| prompt tokens | method | absorb s | data stage s (wall) | training s (wall) | steps | kept KiB | x press |",
             "|---|---|---|---|---|---|---|---|"]
    for index, row in enumerate(rows):
        run = row["runs"][0]
        press = [r for r in rows if r["prompt"] == row["prompt"] and r["method"] == "kv-press"]
        ratio = f"{row['absorb_s'] / press[0]['absorb_s']:.1f}" if press and press[0]["absorb_s"] > 0 else "-"
        lines.append(f"| {row['prompt_tokens']} | {row['method']} | {row['absorb_s']:.1f} | {_s(run['teacher_wall_s'])} | "
                     f"{_s(run['train_wall_s'])} | {run['steps'] if run['steps'] is not None else '-'} | "
                     f"{run['kept_bytes'] / 1024:.0f} | {ratio} |")
    rows_press = [r for r in rows if r["method"] == "kv-press"]
    if rows_press and len({r["prompt"] for r in rows}) > 1:  # several prompts: each label's median ratio over them
        lines += ["", "| method | median x press over the prompts |", "|---|---|"]
        for label in dict.fromkeys(r["method"] for r in rows):
            ratios = [r["absorb_s"] / p["absorb_s"] for r in rows if r["method"] == label
                      for p in rows_press if p["prompt"] == r["prompt"] and p["absorb_s"] > 0]
            if ratios:
                lines.append(f"| {label} | {statistics.median(ratios):.1f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _s(seconds) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _prompts_text(rows: list[dict]) -> str:
    kinds = dict.fromkeys("`facts` prompts" if r["people"] is not None else "SQuAD validation paragraphs"
                          if r["document"] == "squad" else "documents of one's own" for r in rows)
    return ", ".join(kinds) or "no prompt"


def _task_text(task_set) -> str:
    """The task options a run set, for the table's first line: " (questions=paraphrases:3)" or nothing."""
    return f" ({', '.join(f'{k}={v}' for k, v in task_set)})" if task_set else ""


if __name__ == "__main__":
    main()
