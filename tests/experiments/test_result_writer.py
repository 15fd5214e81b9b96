"""The one writer of experiment files, and the registry that finds experiments without a hand-kept list."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import incontext.experiments as experiments_package
from incontext.config import ConfigError, parse_overrides
from incontext.experiments import list_experiments
from incontext.outputs import Result, claim_output_folder, earlier_results, markdown_table, pyplot, save_result


@dataclass
class ToyConfig:
    size: int = 3


def test_save_result_writes_results_tables_and_figures(tmp_path):
    def figure(results):
        fig, ax = pyplot().subplots()
        ax.plot(results["values"])
        return fig

    result = Result({"values": [1.0, float("nan")]}, {"table.md": lambda r: f"| n |\n|---|\n| {len(r['values'])} |"},
                    {"values.png": figure})
    written = save_result(result, tmp_path, "toy", ToyConfig())
    assert list(written) == ["experiment", "config", "values", "code"] and written["config"] == {"size": 3}
    assert json.loads((tmp_path / "results.json").read_text()) == {"experiment": "toy", "config": {"size": 3}, "values": [1.0, None],
                                                                   "code": written["code"]}  # the commit it ran at
    assert (tmp_path / "table.md").read_text() == "| n |\n|---|\n| 2 |\n"
    assert (tmp_path / "values.png").stat().st_size > 0


def test_every_module_that_registers_an_experiment_is_found():
    folder = Path(experiments_package.__file__).parent
    declared = {m for path in folder.glob("*.py") for m in re.findall(r'@register_experiment\(\s*"([^"]+)"', path.read_text())}
    assert declared and {e.name for e in list_experiments()} == declared


def test_the_output_claim_refuses_foreign_folders_and_other_owners(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"not empty: it holds files this command did not write \(notes.txt\) and no marker"):
        claim_output_folder(tmp_path / "mine", "compare", create=False)
    claim_output_folder(tmp_path / "out", "compare", create=False)
    assert not (tmp_path / "out").exists()  # a check writes nothing
    claim_output_folder(tmp_path / "out", "compare")
    claim_output_folder(tmp_path / "out", "compare")  # its own folder again
    with pytest.raises(FileExistsError, match="holds the output of experiment 'compare', not 'amicl'"):
        claim_output_folder(tmp_path / "out", "amicl")


def test_flat_options_keep_dotted_keys_and_their_own_messages():
    assert parse_overrides(["steps=8", "a.b=1e-3"], flat=True) == {"steps": 8, "a.b": 0.001}
    with pytest.raises(ConfigError, match="must look like OPTION=VALUE"):
        parse_overrides(["speed"], flat=True)
    with pytest.raises(ConfigError, match="not a valid YAML scalar"):
        parse_overrides(["x=[1"], flat=True)
    with pytest.raises(ConfigError, match="must look like key=value"):
        parse_overrides(["speed"])


@dataclass
class StudyConfig:
    size: int = 3
    seeds: tuple = (0,)
    threads: int = 1


def test_earlier_results_must_share_the_settings_that_are_not_free(tmp_path):
    assert earlier_results(tmp_path, StudyConfig()) is None  # nothing written yet
    save_result(Result({"runs": [1]}), tmp_path, "toy", StudyConfig(seeds=(0, 1), threads=2))
    saved = earlier_results(tmp_path, StudyConfig(seeds=(2,)), free=("seeds", "threads"))
    assert saved["runs"] == [1] and saved["config"]["seeds"] == [0, 1]
    assert earlier_results(tmp_path, StudyConfig(seeds=(0, 1), threads=2)) == saved  # tuples as saved (lists)
    with pytest.raises(ValueError, match=r"other settings \(seeds, threads\)"):
        earlier_results(tmp_path, StudyConfig())
    with pytest.raises(ValueError, match=r"other settings \(size\)"):
        earlier_results(tmp_path, StudyConfig(size=4), free=("seeds", "threads"))


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1, "x"], [2.5, None]]) == ["| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]
