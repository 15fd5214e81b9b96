"""The `incontext` command line.

    incontext demo                                   # the main job: in-context linear regression vs least squares
    incontext train CONFIG [--set section.key=v] [--resume]   # train from a YAML config (torchrun for many processes)
    incontext eval CHECKPOINT                        # re-run a checkpoint's evaluation
    incontext run EXPERIMENT [--set k=v]             # any registered experiment
    incontext list                                   # tasks, models, experiments, configs
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

DEFAULT_OUT = Path("runs")


def _run_experiment(name: str, overrides: list[str], out: Path | None) -> dict:
    from .config import apply_overrides
    from .experiments import get_experiment

    experiment = get_experiment(name)
    config = apply_overrides(experiment.config_class(), overrides)
    out_dir = out or DEFAULT_OUT / name
    print(f"{name}: {experiment.description}")
    print(f"config: {json.dumps(dataclasses.asdict(config))}")
    results = experiment.run(config, out_dir)
    table = out_dir / "table.md"
    if table.exists():
        print(table.read_text())
    print(f"results: {out_dir / 'results.json'}")
    for plot in sorted(out_dir.glob("*.png")):
        print(f"plot:    {plot}")
    return results


def cmd_demo(args: argparse.Namespace) -> int:
    results = _run_experiment("regression-demo", args.set, args.out)
    curves = results["mse_by_examples"]
    last = len(next(iter(curves.values()))) - 1
    print(f"squared error after {last} in-context examples: "
          + ", ".join(f"{name} {curve[-1]:.3f}" for name, curve in curves.items()))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _run_experiment(args.experiment, args.set, args.out)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from .train import load_config, train
    from .train.config import replace_run

    config = load_config(args.config, args.set)
    if args.out is not None:
        config = replace_run(config, out_dir=str(args.out))
    results = train(config, resume=args.resume, progress=not args.no_progress)
    if int(os.environ.get("RANK", "0")) == 0:
        run_dir = Path(config.run.out_dir)
        print(f"final evaluation: {json.dumps(_scalars(results['eval']))}")
        print(f"run folder: {run_dir} (metrics.jsonl, checkpoints/, loss.png, results.json, tensorboard/)")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from .train import evaluate_checkpoint, resolve_checkpoint
    from .train.checkpoint import read_state

    checkpoint = resolve_checkpoint(args.checkpoint)
    metrics = evaluate_checkpoint(checkpoint, device=args.device)
    step = read_state(checkpoint)["step"]
    print(f"checkpoint {checkpoint} (step {step})")
    print(json.dumps(metrics if args.full else _scalars(metrics), indent=2))
    return 0


def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}


def cmd_list(args: argparse.Namespace) -> int:
    from .experiments import list_experiments
    from .models.transformer import _CHOICES
    from .tasks import get_task, list_tasks

    print("tasks:")
    for name in list_tasks():
        print(f"  {name:24s} {get_task(name).config}")
    print("models:")
    print("  transformer              TransformerConfig options: " + "; ".join(f"{k} {'|'.join(v)}" for k, v in _CHOICES.items()))
    print("experiments:")
    for experiment in list_experiments():
        print(f"  {experiment.name:24s} {experiment.description}")
    configs = sorted(Path("configs").glob("*.yaml"))
    print("configs:" + ("" if configs else " (none in ./configs)"))
    for path in configs:
        first = next((line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
        print(f"  {str(path):32s} {first}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="incontext",
        description="In-context learning and context-to-weights methods (CGT, ICLCA, TinT, residual attention "
        "streams): train, convert, compare and reproduce.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add_common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field (repeatable), e.g. --set steps=500 --set seed=1")
        p.add_argument("--out", type=Path, default=None, help="output folder (default: runs/<experiment>)")

    demo = sub.add_parser(
        "demo",
        help="main job: train a small transformer on in-context linear regression (~2 min on 2 CPU cores)",
        description="Train a 4-layer transformer on in-context linear regression and print its squared error "
        "next to least squares and ridge (Bayes-optimal) by number of in-context examples; writes "
        "results.json, table.md and a plot.",
    )
    add_common(demo)
    demo.set_defaults(func=cmd_demo)

    trainer = sub.add_parser(
        "train",
        help="train a model from a YAML config",
        description="Train from a YAML config (sections model, task, optimizer, schedule, run; see configs/). "
        "Writes config.yaml, metrics.jsonl, TensorBoard logs, safetensors checkpoints, loss.png and results.json "
        "to run.out_dir. For several processes: torchrun --nproc_per_node N -m incontext.cli train CONFIG.",
    )
    trainer.add_argument("config", type=Path, help="YAML file, e.g. configs/regression-small.yaml")
    trainer.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                         help="override a config value (repeatable), e.g. --set optimizer.lr=3e-4 --set run.batch_size=32")
    trainer.add_argument("--out", type=Path, default=None, help="run folder (overrides run.out_dir)")
    trainer.add_argument("--resume", action="store_true",
                         help="continue from the run folder's latest checkpoint (bit-identical to an uninterrupted run)")
    trainer.add_argument("--no-progress", action="store_true", help="no progress bar")
    trainer.set_defaults(func=cmd_train)

    evaluator = sub.add_parser("eval", help="evaluate a checkpoint on its run's held-out set",
                               description="Rebuild the model and task from a checkpoint's saved config and re-run "
                               "the evaluation that training logged (same held-out sequences).")
    evaluator.add_argument("checkpoint", type=Path, help="a checkpoint folder, or a run folder (uses its latest)")
    evaluator.add_argument("--device", default="cpu", help="cpu or cuda")
    evaluator.add_argument("--full", action="store_true", help="also print list-valued metrics (per position/example)")
    evaluator.set_defaults(func=cmd_eval)

    run = sub.add_parser("run", help="run a registered experiment (see `incontext list`)")
    run.add_argument("experiment", help="experiment name")
    add_common(run)
    run.set_defaults(func=cmd_run)

    lister = sub.add_parser("list", help="list tasks and experiments")
    lister.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as error:
        print(f"incontext: error: {error.args[0] if isinstance(error, KeyError) else error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        from .train import NonFiniteLossError

        if not isinstance(error, NonFiniteLossError):
            raise
        print(f"incontext: error: {error}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
