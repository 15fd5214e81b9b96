"""The field's benchmarks' tables and curves from the compares of run.sh (runs/field-SPLIT/*/results.json): per model
and task, the references (keep-prompt, drop-prompt) and each method's score and its share of keep-prompt's at each
kept share of the document's K/V (measured: the method's kept bytes over keep-prompt's, mean over episodes).
    python results/field-benchmarks/summary.py --split validation|test
writes results/field-benchmarks/field-SPLIT.{md,json} and curve-SPLIT-MODEL-TASK.png; the points of field-SPLIT.json that
no run found now replaces are kept (runs/ is scratch)."""

import argparse
import json
from pathlib import Path

import matplotlib

from incontext.stats import paired_share_interval95

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
MODELS = {"smollm2": "SmolLM2-135M-Instruct", "qwen05": "Qwen2.5-Coder-0.5B-Instruct"}
# the field's published figures, quoted beside ours (their model named): none is on our models
PUBLISHED = {
    "ruler": "kvpress leaderboard, RULER 4k, Llama-3.1-8B-Instruct: full cache 95.7; KVzip keeps 95.3 / 94.9 / 90.5 at "
             "30 / 20 / 10% of the K/V",
    "squad": "SQuAD v1.1 dev F1 of extractive readers: BERT-base 88.5 (Devlin et al. 2019); SHINE and Doc-to-LoRA report "
             "SQuAD F1 for their own generators on larger models (see their papers)",
}


def collect(scratch: Path) -> list[dict]:
    points = []
    for file in sorted(scratch.glob("*/results.json")):
        results = json.loads(file.read_text())
        model, task, budget = file.parent.name.split("-", 2)
        trained = budget.endswith("-trained")  # the trained absorbers' run at a budget, KVzip beside them (issue 79)
        budget = budget.removesuffix("-trained")
        rows = {row["method"]: row for row in results["rows"]}
        keep = rows["keep-prompt"]
        for label, row in rows.items():
            if trained and (label in ("keep-prompt", "drop-prompt") or label.startswith("kv-press")) \
                    and not label.startswith("kv-press:kvzap"):  # KVzap's trained scorer is in no press run
                label = f"{label} (trained run)"  # the press run's rows stand for these in the tables
            elif label in ("keep-prompt", "drop-prompt") and budget not in ("refs", "methods"):
                label = f"{label} (press run)"
            ok = row["status"] == "ok"
            paired = None
            if ok and len(row.get("episode_scores", [])) > 1 and label not in ("keep-prompt", "drop-prompt") \
                    and keep["score"]["mean"]:
                paired = paired_share_interval95([e["score"] for e in row["episode_scores"]],
                                                 [e["score"] for e in keep["episode_scores"]])
            extra = {key: row[key]["mean"] for key in ("em", "contains") if ok and isinstance(row.get(key), dict)}
            points.append({
                "model": model, "task": task, "group": budget if budget in ("refs", "methods") else "presses",
                "budget": None if budget in ("refs", "methods") else float(budget), "method": label,
                "status": row["status"], "reason": row.get("reason", ""),
                "score": row["score"]["mean"] if ok else None, "low": row["score"]["low"] if ok else None,
                "high": row["score"]["high"] if ok else None, **extra,
                "keep_prompt": keep["score"]["mean"],
                "share_of_keep_prompt": row["score"]["mean"] / keep["score"]["mean"] if ok and keep["score"]["mean"] else None,
                "share_interval": None if paired is None else [paired["low"], paired["high"]],
                "kept_share": row["kept_bytes"] / keep["kept_bytes"] if ok and keep["kept_bytes"] else None,
                "absorb_ms": row.get("absorb_ms"), "query_ms": row.get("query_ms"), "kept_bytes": row.get("kept_bytes"),
                "episodes": results["episodes"], "queries": results["queries"],
                "prompt_tokens": results["mean_prompt_tokens"], "metric": results["metric"], "command": results["command"]})
    return points


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:.1f}"


def _task_label(task: str) -> str:
    """"ruler_niah_single_2_2048" -> "ruler niah_single_2 @2048"; "squad_bare" -> "squad (wording=bare)"."""
    if task.startswith("ruler_"):
        kind, _, length = task.removeprefix("ruler_").rpartition("_")
        return f"ruler {kind} @{length}"
    name, _, variant = task.partition("_")
    return f"{name} (wording={variant})" if variant else name


