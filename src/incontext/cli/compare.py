"""`incontext compare` and `incontext demo`: the absorb harness on one model and one task, written out as
results.json, table.md and compare.png (score vs query cost with its Pareto front; score vs kept bytes; agreement vs absorb cost).

Settings that a method takes (a learning rate) can be chosen with `tune`: each candidate runs on validation
episodes (another seed, never the test episodes) and the best validation score is used on the test episodes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..absorb import absorb_methods, get_absorb_method
from ..absorb.protocol import Speed
from ..absorb.protocol import method_options as method_option_names
from ..harness.compare import compare, method_name
from ..outputs import Result, claim_output_folder, pyplot, save_result
from ..runtime import Runtime, machine, resolve_runtime
from ..tasks.episodes import get_episode_source, questions_label
from ..tasks.metrics import get_metric

# The episode splits: an episode's seed is its split's base plus --seed. dev: the seeds compare used for its test
# episodes before splits were named (run about ten times for kv-prefix alone, and its diagnoses fed choices: no longer
# a test set); validation: where settings are chosen (--tune, sweeps); test: a fresh range, run once per change.
SPLITS = {"dev": 0, "validation": 10_000, "test": 1_000_000}
VALIDATION_SEED_OFFSET = SPLITS["validation"]  # --tune's episodes: the validation split at the same --seed


def episode_seed(split: str, seed: int) -> int:
    """The seed an episode source draws `split`'s episodes from (one-line error for an unknown split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    return SPLITS[split] + seed


@dataclass
class CompareSpec:
    model: str = "smollm2"
    task: str = "facts"
    methods: list[str] = field(default_factory=list)  # empty: every registered method (n/a where it does not apply)
    episodes: int = 20
    seed: int = 0
    split: str = "test"  # the episodes compared (SPLITS); --tune always chooses on the validation split
    task_options: dict[str, Any] = field(default_factory=dict)
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    tune: dict[str, list[Any]] = field(default_factory=dict)  # "method.option" -> candidate values
    validation_episodes: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    tf32: bool = False  # the trained methods' float32 matmuls in TF32 on a CUDA device (absorb.Speed)
    writer: str = ""  # a model (spec) that writes the data stages' questions and messages; "": the model itself
    ratio: float | None = None  # every budgeted method's kept share of the document's K/V (kv-press, kv-prefix: `ratio`)


def split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """--set values: `method.option=v` for a registered method, anything else for the task."""
    known = set(absorb_methods())
    task, methods = {}, {}
    for key, value in settings.items():
        if method_name(key) in known:
            if not isinstance(value, dict):
                raise ValueError(f"--set {key}=... needs an option: {key}.OPTION=VALUE")
            methods[key] = value
        else:
            task[key] = value
    return task, methods


def parse_tune(items: list[str]) -> dict[str, list[Any]]:
    """["dynamic-eval.learning_rate=1e-5,1e-4"] -> {"dynamic-eval.learning_rate": [1e-05, 0.0001]}."""
    from ..config import scalar

    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        method, dot, option = key.partition(".")
        if not sep or not dot or not option or not raw:
            raise ValueError(f"--tune {item!r} must look like METHOD.OPTION=v1,v2,... (e.g. dynamic-eval.learning_rate=1e-5,1e-4)")
        if method not in absorb_methods():
            raise ValueError(f"--tune {item!r}: unknown method {method!r}; methods: {', '.join(absorb_methods())}")
        try:
            out[key] = [scalar(v) for v in raw.split(",")]
        except yaml.YAMLError:
            raise ValueError(f"--tune {item!r}: a value is not a valid YAML scalar (give v1,v2,... e.g. 1e-5,1e-4)") from None
    return out


