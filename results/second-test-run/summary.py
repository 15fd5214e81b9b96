"""The second test run's one table (run.sh): per run and method, its right answers, their share of keep-prompt's with
a paired bootstrap 95% interval (episodes resampled together; stats.paired_share_interval95), the first run's share
beside it (its file kept no per-episode scores: no interval), the kept share of keep-prompt's bytes; and the split of
kv-prefix's questions by whether its derived queries covered them (the question or its fact's cloze among the queries
it trained on), with keep-prompt's answers on the same questions.
    python results/second-test-run/summary.py      # writes summary.{md,json} beside it"""

import json
from pathlib import Path

from incontext.stats import paired_share_interval95

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
# run -> (this run's folder, the first run's folder, the reference the shares are of)
RUNS = {"demo": ("results/demo", "results/demo-derived-queries", "keep-prompt"),
        "facts": ("results/second-test-run/facts", "results/self-study-test/facts", "keep-prompt"),
        "documents": ("results/second-test-run/documents", "results/self-study-test/documents", "keep-prompt"),
        "facts-questions": ("results/second-test-run/facts-questions", "results/compare-smollm2-facts-test-questions",
                            "keep-prompt (wording consensus)")}


def rows(folder: str) -> tuple[dict, dict]:
    results = json.loads((ROOT / folder / "results.json").read_text())
    return results, {r["method"]: r for r in results["rows"]}


def answers(row: dict, queries_per_episode: float) -> int:
    return round(sum(e["score"] for e in row["episode_scores"]) * queries_per_episode)


def collect() -> list[dict]:
    out = []
    for run, (folder, first, reference) in RUNS.items():
        results, by = rows(folder)
        _, before = rows(first)
        per = results["queries"] / results["episodes"]
        ref = by[reference]
        for method, row in by.items():
            if method in ("keep-prompt", reference) or row["status"] != "ok":
                continue
            paired = paired_share_interval95([e["score"] for e in row["episode_scores"]],
                                             [e["score"] for e in ref["episode_scores"]])
            old = before.get(method)
            old_share = None if old is None or old.get("status") != "ok" or not before[reference]["score"]["mean"] \
                else old["score"]["mean"] / before[reference]["score"]["mean"]
            record = {"run": run, "task": results["task"], "episodes": results["episodes"], "method": method,
                      "reference": reference, "right": answers(row, per), "reference_right": answers(ref, per),
                      "share": paired["share"], "interval": [paired["low"], paired["high"]], "first_run_share": old_share,
                      "kept_share": row["kept_bytes"] / by["keep-prompt"]["kept_bytes"], "command": results["command"]}
            split = row.get("by_derived")
            if split is not None:  # keep-prompt's answers on the same questions, split the same way
                flags = [[q["asked_derived"] or q["cloze_derived"] for q in e] for e in row["questions"]]
                kept = by["keep-prompt"]  # the prompted model's answers to the same questions
                for key, want in (("covered", True), ("not_covered", False)):
                    split[key]["reference_right"] = sum(q["right"] for e, f in zip(kept["questions"], flags)
                                                        for q, flag in zip(e, f) if flag == want)
                record["by_derived"] = split
            out.append(record)
    return out


def pct(x) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def table(records: list[dict]) -> str:
    lines = ["| run | method | right (reference's) | share of the reference [95% paired CI] | first run's share | kept bytes |",
             "|---|---|---|---|---|---|"]
    for r in records:
        low, high = r["interval"]
        lines.append(f"| {r['run']} ({r['episodes']} episodes) | {r['method']} | {r['right']} ({r['reference_right']}) | "
                     f"{pct(r['share'])} [{pct(low)}, {pct(high)}] | {pct(r['first_run_share'])} | {pct(r['kept_share'])} |")
    lines += ["", "| run | method | covered: right / asked (keep-prompt's right) | not covered: right / asked (keep-prompt's right) |",
              "|---|---|---|---|"]
    for r in records:
        split = r.get("by_derived")
        if split:
            c, n = split["covered"], split["not_covered"]
            lines.append(f"| {r['run']} | {r['method']} | {c['right']} / {c['asked']} ({c['reference_right']}) | "
                         f"{n['right']} / {n['asked']} ({n['reference_right']}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    records = collect()
    (HERE / "summary.json").write_text(json.dumps(records, indent=1) + "\n")
    (HERE / "summary.md").write_text(table(records))
    print(table(records))


if __name__ == "__main__":
    main()
