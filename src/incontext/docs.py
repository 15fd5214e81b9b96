"""Result tables in the documentation, kept equal to the result files they copy.

A page embeds a result file between two markers:

    <!-- result: results/demo/table.md -->
    ...the file's text, written by this module...
    <!-- /result -->

`<!-- result: FILE table=N -->` embeds only the N-th markdown table of FILE (1-based; a table is a run of lines
starting with `|`). Paths are relative to the repository root. `python -m incontext.docs` rewrites every block
of README.md and docs/**/*.md from its file; `python -m incontext.docs --check` (and tests/docs/test_docs.py)
fails when a block differs from its file or names a file that is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BLOCK = re.compile(r"<!-- result: (?P<path>\S+)(?: table=(?P<table>\d+))? -->\n(?P<body>.*?)<!-- /result -->", re.S)


def repo_root() -> Path:
    """The repository holding this source tree (src/incontext/docs.py), else the working directory."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "README.md").is_file() and (here / "docs").is_dir() else Path.cwd()


def doc_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def tables(text: str) -> list[str]:
    """The markdown tables of `text`, in order (each a run of lines starting with `|`)."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append("\n".join(current))
            current = []
    if current:
        found.append("\n".join(current))
    return found


def embedded(root: Path, path: str, table: str | None) -> str:
    """What a block naming `path` (and `table`) holds; FileNotFoundError / ValueError when there is none."""
    file = root / path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no such result file")
    text = file.read_text().strip()
    if table is None:
        return text
    found = tables(text)
    if not 1 <= int(table) <= len(found):
        raise ValueError(f"{path} has {len(found)} tables; the marker asks for table {table}")
    return found[int(table) - 1]


def synced(root: Path, text: str) -> str:
    """`text` with every result block rewritten from its file."""
    def rewrite(m: re.Match) -> str:
        table = f" table={m['table']}" if m["table"] else ""
        return f"<!-- result: {m['path']}{table} -->\n{embedded(root, m['path'], m['table'])}\n<!-- /result -->"

    return BLOCK.sub(rewrite, text)


def blocks(root: Path) -> list[tuple[Path, str, str | None, str]]:
    """(page, result file, table number or None, the block's text) for every block of every page."""
    return [(page, m["path"], m["table"], m["body"].strip()) for page in doc_pages(root)
            for m in BLOCK.finditer(page.read_text())]


def stale(root: Path) -> list[str]:
    """One line per block that differs from its file or names a missing file (empty when all agree)."""
    problems = []
    for page, path, table, body in blocks(root):
        where = f"{page.relative_to(root)}: block {path}" + (f" table={table}" if table else "")
        try:
            if body != embedded(root, path, table):
                problems.append(f"{where} differs from the file (run python -m incontext.docs)")
        except (OSError, ValueError) as error:
            problems.append(f"{where}: {error}")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = repo_root()
    if argv == ["--check"]:
        problems = stale(root)
        print("\n".join(problems) or f"{len(blocks(root))} result blocks agree with their files")
        return 1 if problems else 0
    if argv:
        print("usage: python -m incontext.docs [--check]", file=sys.stderr)
        return 2
    for page in doc_pages(root):
        text = page.read_text()
        new = synced(root, text)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
