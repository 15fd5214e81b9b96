"""The compression curve's one table and plot from the compares of run.sh (runs/press-curve-SPLIT/*/results.json):
per task and method, the exact-match score and its share of keep-prompt's answers at each kept share of the
document's K/V (measured: the method's kept bytes over keep-prompt's, the mean over episodes).
    python results/press-curve/summary.py [--split validation|test]
writes results/press-curve/curve-SPLIT.{md,json,png}."""

import argparse
import json
from pathlib import Path

import matplotlib

from incontext.stats import paired_share_interval95

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
TASKS = {"facts": "facts (2 people)", "documents": "documents", "long": "long facts (14 people)"}


def collect(scratch: Path) -> list[dict]:
    points = []
    for file in sorted(scratch.glob("*/results.json")):
        results = json.loads(file.read_text())
        name = file.parent.name
        trained = name.startswith("trained-")
        task, budget = name.removeprefix("trained-").rsplit("-", 1)
        rows = {row["method"]: row for row in results["rows"]}
        keep = rows["keep-prompt"]
        for label, row in rows.items():
            if label in ("keep-prompt", "drop-prompt") and budget != "0.25":
                continue  # the references once per task (their numbers do not depend on the budget)
            ok = row["status"] == "ok"
            paired = None
            if ok and len(row.get("episode_scores", [])) > 1 and "episode_scores" in keep:  # episodes resampled together
                paired = paired_share_interval95([e["score"] for e in row["episode_scores"]],
                                                 [e["score"] for e in keep["episode_scores"]])
            points.append({
                "task": task, "group": "trained" if trained else "presses", "budget": None if label in ("keep-prompt", "drop-prompt") else float(budget),
                "method": label, "status": row["status"], "reason": row.get("reason", ""),
                "score": row["score"]["mean"] if ok else None, "low": row["score"]["low"] if ok else None,
                "high": row["score"]["high"] if ok else None,
                "share_of_keep_prompt": row["score"]["mean"] / keep["score"]["mean"] if ok and keep["score"]["mean"] else None,
                "kept_share": row["kept_bytes"] / keep["kept_bytes"] if ok else None,
                "share_interval": None if paired is None else [paired["low"], paired["high"]],
                "kept_bytes": row.get("kept_bytes"), "absorb_ms": row.get("absorb_ms"), "train_steps": row.get("train_steps"), "episodes": results["episodes"],
                "queries": results["queries"], "prompt_tokens": results["mean_prompt_tokens"],
                "command": results["command"]})
    return points


def table(points: list[dict]) -> str:
    lines = []
    for task in TASKS:
        for group in ("presses", "trained"):
            mine = [p for p in points if p["task"] == task and p["group"] == group]
            if not mine:
                continue
            budgets = sorted({p["budget"] for p in mine if p["budget"] is not None}, reverse=True)
            ref = {p["method"]: p for p in mine if p["budget"] is None}
            what = "kvpress's presses" if group == "presses" else "the trained methods, with KVzip on the same episodes"
            head = (f"**{TASKS[task]}**, {what}: {mine[0]['episodes']} episodes ({mine[0]['queries']} questions), "
                    f"{mine[0]['prompt_tokens']:.0f} tokens a document; keep-prompt {100 * ref['keep-prompt']['score']:.1f}%, "
                    f"drop-prompt {100 * ref['drop-prompt']['score']:.1f}% (exact match)")
            lines += [head, "", "| method | " + " | ".join(f"{100 * b:g}% kept" for b in budgets) + " | absorb s |",
                      "|---|" + "---|" * (len(budgets) + 1)]
            for method in dict.fromkeys(p["method"] for p in mine if p["budget"] is not None):
                cells, absorb = [], []
                for b in budgets:
                    p = next((p for p in mine if p["method"] == method and p["budget"] == b), None)
                    if p is None:
                        cells.append("")
                    elif p["score"] is None:
                        cells.append(p["status"])
                    else:
                        steps = "" if p.get("train_steps") is None else f"; {p['train_steps']:g} steps"
                        band = "" if not p.get("share_interval") else \
                            f" [{100 * p['share_interval'][0]:.0f}, {100 * p['share_interval'][1]:.0f}]"
                        cells.append(f"{100 * p['score']:.1f}% ({100 * p['share_of_keep_prompt']:.0f}%{band}; "
                                     f"{100 * p['kept_share']:.1f}% kept{steps})")
                        absorb.append(p["absorb_ms"] / 1000)
                lines.append(f"| {method} | " + " | ".join(cells) + (f" | {max(absorb):.1f} |" if absorb else " | |"))
            lines.append("")
    lines.append("Cells: exact match (its share of keep-prompt's answers on the same episodes, with a paired bootstrap 95% "
                 "interval where the run kept per-episode scores; the measured kept share of "
                 "the document's K/V bytes: distill-lora's adapter bytes against the same K/V). absorb s: the largest "
                 "per-document absorb time over the budgets (CPU time per thread, 2 threads); steps: a trained method's "
                 "training steps before its plateau stop (median over the episodes).")
    return "\n".join(lines)


def plot(points: list[dict], path: Path) -> None:
    tasks = [t for t in TASKS if any(p["task"] == t for p in points)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        mine = [p for p in points if p["task"] == task and p["budget"] is not None and p["score"] is not None
                and (p["group"] == "presses" or not p["method"].startswith("kv-press"))]
        for method in dict.fromkeys(p["method"] for p in mine):
            line = sorted((p for p in mine if p["method"] == method), key=lambda p: p["kept_share"])
            style = "-o" if method.startswith(("kv-prefix", "distill")) else "--."
            ax.plot([p["kept_share"] * 100 for p in line], [p["share_of_keep_prompt"] * 100 for p in line], style,
                    label=method.replace("kv-press:", ""))
        ax.axhline(100, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xticks([5, 10, 25, 50], ["5", "10", "25", "50"])
        ax.minorticks_off()
        ax.set_xlabel("kept share of the document's K/V (%, log)")
        ax.set_ylabel("exact match, % of keep-prompt's")
        ax.set_title(f"{TASKS[task]}, {mine[0]['prompt_tokens']:.0f} tokens" if mine else TASKS[task], fontsize=9)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", default="validation")
    args = parser.parse_args()
    points = collect(Path("runs") / f"press-curve-{args.split}")
    stem = HERE / f"curve-{args.split}"
    Path(f"{stem}.json").write_text(json.dumps(points, indent=1) + "\n")
    Path(f"{stem}.md").write_text(table(points) + "\n")
    plot(points, Path(f"{stem}.png"))
    print(table(points))


if __name__ == "__main__":
    main()
