"""The `incontext` command line.

    incontext demo                      # the main job: in-context linear regression vs least squares
    incontext run EXPERIMENT [--set k=v]  # any registered experiment
    incontext list                      # tasks and experiments
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
    mean = results["mean_mse"]
    print(
        "mean squared error over all context lengths: "
        + ", ".join(f"{name} {value:.3f}" for name, value in mean.items())
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    _run_experiment(args.experiment, args.set, args.out)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from .experiments import list_experiments
    from .tasks import get_task, list_tasks

    print("tasks:")
    for name in list_tasks():
        print(f"  {name:24s} {get_task(name).config}")
    print("experiments:")
    for experiment in list_experiments():
        print(f"  {experiment.name:24s} {experiment.description}")
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
    except (ValueError, KeyError, FileNotFoundError) as error:
        print(f"incontext: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
