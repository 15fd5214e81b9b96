"""Result tables in the documentation, kept equal to the result files they copy (a tool of the repository, not of
the installed package: it reads README.md, docs/ and results/).

A page embeds a result file between two markers:

    <!-- result: results/demo/table.md -->
    ...the file's text, written by this module...
    <!-- /result -->

`<!-- result: FILE table=N -->` embeds only the N-th markdown table of FILE (1-based; a table is a run of lines
starting with `|`). Paths are relative to the repository root.

A page may also hold a table generated from several result files (GENERATED: the README's systems table and its
table of budgets), between `<!-- generated: NAME -->` and `<!-- /generated -->`; the numbers in it are read from
the files each time, so the front page carries no number typed by hand. `python tools/docsync.py` rewrites every block
of README.md and docs/**/*.md from its file; `python tools/docsync.py --check` (and tests/docs/test_docs.py)
fails when a block differs from its file or names a file that is missing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BLOCK = re.compile(r"<!-- result: (?P<path>\S+)(?: table=(?P<table>\d+))? -->\n(?P<body>.*?)<!-- /result -->", re.S)
GENERATED_BLOCK = re.compile(r"<!-- generated: (?P<name>\S+) -->\n(?P<body>.*?)<!-- /generated -->", re.S)


def repo_root() -> Path:
    """The repository holding this tool (tools/docsync.py), else the working directory."""
    here = Path(__file__).resolve().parents[1]
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

    def regenerate(m: re.Match) -> str:
        return f"<!-- generated: {m['name']} -->\n{generated(root, m['name'])}\n<!-- /generated -->"

    return GENERATED_BLOCK.sub(regenerate, BLOCK.sub(rewrite, text))


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
                problems.append(f"{where} differs from the file (run python tools/docsync.py)")
        except (OSError, ValueError) as error:
            problems.append(f"{where}: {error}")
    for page in doc_pages(root):
        for m in GENERATED_BLOCK.finditer(page.read_text()):
            where = f"{page.relative_to(root)}: generated table {m['name']}"
            try:
                if m["body"].strip() != generated(root, m["name"]):
                    problems.append(f"{where} differs from its result files (run python tools/docsync.py)")
            except (OSError, ValueError, KeyError, StopIteration) as error:
                problems.append(f"{where}: {type(error).__name__}: {error}")
    return problems


# ------------------------------------------------------------------------------------------- generated tables


def _json(root: Path, path: str):
    import json

    return json.loads((root / path).read_text())


def _row(root: Path, folder: str, method: str) -> dict:
    return next(r for r in _json(root, f"results/{folder}/results.json")["rows"] if r["method"] == method)


def _pct(root: Path, folder: str, method: str) -> float:
    return 100 * _row(root, folder, method)["score"]["mean"]


def _bytes(root: Path, folder: str, method: str) -> float:
    return 100 * _row(root, folder, method)["kept_bytes"] / _row(root, folder, "keep-prompt")["kept_bytes"]


def _secs(root: Path, folder: str, method: str) -> float:
    return _row(root, folder, method)["absorb_ms"] / 1000


def _field(root: Path, model: str, budget: float, task: str = "squad", method: str = "kv-press:kvzip") -> dict:
    return next(p for p in _json(root, "results/field-benchmarks/field-test.json")
                if p["model"] == model and p["task"] == task and p["method"] == method and p["budget"] == budget)


def systems_table(root: Path) -> str:
    """The README's table: each method and system, what it does, one number read from its result file, its page."""
    demo = "demo"  # the main job: SQuAD paragraphs of the test articles, SmolLM2, the document alone, the defaults
    pct = lambda m: _pct(root, demo, m)  # noqa: E731
    tint = _json(root, "results/tint-perplexity/results.json")
    ppl = {k: v[tint["config"]["fractions"].index(0.5)] for k, v in tint["perplexity"].items()}
    cgt = _json(root, "results/cgt-table1/results.json")["summary"]
    bursty = _json(root, "results/residual-bursty/results.json")["first_crossing"]["0.95/ic"]
    amicl = _json(root, "results/amicl/results.json")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    kvzip = {(m, b): round(100 * _field(root, m, b)["share_of_keep_prompt"]) for m in ("smollm2", "qwen05")
             for b in (0.25, 0.1)}
    field, methods = "[field benchmarks](docs/results/field-benchmarks.md)", "[absorb methods](docs/absorb-methods.md)"
    rows = [
        ("`keep-prompt`", "keeps it in the context as a K/V cache (the reference)",
         f"F1 {pct('keep-prompt'):.1f} on SQuAD test paragraphs, SmolLM2, the document alone (demo)", field),
        ("`drop-prompt`", "removes it (the floor)", f"F1 {pct('drop-prompt'):.1f} (demo)", field),
        ("`distill-lora`", "context distillation into a LoRA adapter (a PEFT folder)",
         f"F1 {pct('distill-lora'):.1f} at {_bytes(root, demo, 'distill-lora'):.0f}% of the paragraph's K/V bytes (demo)",
         methods),
        ("`kv-prefix`", "self-study into a trained K/V prefix (Cartridges), started from KVzip's kept pairs (a PEFT "
         "CARTRIDGE folder from the document's start, init=document)",
         f"F1 {pct('kv-prefix'):.1f} at {_bytes(root, demo, 'kv-prefix'):.0f}% of the bytes, "
         f"{_secs(root, demo, 'kv-prefix'):.1f} s to absorb on 2 CPU cores (demo)", methods),
        ("`kv-press`", "a KV-cache press of NVIDIA kvpress keeps a share of its K/V, no training (the practical peer)",
         f"KVzip: F1 {pct('kv-press'):.1f} at {_bytes(root, demo, 'kv-press'):.0f}% of the K/V in "
         f"{_secs(root, demo, 'kv-press'):.1f} s (demo); of keep-prompt's SQuAD F1 it keeps "
         f"{kvzip['smollm2', 0.25]}% / {kvzip['qwen05', 0.25]}% at a quarter of the K/V (SmolLM2 / Qwen), "
         f"{kvzip['smollm2', 0.1]}% / {kvzip['qwen05', 0.1]}% at a tenth", field),
        ("`dynamic-eval`", "gradient steps on the prompt",
         f"F1 {pct('dynamic-eval'):.1f} (demo); perplexity {ppl['dynamic eval']:.2f} vs {ppl['vanilla']:.2f} without "
         "(Shakespeare, half the document as context)", "[TinT](docs/results/tint.md)"),
        ("`iclca` (ICLCA)", "converts it exactly into bias terms of linear attention",
         f"relative logits error {_json(root, 'results/iclca-table1/results.json')['rows'][0]['mean_rel_error']:.1e} "
         "(float32)", "[ICLCA](docs/results/iclca.md)"),
        ("`iclca-approx` (ICLCA)", "converts it approximately into FAVOR+ or learned feature sums (softmax attention)",
         f"F1 {pct('iclca-approx'):.1f} (demo, FAVOR+)", "[ICLCA](docs/results/iclca.md)"),
        ("`tint` (TinT)", "a simulator transformer fine-tunes an inner model on it in one forward pass",
         f"perplexity {ppl['TinT']:.2f} (dynamic eval {ppl['dynamic eval']:.2f}, none {ppl['vanilla']:.2f})",
         "[TinT](docs/results/tint.md)"),
        ("`cgt-fold` (CGT)", "encodes it into a vector y whose low-rank weight updates fold into plain weights",
         f"specialised accuracy {100 * cgt['cgt_aux']['specialized_char_accuracy'][0]:.1f}% with the auxiliary loss, "
         f"{100 * cgt['cgt']['specialized_char_accuracy'][0]:.1f}% without (Table 1)", "[CGT](docs/results/cgt.md)"),
        ("residual attention streams", "Q/K/V residual streams between layers",
         f"V stream reaches in-context accuracy 0.95 in {mean(bursty['v']):.0f} steps vs {mean(bursty['none']):.0f} "
         "(classic; bursty task)", "[residual streams](docs/results/residual-streams.md)"),
        ("AMICL", "an associative-memory model of ICL",
         f"accuracy {amicl['a_sweep']['dot'][amicl['config']['a_values'].index(1.25)]:.3f} at a = 1.25",
         "[residual streams](docs/results/residual-streams.md#amicl-associative-memory-icl-incontext-run-amicl)"),
    ]
    lines = ["| method / system | what it does with the context | one number (ours) | page |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows])


def budget_table(root: Path) -> str:
    """Which method keeps most of keep-prompt's score at each kept share of the document's K/V, as measured on the
    test splits: SQuAD (results/field-benchmarks, presses) and the invented facts and everyday documents
    (results/press-curve, presses and trained methods)."""
    field = _json(root, "results/field-benchmarks/field-test.json")
    curve = _json(root, "results/press-curve/curve-test.json")
    settings = [("SQuAD, SmolLM2", [p for p in field if p["model"] == "smollm2" and p["task"] == "squad"]),
                ("SQuAD, Qwen2.5-0.5B", [p for p in field if p["model"] == "qwen05" and p["task"] == "squad"]),
                ("facts, SmolLM2", [p for p in curve if p["task"] == "facts"]),
                ("documents, SmolLM2", [p for p in curve if p["task"] == "documents"])]
    budgets = (0.5, 0.25, 0.1, 0.05)
    lines = ["| kept share of the K/V | " + " | ".join(name for name, _ in settings) + " |",
             "|---|" + "---|" * len(settings)]
    for budget in budgets:
        cells = []
        for _, points in settings:
            here = [p for p in points if p["budget"] == budget and p.get("share_of_keep_prompt") is not None
                    and p["method"].startswith(("kv-", "distill"))]
            if not here:
                cells.append("not measured")
                continue
            widest = {}  # each method's point with the most episodes (a press is in both of press-curve's groups)
            for p in here:
                if p["episodes"] > widest.get(p["method"], {"episodes": 0})["episodes"]:
                    widest[p["method"]] = p
            best = max(widest.values(), key=lambda p: p["share_of_keep_prompt"])
            name = best["method"].replace("kv-press:kvzap", "KVzap (trained scorer)").replace("kv-press:", "").replace(
                "kvzip", "KVzip").replace("kv-prefix:reconstruction", "kv-prefix (press start + reconstruction)").replace(
                "kv-prefix:press", "kv-prefix (press start)").replace("kv-prefix:default", "kv-prefix (its defaults)")
            cells.append(f"{name} {100 * best['share_of_keep_prompt']:.0f}% ({best['episodes']} ep.)")
        lines.append(f"| {100 * budget:g}% | " + " | ".join(cells) + " |")
    floors = []
    for _, points in settings:
        drops = [p for p in points if p["method"].startswith("drop-prompt") and p.get("share_of_keep_prompt") is not None]
        floors.append(f"{100 * max(drops, key=lambda p: p['episodes'])['share_of_keep_prompt']:.0f}%" if drops else "")
    lines.append("| 0% (drop-prompt: the floor) | " + " | ".join(floors) + " |")
    return "\n".join(lines)


def _papers() -> dict:
    """One generated table per paper (docs/results/papers.md): experiments.status's per-experiment statuses."""
    from incontext.experiments.status import PAPERS, papers_table

    return {f"papers-{p}": (lambda root, p=p: papers_table(p)) for p in PAPERS}


GENERATED = {"systems": systems_table, "budgets": budget_table, **_papers()}


def generated(root: Path, name: str) -> str:
    if name not in GENERATED:
        raise KeyError(f"unknown generated table {name!r}; tables: {', '.join(GENERATED)}")
    return GENERATED[name](root)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = repo_root()
    if argv == ["--check"]:
        problems = stale(root)
        print("\n".join(problems) or f"{len(blocks(root))} result blocks agree with their files")
        return 1 if problems else 0
    if argv:
        print("usage: python tools/docsync.py [--check]", file=sys.stderr)
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
