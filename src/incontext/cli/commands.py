"""The `incontext` command line.

    incontext demo                                   # the main job: absorb methods compared on SmolLM2 + SQuAD
    incontext compare --model M --task T [--methods a,b]  # the absorb harness: every method, one table
    incontext absorb --model M --method X --prompt-file F --out DIR   # absorb one prompt, save the adapted model
    incontext generate --model M [--adapted DIR] [--chat] TEXT        # stream a continuation (from an absorb folder)
    incontext generate --model M [--adapted DIR] --prompts-file F     # one answer a line, one model load
    incontext chat --model M [--adapted DIR]         # a conversation (stdin scripts it): /reset, /exit
    incontext export-model --model M --out DIR       # the model as a transformers folder (the peft_adapter's base)
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

def _methods_help(width: int, what: bool = True) -> str:
    """The registered absorb methods, one a line, from the catalog (no torch import)."""
    from .catalog import catalog

    return "\n".join(f"  {name:{width}s} needs {m['needs']}" + (f": {m['summary']}" if what else "")
                     for name, m in catalog()["methods"].items())


def _tasks_help() -> str:
    """The registered episode tasks with their metric and the models they are for, from the catalog."""
    from .catalog import catalog

    data = catalog()
    return "\n".join(f"  {name:18s} {t['description']} [{data['metrics'][t['metric']]['label']}]; {t['models']}"
                     + (f"; options: {', '.join(t['options'])}" if t.get("options") else "")
                     for name, t in data["tasks"].items())


def _run_experiment(name: str, overrides: list[str], out: Path | None) -> dict:
    from ..config import apply_overrides
    from ..experiments import get_experiment
    from ..outputs import output_folder

    experiment = get_experiment(name)
    config = apply_overrides(experiment.config_class(), overrides)
    out_dir = out or DEFAULT_OUT / name
    with output_folder(out_dir, name):  # refuses a foreign non-empty or unwritable folder before anything is written
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


# The main job: every method that applies to a softmax LM, at its own defaults, on the document alone (the task gives
# no training question) and the test split. No method option is set here: the defaults are the settings chosen on
# validation episodes for the document alone (docs/absorb-methods.md).
# The task is SQuAD v2.0 dev: 5 paragraphs of the test articles, 3 answerable questions each (F1 and EM as SQuAD's
# script scores them); the invented-facts demo it replaced is results/demo-facts (docs/results/facts-demo.md).
DEMO = {"model": "smollm2", "task": "squad", "episodes": 5, "split": "test", "task_options": {},
        "methods": ["keep-prompt", "drop-prompt", "iclca-approx", "dynamic-eval", "distill-lora", "kv-prefix", "kv-press"]}
DEMO_MODELS = {"smollm2": "SmolLM2-135M-Instruct (about 10 minutes on 2 CPU cores)",
               "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct (about an hour on 2 CPU cores; minutes on a GPU)"}


def _compare(spec, out: Path, runtime, owner: str = "compare") -> dict:
    from ..outputs import output_folder
    from .compare import run_compare

    with output_folder(out, owner):  # a foreign or unwritable folder is refused before the model loads
        results = run_compare(spec, out, owner=owner, runtime=runtime)
    print((out / "table.md").read_text())
    print(f"results: {out / 'results.json'}\nplot:    {out / 'compare.png'}")
    return results


def _runtime(args: argparse.Namespace):
    """--device / --dtype checked once, before any file is written or model loaded (runtime.resolve_runtime): the
    command's one Runtime, passed down to whatever loads the model or needs the device or dtype."""
    from ..runtime import resolve_runtime

    return resolve_runtime(args.device, args.dtype)


def demo_spec(args: argparse.Namespace):
    """The CompareSpec `incontext demo` runs (DEMO with the command's --device, --dtype, --tf32, --writer)."""
    from .compare import CompareSpec

    return CompareSpec(**{**DEMO, "model": args.model}, device=args.device, dtype=args.dtype, tf32=args.tf32,
                       writer=args.writer)


