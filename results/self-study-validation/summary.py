"""Issue 62's validation sweep as one table: right answers (exact match) of each variant on each block of validation
episodes of run.sh and run2.sh, its total against keep-prompt's on the same episodes, and its median absorb time.

    python results/self-study-validation/summary.py      # writes summary.md and summary.json beside it
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (column, folder): 4 validation episodes each; --seed 0 is run.sh's episodes (with the -tail and -gemma rows of run2.sh)
BLOCKS = [("facts 0-3", ["facts", "facts-gemma"]), ("facts 4-7", ["facts-seed4"]),
          ("documents 0-3", ["documents", "documents-tail", "documents-gemma"]), ("documents 4-7", ["documents-seed4"])]
LABELS = {"kv-prefix": "the default then: recall windows and two continuations"}


def rows() -> list[dict]:
    found: dict[str, dict] = {}  # label -> {column: (right, queries, absorb ms)}
    for column, folders in BLOCKS:
        for folder in folders:
            path = HERE / folder / "results.json"
            if not path.is_file():
                continue
            run = json.loads(path.read_text())
            for row in run["rows"]:
                if row["status"] != "ok" or row["method"] == "drop-prompt":
                    continue
                entry = found.setdefault(row["method"], {"options": row["options"], "writer": "writer" in run["command"]})
                entry.setdefault(column, (round(row["score"]["mean"] * run["queries"]), run["queries"], row["absorb_ms"]))
    keep = found.get("keep-prompt", {})
    out = []
    for label, entry in found.items():
        cells = {c: entry[c] for c, _ in BLOCKS if c in entry}
        right, asked = sum(r for r, _, _ in cells.values()), sum(n for _, n, _ in cells.values())
        keep_right = sum(keep[c][0] for c in cells if c in keep)
        out.append({"variant": label, "options": entry["options"], "blocks": {c: v[0] for c, v in cells.items()},
                    "right": right, "questions": asked, "keep_prompt_right": keep_right,
                    "of_keep_prompt": right / keep_right if keep_right else None,
                    "absorb_s_median": statistics.median(v[2] for v in cells.values()) / 1000})
    return out


def main() -> None:
    table = rows()
    (HERE / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
    columns = [c for c, _ in BLOCKS]
    lines = ["| variant | " + " | ".join(f"{c} (of 28)" for c in columns) + " | all | % of keep-prompt's | absorb s |",
             "|---" * (len(columns) + 4) + "|"]
    for row in table:
        name = row["variant"] + (f" ({LABELS[row['variant']]})" if row["variant"] in LABELS else "")
        cells = [str(row["blocks"].get(c, "")) for c in columns]
        share = "" if row["of_keep_prompt"] is None or row["variant"] == "keep-prompt" else f"{100 * row['of_keep_prompt']:.0f}"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {row['right']} of {row['questions']} | {share} | "
                     f"{row['absorb_s_median']:.1f} |")
    (HERE / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
