"""Absorb cost of kv-prefix and distill-lora before and after a code change, interleaved: the same absorbs (SmolLM2-135M,
the demo's `facts` documents of the test split, each method at its defaults, the document alone) run by two source
trees of this repository, `--before` (a commit, checked out into a temporary git worktree) and the working tree, one
subprocess per absorb, alternating which tree goes first in each repeat. Each subprocess loads the model, then times
one absorb as CPU time per thread (process CPU time / torch threads: a shared machine's load distorts it far less
than wall-clock) and reports the adapted model's answers to the episode's queries, so "the same numbers" is checked
beside the cost, and its memory: the process's peak resident memory (ru_maxrss) over the absorb, less what it held
after loading the model (the compare table's "peak" is the same growth, sampled).

    python benchmarks/pipeline_before_after.py --before 71a1566 --repeats 2 --out benchmarks/results/pipeline_before_after.json
    python benchmarks/pipeline_before_after.py --before f972e62~1 --methods kv-prefix --set ratio=0.1 \
        --task ruler --repeats 1    # a RULER niah_single_2 document of 2,048 tokens (validation split), a tenth kept
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("kv-prefix", "distill-lora")

def child_source() -> str:
    """What each subprocess runs (the same text for both trees; it reads only APIs both share)."""
    return r'''
import json, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
from incontext.absorb import get_absorb_method
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source

method, index, task, options = sys.argv[1], int(sys.argv[2]), sys.argv[4], json.loads(sys.argv[5])
loaded = load_model("smollm2", "cpu", "float32")
codec = loaded.tokenizer
if task == "ruler":
    source = get_episode_source("ruler", kind="niah_single_2", length=2048)
    from incontext.tasks.splits import episode_seed
    episode = source.episodes(index + 1, seed=episode_seed("validation", 0), tokenizer=codec)[index]
else:
    source = get_episode_source("facts", people=2)
    episode = source.episodes(index + 1, seed=1_000_000, tokenizer=codec)[index]
absorber = get_absorb_method(method, progress=False, **options)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
loaded_rss = rss()
start = time.process_time()
adapted = absorber.absorb(loaded.model, episode.prompt, train_queries=list(episode.train_queries) or None, codec=codec)
cpu = (time.process_time() - start) / torch.get_num_threads()
answers = []
with torch.no_grad():
    for query in episode.queries:
        answers.append(adapted(query.inputs[None])[0].argmax(-1).tolist())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"cpu_s": cpu, "answers": answers, "steps": adapted.history.get("steps"),
                  "peak_growth_gb": max(0, peak - loaded_rss) / 2 ** 30, "prompt_tokens": int(episode.prompt.shape[-1])}))
'''


def run(tree: Path, method: str, index: int, threads: int, task: str = "facts", options: dict | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run([sys.executable, "-c", child_source(), method, str(index), str(threads), task,
                          json.dumps(options or {})], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{tree.name} {method}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def differ(a: list, b: list) -> int:
    """Greedy tokens (the argmax at every query position) that two runs' answers disagree on."""
    return sum(x != y for p, q in zip(a, b) for x, y in zip(p, q))


def summarise(rows: list[dict], methods: tuple[str, ...] = METHODS) -> dict:
    """Per method: median CPU s per thread of each tree, their ratio, and how many greedy tokens differ between the
    trees' runs (the most over pairs) and between runs of one tree (run-to-run noise), of how many."""
    out = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        cost = {t: statistics.median(r["cpu_s"] for r in mine if r["tree"] == t) for t in ("before", "after")}
        within = {t: max([differ(a["answers"], b["answers"]) for a in mine for b in mine if a is not b
                          and a["tree"] == b["tree"] == t and a["episode"] == b["episode"]], default=0)
                  for t in ("before", "after")}
        across = max([differ(a["answers"], b["answers"]) for a in mine for b in mine if a["tree"] == "before"
                      and b["tree"] == "after" and a["episode"] == b["episode"]], default=0)
        memory = {t: max(r.get("peak_growth_gb", 0.0) for r in mine if r["tree"] == t) for t in ("before", "after")}
        out[method] = {"before_cpu_s": cost["before"], "after_cpu_s": cost["after"],
                       "before_peak_growth_gb": memory["before"], "after_peak_growth_gb": memory["after"],
                       "after_over_before": cost["after"] / cost["before"], "tokens_differ_across": across,
                       "tokens_differ_within": within, "tokens": sum(len(a) for a in mine[0]["answers"])}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the commit to compare the working tree against")
    p.add_argument("--repeats", type=int, default=2, help="absorbs per method and tree [2]")
    p.add_argument("--episodes", type=int, default=1, help="test-split episodes (documents) per repeat [1]")
    p.add_argument("--threads", type=int, default=2, help="torch threads [2]")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated absorb methods [{','.join(METHODS)}]")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of every method run, e.g. ratio=0.1 (YAML values)")
    p.add_argument("--task", choices=["facts", "ruler"], default="facts",
                   help="facts: the demo's 2-person documents, test split; ruler: niah_single_2 at 2,048 tokens, "
                        "validation split [facts]")
    p.add_argument("--out", type=Path, default=None, help="a JSON file for the rows (a new file)")
    args = p.parse_args(argv)
    import yaml

    methods = tuple(m for m in args.methods.split(",") if m)
    options = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--set {item!r}: give KEY=VALUE")
        options[key] = yaml.safe_load(value)
    sys.path.insert(0, str(ROOT / "src"))
    from incontext.absorb import get_absorb_method

    for method in methods:  # every option checked here, before a worktree or a model: one line
        try:
            get_absorb_method(method, progress=False, **options)
        except (ValueError, KeyError) as error:
            p.error(str(error).strip('"'))
    if args.out is not None and args.out.exists():
        raise SystemExit(f"{args.out} exists: give a new file")
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.before], check=True,
                       capture_output=True)
        try:
            trees = {"before": before, "after": ROOT}
            rows = []
            for r in range(args.repeats):
                for index in range(args.episodes):
                    for method in methods:
                        order = list(trees) if r % 2 == 0 else list(reversed(trees))
                        for name in order:
                            result = run(trees[name], method, index, args.threads, args.task, options)
                            rows.append({"tree": name, "method": method, "episode": index, "repeat": r, **result})
                            print(f"{name:6s} {method:12s} episode {index} repeat {r}: {result['cpu_s']:.1f} s CPU per thread, "
                                  f"peak growth {result['peak_growth_gb']:.2f} GiB", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False,
                           capture_output=True)
    summary = summarise(rows, methods)
    for method, row in summary.items():
        print(f"{method}: after / before = {row['after_over_before']:.3f} ({row['after_cpu_s']:.1f} s vs "
              f"{row['before_cpu_s']:.1f} s; peak growth {row['after_peak_growth_gb']:.2f} vs {row['before_peak_growth_gb']:.2f} GiB); greedy tokens that differ: after vs before {row['tokens_differ_across']}, "
              f"within before {row['tokens_differ_within']['before']}, within after {row['tokens_differ_within']['after']} "
              f"of {row['tokens']}")
    if args.out is not None:
        args.out.write_text(json.dumps({"command": "python benchmarks/pipeline_before_after.py " + " ".join(argv or sys.argv[1:]),
                                        "before": args.before, "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
