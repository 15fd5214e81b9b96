"""distill-lora on SmolLM2-135M: absorb a Shakespeare prompt into a LoRA, timing the absorb and measuring the KL to
the prompted model on held-out text.

The prompt is tokens [start, start + M) of a play (SmolLM2's tokenizer); the evaluation queries are the next
n x N tokens, cut into n queries of N tokens. They are held out: absorb() never sees them (no train_queries).
For each query, KL(SmolLM2 with the prompt in context || the model without it) per query token, averaged, for
drop-prompt (before) and distill-lora (after), and the cross-entropy of the true next tokens under each.

    python benchmarks/distill_lora.py [--prompt-tokens 512] [--play hamlet_gut] [--threads 2] [--tokenizer] [--set steps=16 ...]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from incontext.absorb import get_absorb_method
from incontext.interop import from_hf_llama, load_smollm2
from incontext.interop.models import HFCodec
from incontext.tasks.corpora import shakespeare_plays

RESULTS = Path(__file__).resolve().parent / "results"


def option(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


@torch.no_grad()
def scores(teacher, student, queries: torch.Tensor) -> dict[str, float]:
    """Mean KL(teacher || student) per token, and the cross-entropy of the true next tokens under each."""
    kl, ce_teacher, ce_student = [], [], []
    for query in queries:
        t = F.log_softmax(teacher(query[None]), -1)[0]
        s = F.log_softmax(student(query[None]), -1)[0]
        kl.append(F.kl_div(s, t, log_target=True, reduction="none").sum(-1).mean())
        ce_teacher.append(F.nll_loss(t[:-1], query[1:]))
        ce_student.append(F.nll_loss(s[:-1], query[1:]))
    mean = lambda xs: float(torch.stack(xs).mean())  # noqa: E731
    return {"kl": mean(kl), "ce_with_prompt": mean(ce_teacher), "ce": mean(ce_student)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--play", default="hamlet_gut")
    p.add_argument("--start", type=int, default=4096, help="first prompt token in the play (past the front matter)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--queries", type=int, default=4, help="held-out queries n")
    p.add_argument("--query-tokens", type=int, default=32, help="tokens per query N")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", type=option, action="append", default=[], metavar="KEY=VALUE",
                   help="a distill-lora option (rank, steps, learning_rate, ...); default: the method's defaults")
    p.add_argument("--tokenizer", action="store_true",
                   help="give the method the tokenizer, as `incontext absorb` does (questions and chat turns)")
    p.add_argument("--out", type=Path, default=None, help="[benchmarks/results/distill_lora.json]")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / "distill_lora.json"

    hf_model, tokenizer = load_smollm2()
    model = from_hf_llama(hf_model).eval()
    del hf_model
    ids = torch.tensor(tokenizer(shakespeare_plays()[args.play])["input_ids"])
    m, n, length = args.prompt_tokens, args.queries, args.query_tokens
    if args.start + m + n * length > len(ids):
        raise SystemExit(f"{args.play} has {len(ids)} tokens; start + prompt + queries needs {args.start + m + n * length}")
    prompt = ids[args.start: args.start + m]
    queries = ids[args.start + m: args.start + m + n * length].view(n, length)  # held out

    options = dict(args.set)
    method = get_absorb_method("distill-lora", **options)
    start, cpu_start = time.perf_counter(), time.process_time()
    adapted = method.absorb(model, prompt, codec=HFCodec(tokenizer) if args.tokenizer else None)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    history = adapted.history

    teacher = get_absorb_method("keep-prompt").absorb(model, prompt[None])
    before = scores(teacher, get_absorb_method("drop-prompt").absorb(model, prompt), queries)
    after = scores(teacher, adapted, queries)
    result = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "set")},
        "method_options": {f.name: dataclasses.asdict(v) if dataclasses.is_dataclass(v := getattr(method.options, f.name)) else v
                           for f in dataclasses.fields(method.Options)},  # the study options nested
        "speed": dataclasses.asdict(method.speed),
        "pool": history["pool"],
        "absorb_seconds": seconds, "absorb_cpu_seconds": cpu_seconds,
        "teacher_seconds": history["teacher_seconds"], "train_seconds": history["train_seconds"],
        "steps": history["steps"], "stopped_early": history["stopped_early"],
        "train_kl_first": history["loss"][0], "train_kl_last": history["loss"][-1], "train_kl": history["loss"],
        "held_out_before": before, "held_out_after": after, "torch": torch.__version__,
    }
    stopped = ", stopped early" if history["stopped_early"] else ""
    table = "\n".join([
        f"# distill-lora on SmolLM2-135M: {m}-token prompt ({args.play}), {n} held-out queries of {length} tokens, "
        f"{args.threads} threads" + (", with the tokenizer" if args.tokenizer else ""),
        "",
        f"absorb: {seconds:.1f} s (teacher targets {history['teacher_seconds']:.1f} s, training "
        f"{history['train_seconds']:.1f} s, {history['steps']} steps{stopped}); CPU time {cpu_seconds:.1f} s "
        f"({cpu_seconds / args.threads:.1f} s per thread, about the wall time on an idle machine); "
        f"training-batch KL {history['loss'][0]:.3f} -> {history['loss'][-1]:.3f}; training sequences {history['pool']}",
        "",
        "| held-out queries | KL(prompted ‖ model) per token | cross-entropy of the true next tokens |",
        "|---|---|---|",
        f"| prompt in context (teacher) | 0 | {before['ce_with_prompt']:.3f} |",
        f"| drop-prompt (before) | {before['kl']:.4f} | {before['ce']:.3f} |",
        f"| distill-lora (after) | {after['kl']:.4f} | {after['ce']:.3f} |",
    ]) + "\n"
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
