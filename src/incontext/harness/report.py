"""A comparison's report: the table (table.md), the plot (compare.png) and results.json, written into its output folder
(write_results), from the results dict harness/job.py's run_compare makes."""

from __future__ import annotations
import math
from pathlib import Path
from typing import Any
from ..outputs import Result, claim_output_folder, pyplot, save_result
from ..tasks.metrics import get_metric


def _interval(cell: dict | None, percent: bool) -> str:
    if not cell:
        return "–"
    f = (lambda x: f"{100 * x:.1f}") if percent else (lambda x: f"{x:.3f}")
    if math.isnan(cell["low"]):
        return f(cell["mean"])
    return f"{f(cell['mean'])} [{f(cell['low'])}, {f(cell['high'])}]"


def _options(row: dict) -> str:
    def flat(prefix: str, options: dict) -> list[str]:  # nested options (study.*) as dotted keys
        return [item for k, v in options.items()
                for item in (flat(f"{prefix}{k}.", v) if isinstance(v, dict) else [f"{prefix}{k}={v}"])]

    return ", ".join(flat("", row["options"]))


def table(results: dict[str, Any]) -> str:
    metric = get_metric(results["metric"])
    percent, name = metric.percent, metric.label
    extra = ([("score_calibrated", "calibrated %")] if metric.calibrated else []) + list(metric.columns.items())
    head = ["method", f"{name} [95% CI]"] + [column for _, column in extra] + \
           ["top-1 agree %", "KL (nats)", "rel. logits err", "absorb ms", "ms / query", "kept KiB", "peak MiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in results["rows"]:
        label = row["method"] + (f" ({_options(row)})" if row["options"] else "") + \
            (" [trained on the training questions]" if row.get("trained_on_questions") else "")
        if row["status"] != "ok":
            lines.append(f"| {label} | {row['status']}: {row['reason']} |" + " |" * (len(head) - 2))
            continue
        a = row["agreement"] or {"top1": None, "kl": None, "relative_logits_error": None}  # None: no prompted reference
        cells = [label, _interval(row["score"], percent)]
        cells += [_interval(row[key], True) for key, _ in extra]  # percentages: calibrated accuracy, token F1
        cells += [
            "–" if a["top1"] is None else f"{100 * a['top1']:.1f}",
            "–" if a["kl"] is None else f"{a['kl']:.3g}",
            "–" if a["relative_logits_error"] is None else f"{a['relative_logits_error']:.2g}",
            f"{row['absorb_ms']:.1f}", f"{row['query_ms']:.1f}", f"{row['kept_bytes'] / 1024:.0f}",
            "–" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.0f}",
        ]
        if row.get("failed_episodes"):
            cells[0] += f" ({row['failed_episodes']} episodes failed)"
        lines.append("| " + " | ".join(cells) + " |")
    intro = (f"{results['model_description']}, task `{results['task']}` ({results['episodes']} episodes of the "
             f"{split_label(results)}, {results['queries']} queries, prompts of {results['mean_prompt_tokens']:.0f} tokens "
             f"on average). {setting_label(results)} "
             f"Costs: medians, CPU time per thread ({results['torch_threads']} threads) or CUDA events.")
    tuned = [f"{k}: {v['chosen']} (validation scores {v['validation_scores']})" for k, v in results["tuning"].items()]
    composed = [_composition(row, percent) for row in results["rows"] if row.get("composition")]
    return (intro + "\n\n" + "\n".join(lines) + "\n"
            + ("\nComposed rows: each document absorbed alone, then combined, answering every query. " + " ".join(composed) + "\n"
               if composed else "")
            + ("\nChosen on validation episodes: " + "; ".join(tuned) + "\n" if tuned else ""))


def split_label(results: dict) -> str:
    """'test split (episode seeds from 1000000)'."""
    return f"{results['split']} split (episode seeds from {results['episode_seed']})"


def setting_label(results: dict) -> str:
    """What the methods saw besides the document: nothing, or the task's training questions (and who got them)."""
    questions = results["training_questions"]
    if not questions:
        return "The document alone: no method saw a training question."
    return (f"With {questions} (written for the facts that are asked): rows marked [trained on the training "
            f"questions] learned from them, and `keep-prompt (wording consensus)` answers each question with the same "
            f"wordings' consensus.")


