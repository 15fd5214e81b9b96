"""What a command writes into its output folder: the folder claim (no command writes over files it did not
create), what an experiment returns (Result) and the one writer of results.json, tables and figures."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fileio import strict_json

# A command's output folder carries this file naming its owner (an experiment, or a command: compare, demo, absorb,
# absorb-many): a later run of the same owner may replace what is in it; any other non-empty folder is refused,
# whatever files it holds, so no command writes over files it did not create.
EXPERIMENT_MARKER = ".incontext-experiment"


def _missing_folders(out_dir: Path) -> list[Path]:
    """out_dir and its ancestors that do not exist yet (deepest first): what creating out_dir makes."""
    missing, path = [], out_dir
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def check_writable(out_dir: Path) -> None:
    """OSError (one line) unless out_dir is, or can be created as, a folder this process can write into."""
    import os

    out_dir = Path(out_dir)
    existing = out_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise NotADirectoryError(f"output folder {out_dir} cannot be created: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PermissionError(f"output folder {out_dir}: {existing} is not writable; choose another folder")


def claim_output_folder(out_dir: Path, owner: str, create: bool = True) -> None:
    """Make out_dir the output folder of `owner` (an experiment, or a command such as compare): it must be new,
    empty, or hold `owner`'s own marker (an earlier output of the same owner); anything else is refused before a
    file is written, whatever files it holds, and so is a folder that cannot be written. create=False only checks."""
    out_dir = Path(out_dir)
    marker = out_dir / EXPERIMENT_MARKER
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"output folder {out_dir} is a file, not a folder")
    if marker.is_file():
        try:
            earlier = json.loads(marker.read_text()).get("experiment")
        except (ValueError, AttributeError, UnicodeDecodeError):
            earlier = None
        if earlier != owner:
            raise FileExistsError(f"output folder {out_dir} holds the output of experiment {earlier!r}, not {owner!r}: "
                                  "choose another folder")
    else:
        entries = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() else []
        if entries:
            raise FileExistsError(f"output folder {out_dir} is not empty: it holds files this command did not write "
                                  f"({', '.join(entries[:3])}{', ...' if len(entries) > 3 else ''}) and no marker of "
                                  f"{owner!r}; choose a new or empty folder (incontext never writes over files it did "
                                  "not create)")
    check_writable(out_dir)
    if create:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not marker.is_file():
            marker.write_text(json.dumps({"experiment": owner}) + "\n")


@contextmanager
def output_folder(out_dir: Path, owner: str):
    """`claim_output_folder` for the duration of a command: if the command then fails, what the claim made (the
    folder, its missing parents, the marker) is removed again when the folder holds nothing else."""
    out_dir = Path(out_dir)
    created = _missing_folders(out_dir)
    marked = not (out_dir / EXPERIMENT_MARKER).exists()
    claim_output_folder(out_dir, owner)
    try:
        yield out_dir
    except BaseException:
        if marked and [p.name for p in out_dir.iterdir()] == [EXPERIMENT_MARKER]:
            (out_dir / EXPERIMENT_MARKER).unlink()
            for folder in created:
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
        raise


@dataclass
class Result:
    """What an experiment produced. `tables` and `figures` map file names to functions of the final results
    (results.json's content, with "experiment" and "config" in front): a table returns markdown, a figure a
    matplotlib Figure (drawn with `pyplot()`)."""

    results: dict[str, Any]
    tables: dict[str, Callable[[dict[str, Any]], str]] = field(default_factory=dict)
    figures: dict[str, Callable[[dict[str, Any]], Any]] = field(default_factory=dict)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def code_version() -> dict[str, Any] | None:
    """The git commit of the source this package runs from and whether its tracked files differ from it (a result's
    provenance: "ran once, at this code"); None outside a git checkout (an installed wheel) or without git."""
    import subprocess

    where = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(changed)}


def save_result(result: Result, out_dir: Path, experiment: str | None = None, config: Any = None) -> dict[str, Any]:
    """The one writer of experiment files: results.json (strict JSON), the tables and the figures (PNG, 120 dpi)
    under out_dir; returns the results as written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = {"experiment": experiment} if experiment else {}
    if config is not None:
        head["config"] = dataclasses.asdict(config)
    results = {**head, **result.results}
    results.setdefault("code", code_version())  # the commit it ran at (dirty or not)
    (out_dir / "results.json").write_text(strict_json(results))
    for name, make in result.tables.items():
        text = make(results)
        (out_dir / name).write_text(text if text.endswith("\n") else text + "\n")
    plt = pyplot() if result.figures else None
    for name, draw in result.figures.items():
        figure = draw(results)
        figure.savefig(out_dir / name, dpi=120)
        plt.close(figure)
    return results


def earlier_results(out_dir: Path, config: Any, free: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """results.json of an earlier run of an experiment in out_dir (None if there is none), to be extended: it must
    have been made with `config`'s settings apart from the `free` ones, else ValueError naming those that differ."""
    path = Path(out_dir) / "results.json"
    if not path.is_file():
        return None
    saved = json.loads(path.read_text())
    mine = {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(config))).items() if k not in free}  # as saved: lists
    theirs = {k: v for k, v in saved.get("config", {}).items() if k not in free}
    differing = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if differing:
        raise ValueError(f"{path} was made with other settings ({', '.join(differing)}); use the same settings or another output folder")
    return saved


def markdown_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """The lines of a markdown table: `header`, its separator, then one line per row (cells as str())."""
    return ["| " + " | ".join(map(str, header)) + " |", "|---" * len(header) + "|",
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]
