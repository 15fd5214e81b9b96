"""The runs of scripts/iclca_table2_rope.sh (ICLCA Table 2 with RoPE, 5 seeds) in one table with
the success rate (at least 95% with the prompt) and the paper's row; writes runs.md and runs.json here.

    python scripts/iclca_table2_rope_summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "results" / "iclca-table2-rope"
TARGET = 0.95


def main() -> None:
    rows = []
    for folder in sorted(HERE.glob("seed*/results.json")):
        r = json.loads(folder.read_text())
        a, c = r["accuracy"], r["config"]
        rows.append({"seed": c["seed"], "with": a["with prompt"], "without": a["without prompt"], "converted": a["converted"],
                     "validation": r["learning_curve"][-1]["accuracy"], "relative_logits_error": r["relative_logits_error_converted"],
                     "layers": c["n_layer"], "positions": c["positions"], "steps": c["steps"]})
    hits = sum(row["with"] >= TARGET for row in rows)
    lines = [f"ICLCA Table 2 with RoPE and {rows[0]['layers'] if rows else 2} layers (width 128, Taylor features, "
             f"{rows[0]['steps'] if rows else 8000} steps at lr 3e-3): accuracy at the scored trigger positions of 1000 "
             "test sequences per seed. Target: at least 95% with the prompt (paper: 99.95%, 12 layers).", "",
             "| seed | with prompt | without prompt | converted (ICLCA) | validation accuracy at the end | "
             "conversion's relative logits error | target reached |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['seed']} | {100 * row['with']:.2f}% | {100 * row['without']:.2f}% | "
                     f"{100 * row['converted']:.2f}% | {100 * row['validation']:.1f}% | {row['relative_logits_error']:.1e} | "
                     f"{'**yes**' if row['with'] >= TARGET else 'no'} |")
    lines += ["| paper (12 layers, RoPE) | 99.95% | 2.23% | 99.95% | | | |", "",
              f"Target reached in {hits} of {len(rows)} runs (the default recipe, 2 layers with learned positions: 1 of 4)."]
    HERE.mkdir(parents=True, exist_ok=True)
    (HERE / "runs.md").write_text("\n".join(lines) + "\n")
    (HERE / "runs.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
