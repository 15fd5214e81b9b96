"""The papers' status table (experiments/status.py) covers every registered experiment, names none that does not
exist, uses the three statuses only, and docs/results/papers.md holds exactly what papers_table makes of it."""

import re
from pathlib import Path

import pytest

from incontext.experiments.registry import list_experiments
from incontext.experiments.status import PAPERS, STATUS, STATUSES, UNREGISTERED, papers_table

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results" / "papers.md"
REGISTERED = {experiment.name for experiment in list_experiments()}


def test_every_registered_experiment_has_an_entry():
    assert REGISTERED - set(STATUS) == set(), "add these to experiments/status.py"


def test_no_entry_names_an_experiment_that_does_not_exist():
    assert set(STATUS) - REGISTERED == set()
    assert all(name == entry.name for name, entry in STATUS.items())
    registered_now = [entry.name for entry in UNREGISTERED if entry.name in REGISTERED]
    assert not registered_now, f"registered now: move them from UNREGISTERED to STATUS: {registered_now}"


def test_every_status_is_one_of_the_three_and_every_entry_a_known_paper():
    for entry in [*STATUS.values(), *UNREGISTERED]:
        assert entry.status in STATUSES, entry
        assert entry.paper in PAPERS, entry
        assert entry.cause.strip(), entry
    assert {entry.status for entry in UNREGISTERED} == {"not run"}


def test_every_string_is_one_line_and_every_page_exists():
    for entry in [*STATUS.values(), *UNREGISTERED]:
        for text in (entry.name, entry.reproduces, entry.scale, entry.cause):
            assert "\n" not in text and "|" not in text, entry
        assert not entry.page or (ROOT / entry.page).is_file(), entry


@pytest.mark.parametrize("paper", PAPERS)
def test_the_page_block_of_each_paper_equals_papers_table(paper):
    found = re.findall(rf"<!-- generated: papers-{re.escape(paper)} -->\n(.*?)<!-- /generated -->", PAGE.read_text(), re.S)
    assert len(found) == 1, f"docs/results/papers.md needs one block papers-{paper}"
    assert found[0].strip() == papers_table(paper), f"paste papers_table({paper!r}) into docs/results/papers.md"


def test_papers_table_lists_a_paper_s_registered_rows_first_and_refuses_an_unknown_paper():
    rows = papers_table("tint").splitlines()[2:]
    assert [row.split("|")[1].strip() for row in rows] == [
        "[`tint-table3`](tint.md)", "[`tint-perplexity`](tint.md)", "[`tint-classification`](tint.md)",
        "[`tint-layer-steps`](tint.md)"]
    with pytest.raises(KeyError):
        papers_table("gpt-5")