def cmd_demo(args: argparse.Namespace) -> int:
    runtime = _runtime(args)
    spec = demo_spec(args)
    print(f"demo: absorbing SQuAD paragraphs of the test articles into {DEMO_MODELS.get(args.model, args.model)} with "
          "every method that applies, at their defaults, from the document alone; SQuAD's F1 and EM of the greedy answers")
    default = "demo" if args.model == DEMO["model"] else f"demo-{Path(args.model).name}"
    _compare(spec, args.out or DEFAULT_OUT / default, runtime, owner="demo")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    spec = compare_spec(args)
    runtime = _runtime(args)
    _compare(spec, args.out or DEFAULT_OUT / f"compare-{Path(args.model).name}-{args.task}", runtime)
    return 0


def compare_spec(args: argparse.Namespace):
    """The CompareSpec of an `incontext compare` command line (its results.json records harness.job.command_line of
    it: tests/docs/test_commands.py reads both back to check a result file against its run script)."""
    from ..config import parse_overrides
    from .compare import CompareSpec, parse_tune, split_settings

    task_options, method_options = split_settings(parse_overrides(args.set))
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else []
    if args.episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    if args.validation_episodes < 1:
        raise ValueError(f"--validation-episodes must be >= 1, got {args.validation_episodes}")
    return CompareSpec(model=args.model, task=args.task, methods=methods, episodes=args.episodes, seed=args.seed,
                       split=args.split, task_options=task_options, method_options=method_options,
                       tune=parse_tune(args.tune), validation_episodes=args.validation_episodes, device=args.device,
                       dtype=args.dtype, tf32=args.tf32, writer=args.writer, ratio=args.ratio)


def _print_options(options: list[list[str]]) -> None:
    """A method's options, one a line: name=default and its help."""
    if not options:
        print("      (no options)")
    width = max((len(f"{n}={d}") if d != "" else len(n) for n, d, _ in options), default=0)
    for name, default, text in options:
        shown = f"{name}={default}" if default != "" else name
        print(f"      {shown:{min(width, 34)}s}  {text}".rstrip())


def cmd_absorb(args: argparse.Namespace) -> int:
    if args.list:
        missing = [flag for flag, value in (("--model", args.model), ("--method", args.method), ("--out", args.out),
                                            ("--prompt", args.prompt), ("--prompt-file", args.prompt_file),
                                            ("--prompts", args.prompts), ("--set", args.set))
                   if value]
        if missing:
            raise ValueError(f"--list takes no other options (got {', '.join(missing)})")
        from .catalog import catalog

        data = catalog()  # the catalog: listing needs no torch
        print("absorb methods (incontext absorb --method NAME; method options with --set OPTION=VALUE):")
        for name, m in data["methods"].items():
            print(f"\n  {name} needs {m['needs']}: {m['summary']}")
            _print_options(m["options"])
        for group, g in data["option_groups"].items():
            print(f"\n  {group}.*: the options {', '.join(g['methods'])} share (--set {group}.OPTION=VALUE)")
            _print_options(g["options"])
            for name, own in g.get("defaults", {}).items():
                print(f"      {name}'s own defaults: {' '.join(f'{k}={v}' for k, v in own.items())}")
        return 0
    missing = [flag for flag, value in (("--model", args.model), ("--method", args.method), ("--out", args.out)) if not value]
    if missing:
        raise ValueError(f"absorb needs {', '.join(missing)} (or --list)")
    runtime = _runtime(args)
    from .absorb import absorb

    return absorb(args, runtime)


def cmd_generate(args: argparse.Namespace) -> int:
    if args.prompts_file is None and args.jsonl:
        raise ValueError("--jsonl goes with --prompts-file")
    if args.prompts_file is not None:
        if args.text is not None:
            raise ValueError("give the text with exactly one of TEXT and --prompts-file")
        runtime = _runtime(args)
        from .chat import generate_many

        return generate_many(args, runtime)
    from .generate import generate

    runtime = _runtime(args)
    return generate(args, runtime)


def cmd_export_model(args: argparse.Namespace) -> int:
    runtime = _runtime(args)
    from .absorb import export_model

    return export_model(args, runtime)


def cmd_chat(args: argparse.Namespace) -> int:
    runtime = _runtime(args)
    from .chat import chat

    return chat(args, runtime)


