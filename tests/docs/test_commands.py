"""Each embedded table's result file holds the command its run script states: the scripts under results/ are run dry
(`incontext` and `python` replaced by shell functions that only print their arguments: nothing runs, nothing is
written), and every results.json (or curve row) the docs embed whose folder a script writes (`--out`) must record the
command the script gives for that folder, read back through the CLI's own parser (cli.compare_spec, cli.demo_spec)
and printed in the one canonical form (harness.job.command_line)."""

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

import docsync as docs
from incontext.absorb.study import StudyOptions
from incontext.cli.commands import build_parser, compare_spec, demo_spec
from incontext.harness.job import command_line

ROOT = docs.repo_root()
# each run script and the arguments its header states (press-curve/test.sh runs run.sh itself, with its test settings)
SCRIPTS = {"results/self-study-test/run.sh": [[]], "results/press-curve/run.sh": [["presses"], ["trained"]],
           "results/press-curve/test.sh": [[]], "results/self-study-validation/run.sh": [[]],
           "results/second-test-run/run.sh": [[]], "results/demo-after-move/run.sh": [[]],
           "results/field-benchmarks/run.sh": [["references"], ["wording"]], "results/field-benchmarks/test.sh": [[]],
           "results/absorber-choice/run.sh": [[], ["steps"], ["kvzap"], ["keep-start"]]}
SHIMS = ('incontext() { "$INCONTEXT_PY" -c \'import json, sys; print(json.dumps(sys.argv[1:]))\' "$@"; }; '
         'python() { :; }; export -f incontext python; ')


def dry_run(script: str, args: list[str]) -> list[list[str]]:
    """The `incontext` command lines the script runs with these arguments (its other commands do nothing)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPLIT", "SEED", "RATIOS", "STARTS", "TRAINED_EPISODES",
                                                             "LONG_EPISODES", "CHOSEN_START", "MODELS", "EPISODES",
                                                             "PRESSES", "LENGTH", "LENGTHS", "RULER_EPISODES",
                                                             "HOTPOT_EPISODES", "KIND", "TASK", "METHODS", "CHOSEN", "CHOSEN_SETS",
                                                             "RATIO", "EXTRA_METHODS", "EXTRA_SETS")}
    env["INCONTEXT_PY"] = sys.executable
    out = subprocess.run(["bash", "--noprofile", "--norc", "-c", SHIMS + f'source "$0" "$@"', script, *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("[")]


STUDY = "|".join(f.name for f in dataclasses.fields(StudyOptions))


def respelled(command: str) -> str:
    """A command recorded before study options had one spelling (`--set kv-prefix.wording_ensemble=True`, read then
    as `kv-prefix.study.wording_ensemble`) in today's (`--set kv-prefix.study.wording_ensemble=True`)."""
    return re.sub(rf"(--set [A-Za-z0-9:_-]+)\.({STUDY})=", r"\1.study.\2=", command)


def canonical(argv: list[str]) -> tuple[str, str | None]:
    """(command_line of the spec, --out) of an `incontext compare` / `incontext demo` command's arguments."""
    args = build_parser().parse_args(argv)
    spec = demo_spec(args) if args.command == "demo" else compare_spec(args)
    return command_line(spec), args.out


def stated() -> dict[str, list[str]]:
    """--out folder -> the canonical commands the run scripts give for it."""
    out: dict[str, list[str]] = {}
    for script, variants in SCRIPTS.items():
        for args in variants:
            for argv in dry_run(script, args):
                if argv[0] in ("compare", "demo"):
                    line, folder = canonical(argv)
                    out.setdefault(os.path.normpath(folder), []).append(line)
    return out


def embedded() -> list[str]:
    """Every result file a doc page or the README embeds."""
    found = set()
    for page in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        found.update(re.findall(r"<!-- result: (\S+)", page.read_text()))
    return sorted(f for f in found if (ROOT / f).is_file())


@pytest.fixture(scope="module")
def commands():
    return stated()


def test_the_dry_run_runs_nothing_and_finds_the_scripts_commands(commands):
    assert {"results/self-study-test/facts", "results/self-study-test/documents", "results/demo", "results/demo-facts",
            "runs/press-curve-validation/facts-0.25", "runs/press-curve-test/trained-documents-0.1"} <= set(commands)
    assert not (ROOT / "runs/press-curve-validation/facts-0.05/results.json.dry").exists()


def test_each_embedded_tables_result_file_has_the_command_its_run_script_states(commands):
    checked = 0
    for table in embedded():
        folder = os.path.dirname(table)
        record = ROOT / folder / "results.json"
        if record.is_file():  # a compare's folder
            runs = [(folder, json.loads(record.read_text()).get("command"))]
        elif table.endswith(".md") and (ROOT / table.replace(".md", ".json")).is_file():  # a summary of several runs
            rows = json.loads((ROOT / table.replace(".md", ".json")).read_text())
            runs = [(None, r["command"]) for r in rows if isinstance(r, dict) and r.get("command")] \
                if isinstance(rows, list) else []
        else:
            continue
        for where, command in runs:
            if command is None or not command.startswith("incontext compare"):
                continue
            line, _ = canonical(shlex.split(command)[1:])
            assert line == command, f"{table}: its recorded command does not read back as itself"
            if where is not None and where not in commands:
                continue  # no run script writes this folder: the page states its command in prose
            lines = commands[where] if where is not None else [c for cs in commands.values() for c in cs]
            assert respelled(command) in lines, f"{table}: {command!r} is not what its run script runs"
            checked += 1
    assert checked >= 5  # the self-study test tables, the demo, the press curves' rows