def run_compare(spec: CompareSpec, out_dir: Path | None, *, loaded=None, progress: bool = True,
                owner: str = "compare", runtime: Runtime | None = None) -> dict[str, Any]:
    """Runs the comparison (loading the model unless `loaded` is given) and writes the result files into `out_dir`,
    the output folder of `owner` (compare, or demo). `runtime`: spec's device and dtype as the caller resolved them
    (the CLI's one Runtime); resolved here from the spec when None."""
    from ..interop.models import load_model
    from .absorb import load_writer

    source = get_episode_source(spec.task, **spec.task_options)  # unknown task/options fail before loading the model
    seed = episode_seed(spec.split, spec.seed)
    methods = spec.methods or absorb_methods()
    for name in methods:
        if method_name(name) not in absorb_methods():
            raise KeyError(f"unknown method {name!r}; methods: {', '.join(absorb_methods())}")
    method_options = {name: dict(spec.method_options.get(name, {})) for name in methods}
    if spec.ratio is not None:  # --ratio: one budget for every method that takes one (an explicit --set wins)
        if not (isinstance(spec.ratio, (int, float)) and 0 < spec.ratio <= 1):
            raise ValueError(f"--ratio must be a share in (0, 1], got {spec.ratio!r}")
        for name in methods:
            if "ratio" in method_option_names(method_name(name)):
                method_options[name].setdefault("ratio", float(spec.ratio))
    for name in spec.method_options:
        if name not in methods:
            raise ValueError(f"options given for {name!r}, which is not among the compared methods ({', '.join(methods)})")
    for name, options in method_options.items():
        get_absorb_method(method_name(name), **options)  # unknown options fail here
    if spec.tune and spec.validation_episodes < 1:
        raise ValueError(f"--validation-episodes must be >= 1 with --tune, got {spec.validation_episodes}")
    for key, values in spec.tune.items():  # every candidate is checked before the model loads
        name, option = key.split(".", 1)
        if name not in methods:
            raise ValueError(f"--tune {key}: {name!r} is not among the compared methods")
        for value in values:
            get_absorb_method(method_name(name), **{**method_options[name], option: value})
    start = time.perf_counter()
    if loaded is None:
        runtime = resolve_runtime(spec.device, spec.dtype) if runtime is None else runtime
        loaded = load_model(spec.model, runtime=runtime)
    writer = load_writer(spec.writer, runtime or resolve_runtime(spec.device, spec.dtype)) if spec.writer else None
    load_s = time.perf_counter() - start
    tuning = {}
    metric = get_metric(source.metric)
    validation = source.episodes(spec.validation_episodes, episode_seed("validation", spec.seed),
                                 tokenizer=loaded.tokenizer, task=loaded.task) if spec.tune else []
    for key, values in spec.tune.items():
        name, option = key.split(".", 1)
        scores = {}
        for value in values:
            row = compare(loaded.model, source, validation, {name: {**method_options[name], option: value}},
                          progress=False, references=False, codec=loaded.tokenizer, speed=Speed(tf32=spec.tf32),
                          writer=writer)[-1]
            scores[repr(value)] = row[metric.tune_by]["mean"] if row["status"] == "ok" else None  # e.g. exact: log-prob
        valid = [(s, v) for v, s in zip(values, scores.values()) if s is not None and math.isfinite(s)]
        if valid:
            best = (max if metric.tune_higher_is_better else min)(valid, key=lambda sv: sv[0])[1]
            method_options[name][option] = best
        tuning[key] = {"criterion": metric.tune_by, "validation_scores": scores, "chosen": method_options[name].get(option),
                       "validation_episodes": spec.validation_episodes, "validation_seed": episode_seed("validation", spec.seed)}
    episodes = source.episodes(spec.episodes, seed, tokenizer=loaded.tokenizer, task=loaded.task)
    rows = compare(loaded.model, source, episodes, method_options, progress=progress, codec=loaded.tokenizer,
                   speed=Speed(tf32=spec.tf32), writer=writer, per_episode=True)  # paired intervals from the file
    results = {
        "model": spec.model, "model_description": loaded.description, "task": spec.task, "metric": source.metric,
        "higher_is_better": source.higher_is_better, "task_options": vars(source.config), "episodes": len(episodes),
        "queries": sum(len(e.queries) for e in episodes), "seed": spec.seed, "split": spec.split,
        "episode_seed": seed, "training_questions": questions_label(vars(source.config)),
        "mean_prompt_tokens": sum(e.prompt.shape[0] for e in episodes) / len(episodes),
        "tuning": tuning, "rows": rows, "model_load_s": load_s, "torch_threads": _threads(),
        "wall_s": time.perf_counter() - start,  # from the model's load to the last method's last query
        "device": spec.device, "dtype": spec.dtype, "machine": machine(spec.device if runtime is None else runtime.device),
        "backend": getattr(loaded.model, "backend", None),
        "command": command_line(spec),
    }
    if out_dir is not None:
        write_results(results, out_dir, owner)
    return results


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def command_line(spec: CompareSpec) -> str:
    parts = [f"incontext compare --model {spec.model} --task {spec.task} --episodes {spec.episodes} --seed {spec.seed}"
             + ("" if spec.split == "test" else f" --split {spec.split}")]
    if spec.methods:
        parts.append("--methods " + ",".join(spec.methods))
    parts += [f"--set {k}={v}" for k, v in spec.task_options.items()]
    def flat(prefix: str, options: dict) -> list[str]:  # nested options (study.*) as dotted keys
        return [item for k, v in options.items()
                for item in (flat(f"{prefix}.{k}", v) if isinstance(v, dict) else [f"--set {prefix}.{k}={v}"])]

    parts += [item for m, options in spec.method_options.items() for item in flat(m, options)]
    parts += [f"--tune {k}=" + ",".join(map(str, v)) for k, v in spec.tune.items()]
    if spec.tune and spec.validation_episodes != CompareSpec.validation_episodes:
        parts.append(f"--validation-episodes {spec.validation_episodes}")
    if spec.device != "cpu":
        parts.append(f"--device {spec.device}")
    if spec.dtype != "float32":
        parts.append(f"--dtype {spec.dtype}")
    if spec.tf32:
        parts.append("--tf32")
    if spec.writer:
        parts.append(f"--writer {spec.writer}")
    if spec.ratio is not None:
        parts.append(f"--ratio {spec.ratio:g}")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------- writing


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
    """'test split (episode seeds from 1000000)'; runs from before splits were named: their seed-0 episodes are
    the dev split."""
    split = results.get("split", "dev")
    first = results.get("episode_seed", results.get("seed", 0))
    return f"{split} split (episode seeds from {first})"


def setting_label(results: dict) -> str:
    """What the methods saw besides the document: nothing, or the task's training questions (and who got them)."""
    questions = results.get("training_questions")
    if "training_questions" not in results and results.get("task") == "facts":  # runs before the option: paraphrases
        questions = "training questions (the task's default before it was labelled)"
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
