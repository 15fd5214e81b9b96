"""The training record of kv-prefix or distill-lora absorbs on SmolLM2 and `facts` episodes: per episode the steps run,
whether the plateau test stopped training, the divergence guard's rollbacks and lowest windowed KL, and the mean KL of
the last 8 steps (`adapted.history`; nothing is evaluated, so test episodes are safe to trace). Prints one line per
episode and writes a JSON summary with --out.

    python benchmarks/training_record.py --episodes 12 --seed 10000 --set passes=8 --set autocast=bfloat16
    python benchmarks/training_record.py --people 15 --episodes 1 --set prefix_tokens=100
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_stage_decodes import add_facts_arguments, facts_source  # the same `facts` probe arguments

from incontext.absorb import get_absorb_method
from incontext.config import scalar
from incontext.interop.models import load_model


def option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected OPTION=VALUE, got {text!r}")
    return key, scalar(value)


def write_new(path: Path, data) -> None:
    """`data` as JSON in a new file `path` (its folder made; an existing file is never overwritten)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "x") as f:
        json.dump(data, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", choices=("kv-prefix", "distill-lora"), default="kv-prefix")
    add_facts_arguments(p, episodes=12, seed=10000)
    p.add_argument("--set", action="append", default=[], type=option, metavar="OPTION=VALUE", help="a method option")
    p.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda, ...)")
    p.add_argument("--out", type=Path, help="a JSON file to write (an existing one is refused)")
    args = p.parse_args()
    if args.out is not None and args.out.exists():
        p.error(f"--out {args.out} exists; give a new file")
    source = facts_source(p, args)
    options = {"progress": False, **dict(args.set)}
    try:  # bad method options and devices are named before the model loads
        get_absorb_method(args.method, **options)
        loaded = load_model("smollm2", args.device)
    except (ValueError, TypeError) as error:
        p.error(str(error))
    rows = []
    for i, episode in enumerate(source.episodes(args.episodes, args.seed, tokenizer=loaded.tokenizer, task=loaded.task)):
        method = get_absorb_method(args.method, **options)
        history = method.absorb(loaded.model, episode.prompt, train_queries=list(episode.train_queries),
                                codec=loaded.tokenizer).history
        kl = history["loss"]
        row = {"episode": i, "steps": history["steps"], "stopped_early": history.get("stopped_early", False),
               "rollbacks": history.get("rollbacks", 0), "best_window_kl": history.get("best_window_loss"),
               "last_kl": sum(kl[-8:]) / max(1, len(kl[-8:])), "max_kl": max(kl, default=None)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"method": args.method, "options": options, "episodes": args.episodes, "seed": args.seed,
               "people": args.people, "paraphrases": args.paraphrases, "rows": rows,
               "with_rollbacks": sum(r["rollbacks"] > 0 for r in rows)}
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if args.out is not None:
        write_new(args.out, summary)


if __name__ == "__main__":
    main()