def table(points: list[dict]) -> str:
    lines = []
    refs = [p for p in points if p.get("group", "refs") == "refs" and p["budget"] is None]
    if refs:
        lines += ["What each model reads: the prompted reference (keep-prompt: the document in the context) and the floor "
                  "(drop-prompt); squad and hotpotqa F1 (EM, contains), ruler string match; % with 95% intervals over "
                  "episodes.", "",
                  "| model | task | tokens a document | episodes (questions) | keep-prompt | drop-prompt |",
                  "|---|---|---|---|---|---|"]
        for (model, task) in dict.fromkeys((p["model"], p["task"]) for p in refs):
            mine = {p["method"]: p for p in refs if p["model"] == model and p["task"] == task}
            cells = []
            for method in ("keep-prompt", "drop-prompt"):
                p = mine[method]
                extra = "" if p.get("em") is None else f" ({_pct(p['em'])}, {_pct(p.get('contains'))})"
                cells.append(f"{_pct(p['score'])} [{_pct(p['low'])}, {_pct(p['high'])}]{extra}")
            first = mine["keep-prompt"]
            lines.append(f"| {MODELS.get(model, model)} | {_task_label(task)} | {first['prompt_tokens']:.0f} | "
                         f"{first['episodes']} ({first['queries']}) | " + " | ".join(cells) + " |")
        lines.append("")
    for model in dict.fromkeys(p["model"] for p in points):
        for task in dict.fromkeys(p["task"] for p in points if p["model"] == model and p["budget"] is not None):
            curve = [p for p in points if p["model"] == model and p["task"] == task and p["budget"] is not None]
            first = curve[0]
            budgets = sorted({p["budget"] for p in curve}, reverse=True)
            lines += [f"**{MODELS.get(model, model)}, {_task_label(task)}**: {first['episodes']} episodes "
                      f"({first['queries']} questions), {first['prompt_tokens']:.0f} tokens a document; keep-prompt "
                      f"{_pct(first['keep_prompt'])} ({'F1' if first['metric'] == 'squad' else 'string match'} %)", "",
                      "| method | " + " | ".join(f"{100 * b:g}% kept" for b in budgets) + " | absorb s |",
                      "|---|" + "---|" * (len(budgets) + 1)]
            methods = [m for m in dict.fromkeys(p["method"] for p in curve) if ("(press run)" not in m or
                       m.startswith("drop-prompt")) and "(trained run)" not in m]
            for method in methods:
                cells, absorb = [], []
                for b in budgets:
                    p = next((p for p in curve if p["method"] == method and p["budget"] == b), None)
                    if p is None:
                        cells.append("")
                    elif p["score"] is None:
                        cells.append(f"{p['status']}: {p['reason'][:80]}")
                    else:
                        band = "" if not p["share_interval"] else \
                            f" [{100 * p['share_interval'][0]:.0f}, {100 * p['share_interval'][1]:.0f}]"
                        share = "" if p["share_of_keep_prompt"] is None else f"{100 * p['share_of_keep_prompt']:.0f}%"
                        cells.append(f"{_pct(p['score'])} ({share}{band}; {_pct(p['kept_share'])}% kept)")
                        absorb.append((p["absorb_ms"] or 0) / 1000)
                lines.append(f"| {method.replace(' (press run)', '')} | " + " | ".join(cells) +
                             (f" | {max(absorb):.1f} |" if absorb else " | |"))
            lines.append("")
    for model in dict.fromkeys(p["model"] for p in points):
        for task in dict.fromkeys(p["task"] for p in points if p["model"] == model and p.get("group") == "methods"):
            rows = [p for p in points if p["model"] == model and p["task"] == task and p.get("group") == "methods"]
            first = rows[0]
            lines += [f"**{MODELS.get(model, model)}, {_task_label(task)}, the demo's methods at their defaults**: "
                      f"{first['episodes']} episodes ({first['queries']} questions), {first['prompt_tokens']:.0f} tokens "
                      f"a document", "",
                      f"| method | {'F1' if first['metric'] == 'squad' else 'string match'} % [95% CI] | share of "
                      "keep-prompt's [paired 95%] | kept share of the K/V | absorb s |", "|---|---|---|---|---|"]
            for p in rows:
                if p["score"] is None:
                    lines.append(f"| {p['method']} | {p['status']}: {p['reason'][:80]} | | | |")
                    continue
                band = "" if not p["share_interval"] else \
                    f" [{100 * p['share_interval'][0]:.0f}, {100 * p['share_interval'][1]:.0f}]"
                share = "" if p["share_of_keep_prompt"] is None else f"{100 * p['share_of_keep_prompt']:.0f}%{band}"
                lines.append(f"| {p['method']} | {_pct(p['score'])} [{_pct(p['low'])}, {_pct(p['high'])}] | {share} | "
                             f"{_pct(p['kept_share'])}% | {(p['absorb_ms'] or 0) / 1000:.1f} |")
            lines.append("")
    if any(p["budget"] is not None for p in points):
        lines.append("Cells: the score (its share of keep-prompt's on the same episodes, with a paired bootstrap 95% "
                     "interval over episodes; the measured kept share of the document's K/V bytes). absorb s: the largest "
                     "per-document absorb time over the budgets (CPU time per thread, 2 threads).")
    tasks = {p["task"].split("_")[0] for p in points}
    lines += [f"Published, for scale (other models): {PUBLISHED[t]}." for t in PUBLISHED if t in tasks]
    return "\n".join(lines)