def _composition(row: dict, percent: bool) -> str:
    """One sentence per composed row: each document's score composed vs absorbed alone."""
    c = row["composition"]
    f = (lambda x: f"{100 * x:.1f}%") if percent else (lambda x: f"{x:.3f}")
    parts = [f"document {i + 1} {f(a)} composed vs {f(b)} alone" + ("" if r is None else f" ({100 * r:.0f}%)")
             for i, (a, b, r) in enumerate(zip(c["composed"], c["alone"], c["ratio"]))]
    return f"{row['method']}: " + "; ".join(parts) + "."


def plot(results: dict[str, Any]):
    plt = pyplot()
    rows = [r for r in results["rows"] if r["status"] == "ok"]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.2))
    metric = get_metric(results["metric"])
    scale = 100 if metric.percent else 1
    points, middle_labels, right_labels = [], [], []
    for r in rows:
        s = r["score"]
        err = None if math.isnan(s["low"]) else [[scale * (s["mean"] - s["low"])], [scale * (s["high"] - s["mean"])]]
        left.errorbar(r["query_ms"], scale * s["mean"], yerr=err, fmt="o", capsize=3, label=r["method"])
        kept = max(r["kept_bytes"] / 1024, 1e-2)  # drop-prompt keeps nothing: drawn at the axis' floor
        middle.errorbar(kept, scale * s["mean"], yerr=err, fmt="o", capsize=3)
        middle_labels.append((kept, scale * s["mean"], r["method"]))
        points.append((r["query_ms"], s["mean"]))
        a = r["agreement"]
        if a is None:  # no prompted reference to agree with
            continue
        y = a["kl"] if a["kl"] is not None else a["relative_logits_error"]
        right.scatter(max(r["absorb_ms"], 1e-2), y, label=r["method"])
        right_labels.append((max(r["absorb_ms"], 1e-2), y, r["method"]))
    _labels(middle, middle_labels)
    _labels(right, right_labels)
    better = (lambda a, b: a > b) if results["higher_is_better"] else (lambda a, b: a < b)
    front = []  # the cheapest point, then each point that beats every cheaper one
    for cost, score in sorted(points):
        if not front or better(score, front[-1][1]):
            front.append((cost, score))
    if len(front) > 1:
        left.plot([c for c, _ in front], [scale * s for _, s in front], "k--", lw=1, label="Pareto front")
    costs = [c for c, _ in points]
    if costs and max(costs) > 5 * min(costs):
        left.set_xscale("log")
    left.set_xlabel("query cost (ms per query)")
    left.set_ylabel(metric.label)
    left.set_title(f"{results['task']}: score vs query cost ("
                   + ("with training questions" if results.get("training_questions") else "document alone") + ")")
    middle.set_xscale("log")
    middle.set_xlabel("kept KiB per prompt (log; drawn at >= 0.01)")
    middle.set_ylabel(left.get_ylabel())
    middle.set_title("score vs memory kept for the prompt")
    left.legend(fontsize=8)
    right.set_xscale("log")
    right.set_xlabel("absorb cost (ms per prompt; drawn at >= 0.01)")
    right.set_ylabel("KL(prompted || method)" if rows and (rows[0]["agreement"] or {}).get("kl") is not None
                     else "relative logits error")
    right.set_title("agreement with the prompted model")
    fig.tight_layout()
    return fig


def _labels(ax, points: list[tuple[float, float, str]]) -> None:
    """Each point's name beside it (x on a log axis); names of points that nearly coincide are stacked downwards
    rather than drawn over one another (two methods with the same score and kept bytes, say)."""
    ys = [y for _, y, _ in points]
    span = (max(ys) - min(ys) if ys else 0.0) or 1.0
    placed: list[tuple[float, float]] = []
    for x, y, name in points:
        near = sum(abs(math.log10(x) - math.log10(px)) < 0.4 and abs(y - py) < 0.05 * span for px, py in placed)
        ax.annotate(name, (x, y), fontsize=8, xytext=(3, 3 - 10 * near), textcoords="offset points")
        placed.append((x, y))


def write_results(results: dict[str, Any], out_dir: Path, owner: str = "compare") -> None:
    claim_output_folder(out_dir, owner)
    save_result(Result(results, {"table.md": table}, {"compare.png": plot}), out_dir)
