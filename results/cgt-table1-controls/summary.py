"""The controlled runs of results/cgt-table1-controls/run.sh beside their reference (results/cgt-table1's
cgt_aux_reg-seed0): one row per run, the linear-fit error and R^2 of a and b, specialised accuracy, variation; writes
table.md and controls.json here.

    python results/cgt-table1-controls/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUNS = [("reference: cgt-table1 (1,500 steps, d_x 64, d_y 32, 512 sequences)", ROOT / "cgt-table1" / "cgt_aux_reg-seed0"),
        ("training: 3,000 steps", HERE / "steps3000" / "cgt_aux_reg-seed0"),
        ("scale: the paper's width of y (d_y 64)", HERE / "y-width64" / "cgt_aux_reg-seed0"),
        ("probe: the 3,000-step model, 4,096 sequences", HERE / "steps3000-probe4096" / "cgt_aux_reg-seed0")]
PAPER = "paper (6 layers, d_x 112, d_y 64, 400,000 steps): CGT + aux + reg 0.04"


def main() -> None:
    rows = []
    for label, folder in RUNS:
        record = folder / "record.json"
        if not record.is_file():
            rows.append({"run": label, "missing": str(record.relative_to(ROOT.parent))})
            continue
        r = json.loads(record.read_text())
        m = r["metrics"]
        rows.append({"run": label, "eval_sequences": r["eval_sequences"], "steps": r["settings"]["run"].get("steps")
                     , **{k: m[k] for k in (
                         "linear_fit_mean_abs_error", "linear_fit_r2_a", "linear_fit_r2_b", "specialized_char_accuracy",
                         "base_char_accuracy", "variation")}})
    lines = ["| run (CGT + aux + reg, seed 0) | linear-fit error (z units) | R^2 of a | R^2 of b | specialised char. acc. "
             "| base char. acc. | variation |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        if "missing" in row:
            lines.append(f"| {row['run']} | not run ({row['missing']} missing) | | | | | |")
            continue
        lines.append(f"| {row['run']} | {row['linear_fit_mean_abs_error']:.2f} | {row['linear_fit_r2_a']:.2f} | "
                     f"{row['linear_fit_r2_b']:.2f} | {100 * row['specialized_char_accuracy']:.1f}% | "
                     f"{100 * row['base_char_accuracy']:.1f}% | {row['variation']:.2f} |")
    lines += ["", f"One seed each, one factor changed from the reference; {PAPER}."]
    (HERE / "table.md").write_text("\n".join(lines) + "\n")
    (HERE / "controls.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