def plot(points: list[dict], split: str) -> list[Path]:
    paths = []
    for model in dict.fromkeys(p["model"] for p in points):
        for task in dict.fromkeys(p["task"] for p in points if p["model"] == model):
            mine = [p for p in points if p["model"] == model and p["task"] == task and p["budget"] is not None
                    and p["score"] is not None and p["method"].startswith("kv-")]
            if not mine:
                continue
            fig, ax = plt.subplots(figsize=(5.2, 4.0))
            for method in dict.fromkeys(p["method"] for p in mine):
                line = sorted((p for p in mine if p["method"] == method), key=lambda p: p["kept_share"])
                ax.plot([100 * p["kept_share"] for p in line], [100 * p["score"] for p in line],
                        "-o" if method.startswith(("kv-prefix", "distill")) else "--.", label=method.replace("kv-press:", ""))
            ax.axhline(100 * mine[0]["keep_prompt"], color="k", lw=0.8, label="keep-prompt")
            ax.set_xscale("log")
            ax.set_xticks([5, 10, 25, 50], ["5", "10", "25", "50"])
            ax.minorticks_off()
            ax.set_xlabel("kept share of the document's K/V (%, log)")
            ax.set_ylabel("F1 %" if mine[0]["metric"] == "squad" else "string match %")
            ax.set_title(f"{MODELS.get(model, model)}, {task}, {split} ({mine[0]['episodes']} episodes)", fontsize=9)
            ax.legend(fontsize=7)
            fig.tight_layout()
            path = HERE / f"curve-{split}-{model}-{task}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)
    return paths


def merged(new: list[dict], record: Path) -> list[dict]:
    """The points of the runs found now, and those of the record (field-SPLIT.json) that no new run replaces (same
    model, task, budget and method): runs/ is scratch, gone on another machine, and the record keeps earlier runs."""
    key = lambda p: (p["model"], p["task"], p.get("group"), p["budget"], p["method"])  # noqa: E731
    fresh = {key(p) for p in new}
    kept = [p for p in json.loads(record.read_text()) if key(p) not in fresh] if record.is_file() else []
    return kept + new


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="validation", choices=["validation", "test", "dev"])
    args = parser.parse_args()
    points = merged(collect(Path("runs") / f"field-{args.split}"), HERE / f"field-{args.split}.json")
    if not points:
        raise SystemExit(f"no runs under runs/field-{args.split}: run results/field-benchmarks/run.sh first")
    (HERE / f"field-{args.split}.json").write_text(json.dumps(points, indent=1))
    (HERE / f"field-{args.split}.md").write_text(table(points) + "\n")
    for path in plot(points, args.split):
        print(path)
    print(HERE / f"field-{args.split}.md")


if __name__ == "__main__":
    main()
