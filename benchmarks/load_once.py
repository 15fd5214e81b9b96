"""Wall time of the commands that load a shipped model: `generate --max-new-tokens 1` cold (an empty converted-model
cache) and warm, and absorb + three questions on one document, for smollm2 and gemma3-270m.

Each command runs as a child process with its own INCONTEXT_CACHE (a temporary folder: cold = empty, warm = after
one conversion), from the source tree `--src` (default: this checkout's src/; give an export of an older commit for
the "before" rows: `git archive COMMIT src | tar -x -C /tmp/before` then `--src /tmp/before/src --label before`).
Reported per command: wall seconds and the child's CPU seconds (user + system, from getrusage; steadier than wall
time on a shared machine), the median over --repeats, with the 1-minute load average when it ran. A source tree
without `generate --prompts-file` asks the three questions with three `generate` runs (the only way it has);
one with it also runs that way (the cache alone) and with one --prompts-file run. Appends to
benchmarks/results/load_once.json and rewrites load_once.md.

    python benchmarks/load_once.py [--models smollm2,gemma3-270m] [--repeats 3] [--src DIR --label before]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
DOCUMENT = ("Alia Brenno was born in Beaport in 1931. She worked as a potter and later ran the town's museum.\n"
            "Her brother Tomas Brenno was a fisherman who lived in Calder.\n")
QUESTIONS = {"smollm2": ["Where was Alia Brenno born?", "What did Alia Brenno work as?", "Where did Tomas Brenno live?"],
             "gemma3-270m": ["Alia Brenno was born in", "Alia Brenno worked as a", "Tomas Brenno lived in"]}
CHAT = {"smollm2": ["--chat"], "gemma3-270m": []}  # gemma3-270m is a base model: completions, no template


def timed(command: list[str], env: dict[str, str]) -> dict[str, float]:
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {run.stderr.strip().splitlines()[-1:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": round(load, 2)}


def total(parts: list[dict[str, float]]) -> dict[str, float]:
    return {"wall_s": round(sum(p["wall_s"] for p in parts), 2), "cpu_s": round(sum(p["cpu_s"] for p in parts), 2),
            "load_1min": round(max(p["load_1min"] for p in parts), 2)}


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in runs), 2) for key in runs[0]} | {"repeats": len(runs)}


def measure(model: str, src: Path, repeats: int, work: Path) -> dict[str, dict]:
    cli = [sys.executable, "-m", "incontext.cli"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    has_prompts_file = "--prompts-file" in subprocess.run(cli + ["generate", "--help"], env=env, capture_output=True,
                                                          text=True).stdout
    hi = cli + ["generate", "--model", model, "--max-new-tokens", "1", "Hi"]
    rows = {}
    cache = work / f"cache-{model}"
    cold = {**env, "INCONTEXT_CACHE": str(cache)}
    rows["generate, cold cache"] = timed(hi, cold)  # converts (new code) or assembles Gemma's GGUF (old code)
    rows["generate, warm cache"] = median([timed(hi, cold) for _ in range(repeats)])
    document = work / "document.txt"
    document.write_text(DOCUMENT)
    absorb = cli + ["absorb", "--model", model, "--method", "keep-prompt", "--prompt-file", str(document)]
    ask = cli + ["generate", "--model", model, *CHAT[model], "--max-new-tokens", "12"]

    def three_runs(out: Path) -> dict[str, float]:
        parts = [timed(absorb + ["--out", str(out)], cold)]
        parts += [timed(ask + ["--adapted", str(out), question], cold) for question in QUESTIONS[model]]
        return total(parts)

    rows["absorb + 3 questions (3 generate runs), warm"] = median([three_runs(work / f"a-{model}-{i}") for i in range(repeats)])
    if has_prompts_file:
        questions = work / f"questions-{model}.txt"
        questions.write_text("\n".join(QUESTIONS[model]) + "\n")

        def one_run(out: Path) -> dict[str, float]:
            return total([timed(absorb + ["--out", str(out)], cold),
                          timed(ask + ["--adapted", str(out), "--prompts-file", str(questions)], cold)])

        rows["absorb + 3 questions (1 generate --prompts-file), warm"] = median(
            [one_run(work / f"b-{model}-{i}") for i in range(repeats)])
    return rows


def markdown(records: list[dict]) -> str:
    lines = ["# Loading a shipped model once (benchmarks/load_once.py)", "",
             "Wall and CPU seconds (user + system) of whole commands, median over the repeats; the 1-minute load "
             "average of the machine when each ran (2 cores, shared: wall time grows with the load, CPU time much "
             "less). Cold: an empty converted-model cache; warm: after one conversion.", "",
             "| label | commit | model | command | wall s | CPU s | load |", "|---|---|---|---|---:|---:|---:|"]
    for record in records:
        for model, rows in record["models"].items():
            for name, row in rows.items():
                lines.append(f"| {record['label']} | {record['commit']} | {model} | {name} | {row['wall_s']} | "
                             f"{row['cpu_s']} | {row['load_1min']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="smollm2,gemma3-270m")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    p.add_argument("--label", default="after")
    p.add_argument("--commit", default=None, help="the commit --src holds (default: this checkout's HEAD)")
    args = p.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).resolve().parent).stdout.strip()
    record = {"label": args.label, "commit": commit, "cores": os.cpu_count(), "models": {}}
    with tempfile.TemporaryDirectory() as work:
        for model in [m.strip() for m in args.models.split(",") if m.strip()]:
            record["models"][model] = measure(model, args.src, args.repeats, Path(work))
            print(json.dumps({model: record["models"][model]}, indent=1), flush=True)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "load_once.json"
    records = json.loads(path.read_text()) if path.is_file() else []
    records = [r for r in records if (r["label"], r["commit"]) != (args.label, commit)] + [record]
    path.write_text(json.dumps(records, indent=2) + "\n")
    (RESULTS / "load_once.md").write_text(markdown(records))
    print(markdown([record]))


if __name__ == "__main__":
    main()
