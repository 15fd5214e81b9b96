"""A comparison as one job: CompareSpec (model, task, methods, split, options, tuning) -> run_compare loads the model,
runs every method on the split's episodes (harness.compare, options tuned on validation episodes by harness.tune) and
writes results.json, table.md and compare.png (harness.report); command_line is the `incontext compare` command that
reproduces a spec (recorded in results.json)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..absorb import absorb_methods, get_absorb_method
from ..absorb.distill import Speed
from ..absorb.protocol import method_options as method_option_names
from ..runtime import Runtime, machine, resolve_runtime
from ..tasks.episodes import get_episode_source, questions_label
from ..tasks.splits import episode_seed
from .compare import compare, method_name
from .report import write_results
from .tune import tune


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


def run_compare(spec: CompareSpec, out_dir: Path | None, *, loaded=None, progress: bool = True,
                owner: str = "compare", runtime: Runtime | None = None) -> dict[str, Any]:
    """Runs the comparison (loading the model unless `loaded` is given) and writes the result files into `out_dir`,
    the output folder of `owner` (compare, or demo). `runtime`: spec's device and dtype as the caller resolved them
    (the CLI's one Runtime); resolved here from the spec when None."""
    from ..interop.models import load_model
    from ..absorb.job import load_writer

    source = get_episode_source(spec.task, **spec.task_options)  # unknown task/options fail before loading the model
    seed = episode_seed(spec.split, spec.seed)
    methods = spec.methods or absorb_methods()
    for name in methods:
        if method_name(name) not in absorb_methods():
            raise KeyError(f"unknown method {name!r}; methods: {', '.join(absorb_methods())}")
    method_options = {name: dict(spec.method_options.get(name, {})) for name in methods}
    if spec.ratio is not None:  # --ratio: one budget for every method that takes one (an explicit --set wins)
        if not (isinstance(spec.ratio, (int, float)) and 0 < spec.ratio <= 1):
            raise ValueError(f"ratio must be a share in (0, 1], got {spec.ratio!r}")
        budgeted = [name for name in methods if "ratio" in method_option_names(method_name(name))]
        if not budgeted:
            raise ValueError(f"a kept share (ratio {spec.ratio}) for every budgeted method: none of the compared methods ({', '.join(methods)}) takes a budget "
                             "(kv-press and kv-prefix do)")
        for name in budgeted:
            method_options[name].setdefault("ratio", float(spec.ratio))
    for name in spec.method_options:
        if name not in methods:
            raise ValueError(f"options given for {name!r}, which is not among the compared methods ({', '.join(methods)})")
    for name, options in method_options.items():
        get_absorb_method(method_name(name), **options)  # unknown options fail here
    if spec.tune and spec.validation_episodes < 1:
        raise ValueError(f"validation episodes must be >= 1 to tune an option, got {spec.validation_episodes}")
    for key, values in spec.tune.items():  # every candidate is checked before the model loads
        name, option = key.split(".", 1)
        if name not in methods:
            raise ValueError(f"tuning {key}: {name!r} is not among the compared methods")
        for value in values:
            get_absorb_method(method_name(name), **{**method_options[name], option: value})
    start = time.perf_counter()
    runtime = runtime or resolve_runtime(spec.device, spec.dtype)  # the one Runtime: the model's, the writer's
    if loaded is None:
        loaded = load_model(spec.model, runtime=runtime)
    writer = load_writer(spec.writer, runtime) if spec.writer else None
    load_s = time.perf_counter() - start
    speed = Speed(tf32=spec.tf32)
    validation = source.episodes(spec.validation_episodes, episode_seed("validation", spec.seed),
                                 tokenizer=loaded.tokenizer, task=loaded.task) if spec.tune else []
    tuning = tune(loaded.model, source, validation, method_options, spec.tune, codec=loaded.tokenizer, speed=speed,
                  writer=writer, validation_seed=episode_seed("validation", spec.seed))
    episodes = source.episodes(spec.episodes, seed, tokenizer=loaded.tokenizer, task=loaded.task)
    rows = compare(loaded.model, source, episodes, method_options, progress=progress, codec=loaded.tokenizer,
                   speed=speed, writer=writer, per_episode=True)  # paired intervals from the file
    results = {
        "model": spec.model, "model_description": loaded.description, "task": spec.task, "metric": source.metric,
        "higher_is_better": source.higher_is_better, "task_options": vars(source.config), "episodes": len(episodes),
        "queries": sum(len(e.queries) for e in episodes), "seed": spec.seed, "split": spec.split,
        "episode_seed": seed, "training_questions": questions_label(vars(source.config)),
        "mean_prompt_tokens": sum(e.prompt.shape[0] for e in episodes) / len(episodes),
        "tuning": tuning, "rows": rows, "model_load_s": load_s, "torch_threads": _threads(),
        "wall_s": time.perf_counter() - start,  # from the model's load to the last method's last query
        "device": spec.device, "dtype": spec.dtype, "machine": machine(runtime.device),
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