def cmd_run(args: argparse.Namespace) -> int:
    _runtime(args)
    overrides = list(args.set)
    from ..experiments import get_experiment

    fields = {f.name for f in dataclasses.fields(get_experiment(args.experiment).config_class)}
    for flag, key, default in (("--device", "device", "cpu"), ("--dtype", "dtype", "float32")):
        value = getattr(args, key)
        if value == default:
            continue
        if key in fields:
            overrides.append(f"{key}={value}")
        else:
            raise ValueError(f"{flag} {value}: experiment {args.experiment} has no {key} setting "
                             f"(it runs on the CPU in float32)")
    _run_experiment(args.experiment, overrides, args.out)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from ..train import load_config, train
    from ..train.config import replace_run

    extra = []
    if args.device is not None:  # the same flags as the other commands, mapped onto the run section
        runtime = _runtime(argparse.Namespace(device=args.device, dtype=args.dtype or "float32"))
        if runtime.device.index is not None:
            raise ValueError(f"--device {args.device}: train takes cpu or cuda (torchrun gives each process its GPU)")
        extra.append(f"run.device={runtime.device.type}")
    if args.dtype is not None:
        autocast = {"float32": "none", "bfloat16": "bf16"}.get(args.dtype)
        if autocast is None:
            raise ValueError(f"--dtype {args.dtype}: train keeps float32 weights and takes float32 or bfloat16 "
                             "(bf16 autocast)")
        extra.append(f"run.autocast={autocast}")
    config = load_config(args.config, list(args.set) + extra)
    if args.out is not None:
        config = replace_run(config, out_dir=str(args.out))
    if args.force and not args.resume:
        raise ValueError("--force only applies with --resume")
    try:
        results = train(config, resume=args.resume, progress=not args.no_progress, force=args.force)
    except (ValueError, FileExistsError) as error:  # the library names the problem; the command line, its flags
        message = str(error)
        for said, flag in (("resume with force", "pass --force"), ("resume it, or choose another run folder",
                                                                     "pass --resume, or choose another --out")):
            message = message.replace(said, flag)
        if message == str(error):
            raise
        raise type(error)(message) from None
    if int(os.environ.get("RANK", "0")) == 0:
        run_dir = Path(config.run.out_dir)
        if results.get("already_finished"):
            print(f"{run_dir} already finished at step {results['steps']} (schedule.total_steps): nothing added; "
                  "raise schedule.total_steps to train further")
        print(f"final evaluation: {json.dumps(_scalars(results['eval']))}")
        written = [name for name in ("metrics.jsonl", "checkpoints/", "loss.png", "results.json", "tensorboard/")
                   if (run_dir / name).exists()]
        print(f"run folder: {run_dir} ({', '.join(written)})")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from ..train import evaluate_checkpoint, resolve_checkpoint
    from ..train.checkpoint import read_state

    runtime = _runtime(args)
    checkpoint = resolve_checkpoint(args.checkpoint)
    metrics = evaluate_checkpoint(checkpoint, device=str(runtime.device), dtype=runtime.dtype)
    step = read_state(checkpoint)["step"]
    print(f"checkpoint {checkpoint} (step {step})")
    print(json.dumps(metrics if args.full else _scalars(metrics), indent=2))
    return 0


def _scalars(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}


