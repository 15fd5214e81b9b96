"""Help answers fast (no torch import) from a static catalog that must match the registries (experiments, absorb
methods, episode tasks, metrics), and every registered name is in the help."""

import dataclasses
import json
import subprocess
import sys

import pytest

from incontext.cli.commands import main
from incontext.cli.catalog import EXPERIMENTS, build_catalog, catalog


def test_the_catalog_matches_the_registries():
    """Regenerate with `python -m incontext.cli.catalog` when this fails."""
    assert build_catalog() == catalog()


def test_every_registered_name_is_in_the_help(capsys):
    from incontext.absorb import absorb_methods
    from incontext.absorb.protocol import METHODS
    from incontext.experiments import list_experiments
    from incontext.tasks.episodes import SOURCES

    compare = help_text(capsys, ["compare", "--help"])
    absorb = help_text(capsys, ["absorb", "--help"])
    assert main(["absorb", "--list"]) == 0
    listed = capsys.readouterr().out
    for name in absorb_methods():
        method = METHODS.get(name)
        assert method.summary, f"{name} has no summary"
        for text in (compare, absorb, listed):
            assert f"  {name}" in text and f"needs {method.needs}" in text, name
        assert f"{method.summary}" in " ".join(compare.split()) and method.summary in listed
    flat = " ".join(compare.split())
    for name in SOURCES.names():
        assert f"  {name}" in compare and SOURCES.get(name).description in flat, name
        for field in dataclasses.fields(SOURCES.get(name).config_class):  # every task option, with its default
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            text = json.dumps(default) if not isinstance(default, str) else default
            assert f"{field.name}={text}" in flat, (name, field.name)
    run = help_text(capsys, ["run", "--help"])
    for experiment in list_experiments():
        assert f"  {experiment.name}" in run and experiment.description in run


def help_text(capsys, args):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


def test_run_help_lists_every_experiment(capsys):
    text = help_text(capsys, ["run", "--help"])
    for name, (description, _) in EXPERIMENTS.items():
        assert f"  {name}" in text and description in text


def test_run_help_gives_each_experiment_its_paper_status(capsys):
    """The catalog of experiments shows what each reproduces and its status (experiments/status.py), the papers'
    experiments without one as not run, and an experiment's own help its scale and the cause."""
    from incontext.experiments.status import STATUS, UNREGISTERED

    text = help_text(capsys, ["run", "--help"])
    assert set(STATUS) == set(EXPERIMENTS)  # every registered experiment has a status, and only those
    for name, entry in STATUS.items():
        assert f"{entry.paper}: {entry.reproduces} [{entry.status}]" in text, name
    for entry in UNREGISTERED:
        assert f"{entry.paper}: {entry.reproduces}" in text.split("not run (")[1], entry.name
    one = help_text(capsys, ["run", "cgt-table1", "--help"])
    assert f"scale: {STATUS['cgt-table1'].scale}" in one and f"status: {STATUS['cgt-table1'].status}: " in one


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_experiment_help_lists_every_key_with_its_default(capsys, name):
    text = help_text(capsys, ["run", name, "--help"])
    lines = text.splitlines()
    for key, kind, default, comment in EXPERIMENTS[name][1]:
        line = next(line for line in lines if line.split()[:1] == [key])
        assert kind in line and f"= {default}" in line and comment in line


def test_help_imports_no_torch():
    script = ("import sys\nfrom incontext.cli import main\n"
              "for args in (['--help'], ['run', '--help'], ['run', 'regression-demo', '--help'], ['train', '--help']):\n"
              "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
              "sys.stderr.write('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stderr.endswith("no torch"), result.stderr[-2000:]
    # how fast that is: benchmarks/cli_help.py (a benchmark, not a timed assertion)


def test_help_into_a_closed_pipe_ends_quietly():
    """`incontext run --help | head -1`: the reader closes the pipe before the help is written; the command ends with
    the shell's SIGPIPE status (141) and nothing on stderr (no BrokenPipeError traceback)."""
    child = subprocess.Popen([sys.executable, "-m", "incontext.cli", "run", "--help"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    child.stdout.close()  # before the child has imported anything: every write of the help meets a closed pipe
    stderr = child.stderr.read()
    assert child.wait(timeout=60) == 141, stderr
    assert stderr == ""