def cmd_list(args: argparse.Namespace) -> int:
    from ..config import choices
    from ..experiments import list_experiments
    from ..tasks import get_task, list_tasks
    from ..train.config import MODEL_KINDS

    print("tasks:")
    for name in list_tasks():
        print(f"  {name:24s} {get_task(name).config}")
    print("models:")
    for name, kind in MODEL_KINDS.items():
        options = "; ".join(f"{k} {'|'.join(v)}" for k, v in choices(kind.config_class).items())
        print(f"  {name:24s} {kind.config_class.__name__} options: {options}")
    print("experiments:")
    for experiment in list_experiments():
        print(f"  {experiment.name:24s} {experiment.description}")
    configs = sorted(Path("configs").glob("*.yaml"))
    print("configs:" + ("" if configs else " (none in ./configs)"))
    for path in configs:
        first = next((line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")), "")
        print(f"  {str(path):32s} {first}")
    return 0


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line (argparse prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _RunHelp(argparse.Action):
    """`incontext run --help` lists the experiments; `incontext run EXPERIMENT --help` lists its config keys.
    Both read the static catalog, so help answers without importing torch."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .catalog import catalog

        experiments, status = catalog()["experiments"], catalog()["paper_status"]
        name = getattr(namespace, "experiment", None)
        if name is None:
            parser.print_help()
            print("\nexperiments (under each: the paper's table or figure it reproduces, and its status at our scale):")
            for key, (description, _) in experiments.items():
                print(f"  {key:22s} {description}")
                if key in status["registered"]:
                    entry = status["registered"][key]
                    print(f"  {'':22s}   {entry['paper']}: {entry['reproduces']} [{entry['status']}]")
            pending = status["pending"]
            if pending:
                print(f"\nnot run ({len(pending)} experiments of the papers without a registered experiment; reasons in "
                      "docs/results/papers.md):")
                for entry in pending:
                    print(f"  {entry['paper']}: {entry['reproduces']}")
            print("\n`incontext run EXPERIMENT --help` lists an experiment's config keys, its scale against the paper's "
                  "and its status with the cause.")
        elif name not in experiments:
            parser.error(f"unknown experiment {name!r}; registered: {', '.join(experiments)}")
        else:
            description, fields = experiments[name]
            print(f"usage: {parser.prog} {name} [--set KEY=VALUE ...] [--out OUT]\n\n{name}: {description}\n")
            entry = status["registered"].get(name)
            if entry:
                print(f"reproduces ({entry['paper']}): {entry['reproduces']}\nscale: {entry['scale']}\n"
                      f"status: {entry['status']}: {entry['cause']}\n")
            print(f"config keys (--set KEY=VALUE; output folder default {DEFAULT_OUT / name}):")
            width = max(len(key) for key, *_ in fields)
            for key, kind, default, comment in fields:
                print(f"  {key:{width}s}  {kind:12s} = {default:12s} {comment}".rstrip())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="incontext",
        description="In-context learning and context-to-weights methods (CGT, ICLCA, TinT, residual attention "
        "streams): train, convert, compare and reproduce.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add_runtime(p: argparse.ArgumentParser, tf32: bool = False) -> None:
        p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"],
                       help="the model's weights and compute dtype (default float32)")
        if tf32:
            p.add_argument("--writer", default="", metavar="MODEL",
                           help="distill-lora and kv-prefix: another local model that writes the data stage's questions "
                                "and messages (study.n_questions, study.n_conversations); default the model itself")
            p.add_argument("--tf32", action="store_true", help="on a CUDA device, the trained methods' float32 matmuls in TF32 "
                           "(faster; rounds their inputs)")

    def add_sampling(p: argparse.ArgumentParser, max_new_tokens: int, length_help: str) -> None:
        """generate's and chat's decoding options."""
        p.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=length_help)
        p.add_argument("--sample", action="store_true", help="sample instead of the greedy argmax")
        p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 1.0)")
        p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens only")
        p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")

    def add_common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field (repeatable), e.g. --set steps=500 --set seed=1")
        p.add_argument("--out", type=path_arg, default=None, help="output folder (default: runs/<experiment>)")

    demo = sub.add_parser(
        "demo",
        help="main job: compare the absorb methods on SQuAD paragraphs with SmolLM2 (about 10 minutes on 2 CPU cores)",
        description="Absorb SQuAD v2.0 dev paragraphs of the test articles (5 paragraphs, 3 questions each) into a shipped "
        "model with keep-prompt, drop-prompt, approximate ICLCA, dynamic evaluation, context distillation into a LoRA, "
        "a trained K/V prefix and KVzip (kv-press), each at its defaults and from the document alone (the paragraph as "
        "the chat template's system turn; no method sees a question), and print SQuAD's F1 and exact match of the greedy "
        "answers with 95% intervals, agreement with the prompted model and costs; writes results.json, table.md and "
        "compare.png. The invented-facts demo it replaced: docs/results/facts-demo.md.",
    )
    demo.add_argument("--model", default=DEMO["model"], help="smollm2 (default), qwen2.5-coder-0.5b, or any model "
                      "compare takes")
    demo.add_argument("--out", type=path_arg, default=None, help="output folder (default: runs/demo, runs/demo-MODEL for "
                      "another model)")
    add_runtime(demo, tf32=True)
    demo.set_defaults(func=cmd_demo)

    comparer = sub.add_parser(
        "compare",
        help="the absorb harness: every method on one model and task, one table",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Absorb each episode's prompt with every method, answer its queries without the prompt, and "
        "report the task score (95% interval over episodes), agreement with the prompted model (top-1, KL, "
        "relative logits error) and costs (absorb ms, ms per query, bytes kept, peak memory).\n\n"
        "tasks [the score]:\n" + _tasks_help() +
        "\n\nmethods (n/a where they do not apply to the model):\n" + _methods_help(18),
    )
    comparer.add_argument("--model", required=True, help="smollm2, qwen2.5-coder-0.5b, gemma3-270m, a run folder/checkpoint of ours, or a local HF model folder")
    comparer.add_argument("--task", required=True, help="one of the tasks listed above")
    comparer.add_argument("--methods", default="", help="comma-separated methods (default: all; keep-prompt and drop-prompt always run)")
    comparer.add_argument("--episodes", type=int, default=20, help="test episodes (default 20)")
    comparer.add_argument("--split", default="test", metavar="test|validation|dev",
                          help="the episodes compared: test (a fresh range, run once per change), validation (where "
                          "settings are chosen; --tune always uses it) or dev (the old seed-0 test episodes, reused "
                          "too often to be a test set) (default test)")
    comparer.add_argument("--seed", type=int, default=0, help="the split's episodes from this seed on (default 0)")
    comparer.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                          help="task option (e.g. --set people=4) or method option (e.g. --set dynamic-eval.learning_rate=1e-4)")
    comparer.add_argument("--tune", action="append", default=[], metavar="METHOD.OPTION=V1,V2",
                          help="choose a method option on validation episodes, e.g. --tune dynamic-eval.learning_rate=1e-5,1e-4")
    comparer.add_argument("--validation-episodes", type=int, default=8, help="episodes for --tune (default 8)")
    comparer.add_argument("--ratio", type=float, default=None, metavar="R",
                          help="the kept share of each document's K/V for every method with a budget (kv-press, "
                          "kv-prefix: their ratio option; an explicit --set wins), e.g. --ratio 0.1")
    comparer.add_argument("--out", type=path_arg, default=None, help="output folder (default: runs/compare-MODEL-TASK)")
    add_runtime(comparer, tf32=True)
    comparer.set_defaults(func=cmd_compare)

    absorber = sub.add_parser(
        "absorb",
        help="absorb one prompt into a model with one method and save the adapted model",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tokenize the prompt with the model's tokenizer, absorb it with METHOD and write the adapted "
        "model to --out (adapted.safetensors + adapted.json; for distill-lora only its PEFT adapter in "
        "peft_adapter/, a few MB, when the base exports to Llama or GPT-2; for kv-prefix on a Hugging Face model also "
        "the prefix as a PEFT CARTRIDGE adapter in peft_adapter/) and absorb.json (method, options, model, prompt "
        "sha256 and tokens, absorb seconds, files). Then: incontext generate --model MODEL --adapted DIR TEXT.\n\n"
        "methods (`incontext absorb --list` adds what each does and its options):\n" + _methods_help(14, what=False),
    )
    absorber.add_argument("--list", action="store_true", help="list the methods and what each needs, then exit")
    absorber.add_argument("--model", help="smollm2, qwen2.5-coder-0.5b, gemma3-270m, a run folder/checkpoint of ours, or a local HF model folder")
    absorber.add_argument("--method", help="an absorb method (see --list)")
    absorber.add_argument("--prompt", default=None, help="the prompt text")
    absorber.add_argument("--prompt-file", type=path_arg, default=None, help="a UTF-8 file holding the prompt")
    absorber.add_argument("--prompts", type=path_arg, default=None,
                          help="a folder of prompt files (*.txt): one adapted model each, in --out/<name>/; "
                          "torchrun --nproc_per_node N -m incontext.cli absorb ... shards them over N processes")
    absorber.add_argument("--train-queries", type=path_arg, default=None, metavar="FILE",
                          help="questions distill-lora or kv-prefix may train on (never the ones you will ask): one "
                          "a line, asked as 'Q: LINE\\nA:' (a line without closing punctuation, the start of a "
                          "statement the document completes, is read as it is); wordings of one question on "
                          "consecutive lines, a blank line between questions; --set study.wording_ensemble=true teaches "
                          "each question's wordings one target")
    absorber.add_argument("--placement", default="auto", choices=["auto", "system", "raw"],
                          help="where the document goes for a chat model: system (as its chat template places a "
                          "document: a system turn, or the first user turn where the template has none; generate --chat "
                          "then continues that conversation), raw (the text as it is, before the template's own "
                          "system prompt), auto (system where the tokenizer has a chat template; default)")
    absorber.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                          help="a method option (repeatable), e.g. --set steps=32 --set learning_rate=1e-3")
    absorber.add_argument("--out", type=path_arg, default=None, help="output folder (new, empty, or an earlier absorb folder)")
    add_runtime(absorber, tf32=True)
    absorber.set_defaults(func=cmd_absorb)

    generator = sub.add_parser(
        "generate",
        help="stream a continuation of TEXT from a model, or from an adapted model written by `incontext absorb`",
        description="Continue TEXT token by token (greedy unless --sample) and print it as it comes. With "
        "--adapted DIR the model is the one `incontext absorb` wrote to DIR (the absorbed prompt is not in the "
        "context; DIR must have been absorbed into --model). --chat wraps TEXT as a user turn in the tokenizer's "
        "chat template and stops at the end of the assistant's turn.",
    )
    generator.add_argument("text", metavar="TEXT", nargs="?", default=None,
                           help="the text to continue (a question, with --chat); or --prompts-file")
    generator.add_argument("--model", required=True, help="smollm2, qwen2.5-coder-0.5b, gemma3-270m, a run folder/checkpoint of ours, or a local HF model folder")
    generator.add_argument("--adapted", type=path_arg, action="append", default=None,
                           help="an absorb folder (incontext absorb --out); repeated: the folders composed (kv-prefix's "
                           "prefixes concatenated, distill-lora's adapters added), documents answered together")
    generator.add_argument("--chat", action="store_true", help="TEXT is a user turn of the chat template")
    generator.add_argument("--prompts-file", type=path_arg, default=None, metavar="FILE",
                           help="answer every line of FILE (one prompt a line, \\n for a line break inside one) with "
                           "one model load: one output line per prompt, line breaks written as \\n")
    generator.add_argument("--jsonl", action="store_true",
                           help="with --prompts-file: one JSON record a prompt (line, prompt, output, tokens)")
    add_sampling(generator, 64, "at most this many new tokens (default 64)")
    add_runtime(generator)
    generator.set_defaults(func=cmd_generate)

    exporter = sub.add_parser(
        "export-model",
        help="write a model as a transformers folder (the base for an absorb folder's peft_adapter/)",
        description="Write --model as a Hugging Face transformers folder (model.safetensors, config.json, "
        "generation_config.json, the tokenizer and its chat template) that AutoModelForCausalLM.from_pretrained and "
        "AutoTokenizer.from_pretrained read: the base that an absorb folder's peft_adapter/ (PeftModel.from_pretrained) "
        "goes onto. The shipped smollm2 exports as the Llama model it converts from; gemma3-270m as its own Gemma 3.",
    )
    exporter.add_argument("--model", required=True, help="smollm2, qwen2.5-coder-0.5b, gemma3-270m, a run folder/checkpoint of ours, or a "
                          "local HF model folder")
    exporter.add_argument("--out", type=path_arg, required=True, help="a new or empty folder")
    add_runtime(exporter)
    exporter.set_defaults(func=cmd_export_model)

    chatter = sub.add_parser(
        "chat",
        help="a conversation with a model, or with absorb folders: the model loads once",
        description="Talk to --model (or to the absorb folders of --adapted, composed as generate composes them), "
        "turn after turn: through the tokenizer's chat template where it has one (the conversation so far re-read "
        "each turn; the oldest turns forgotten when the context fills), else in plain 'Q: ...\\nA:' turns whose "
        "answers end at the line's end. Answers stream to stdout. Lines starting with / are commands: /reset "
        "forgets the conversation, /adapted DIR [DIR ...] answers from absorb folders instead, /base from the model "
        "alone, /help lists them, /exit (or end of input) ends. Reads stdin, so it scripts: "
        "printf 'Who is Ada?\\n/exit\\n' | incontext chat --model smollm2 (answers one a line, line breaks "
        "written as \\n). Bad lines get a one-line note on stderr and the session goes on.",
    )
    chatter.add_argument("--model", required=True, help="smollm2, qwen2.5-coder-0.5b, gemma3-270m, a run folder/checkpoint of ours, or a "
                         "local HF model folder")
    chatter.add_argument("--adapted", type=path_arg, action="append", default=None,
                         help="an absorb folder (incontext absorb --out); repeated: the folders composed")
    add_sampling(chatter, 256, "at most this many tokens an answer (default 256)")
    add_runtime(chatter)
    chatter.set_defaults(func=cmd_chat)

    trainer = sub.add_parser(
        "train",
        help="train a model from a YAML config",
        description="Train from a YAML config (sections model, task, optimizer, schedule, run; see configs/). "
        "Writes config.yaml, metrics.jsonl, TensorBoard logs, safetensors checkpoints, loss.png and results.json "
        "to run.out_dir. For several processes: torchrun --nproc_per_node N -m incontext.cli train CONFIG.",
    )
    trainer.add_argument("config", type=path_arg, help="YAML file, e.g. configs/regression-small.yaml")
    trainer.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                         help="override a config value (repeatable), e.g. --set optimizer.lr=3e-4 --set run.batch_size=32")
    trainer.add_argument("--out", type=path_arg, default=None, help="run folder (overrides run.out_dir)")
    trainer.add_argument("--resume", action="store_true",
                         help="continue from the run folder's latest checkpoint (bit-identical to an uninterrupted run)")
    trainer.add_argument("--force", action="store_true",
                         help="with --resume: continue even though model, task, optimizer, batch_size or seed changed")
    trainer.add_argument("--no-progress", action="store_true", help="no progress bar")
    trainer.add_argument("--device", default=None, help="cpu or cuda: sets run.device (default: the config's, auto)")
    trainer.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "float64"],
                         help="float32 (run.autocast=none) or bfloat16 (run.autocast=bf16: float32 weights, bf16 matmuls)")
    trainer.set_defaults(func=cmd_train)

    evaluator = sub.add_parser("eval", help="evaluate a checkpoint on its run's held-out set",
                               description="Rebuild the model and task from a checkpoint's saved config and re-run "
                               "the evaluation that training logged (same held-out sequences).")
    evaluator.add_argument("checkpoint", type=path_arg, help="a checkpoint folder, or a run folder (uses its latest)")
    add_runtime(evaluator)
    evaluator.add_argument("--full", action="store_true", help="also print list-valued metrics (per position/example)")
    evaluator.set_defaults(func=cmd_eval)

    run = sub.add_parser("run", help="run a registered experiment (see `incontext run --help`)", add_help=False)
    run.add_argument("-h", "--help", action=_RunHelp, help="list the experiments, or with EXPERIMENT its config keys")
    run.add_argument("experiment", help="experiment name")
    add_common(run)
    add_runtime(run)
    run.set_defaults(func=cmd_run)

    lister = sub.add_parser("list", help="list tasks and experiments")
    lister.set_defaults(func=cmd_list)
    return parser


def _fail(error: BaseException) -> None:
    message = error.args[0] if isinstance(error, KeyError) and error.args else error
    print("incontext: error: " + " ".join(str(message).split()), file=sys.stderr)  # always one line


def path_arg(value: str) -> Path:
    """A path option's value: an empty one is refused (argparse would read it as the current folder)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (give a folder or file name)")
    return Path(value)


def main(argv: list[str] | None = None) -> int:
    """Exit status 0, or 2 for bad input (config, files, checkpoints), 3 when training diverged; every error is
    one line on stderr. Output into a pipe its reader closed (`incontext run --help | head`) ends quietly with the
    shell's status for SIGPIPE (141), no traceback."""
    try:
        return _main(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 141


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:  # Ctrl-C: one line and the shell's status for SIGINT (130), no traceback
        print("incontext: interrupted", file=sys.stderr)
        return 130
    except (ValueError, KeyError, OSError, FloatingPointError) as error:  # OSError: missing, existing, unreadable or
        _fail(error)  # full files; FloatingPointError: an absorb that diverged (its options)
        return 2
    except RuntimeError as error:
        from ..train import NonFiniteLossError

        if not isinstance(error, NonFiniteLossError):
            raise
        _fail(error)
        return 3


if __name__ == "__main__":
    sys.exit(main())
