"""Pilots for `incontext run iclca-table2`: train with the experiment's own settings (Table2Config plus --set
overrides) and record the VALIDATION learning curve only (the trainer's held-out sequences, accuracy at every
committed trigger), never the test episodes the experiment scores; one JSON line per pilot appended to
results/iclca-table2/pilots.jsonl.

    PYTHONPATH=src python scripts/iclca_table2_pilots.py NAME [k=v ...]     # e.g. base-s1 seed=1 steps=3000
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

from incontext.config import apply_overrides
from incontext.train.fresh import train_fresh
from incontext.experiments.iclca_table2 import Table2Config, learning_curve, train_settings


def main(name: str, overrides: list[str]) -> None:
    config = apply_overrides(Table2Config(), overrides)
    out = Path("runs/iclca-table2-pilots") / name
    start = time.time()
    train_fresh(out, train_settings(config))
    curve = learning_curve(out / "train")
    record = {"name": name, "overrides": overrides, "config": dataclasses.asdict(config),
              "seconds": round(time.time() - start), "validation_curve": [[r["step"], round(r["accuracy"], 4)] for r in curve],
              "validation_last": round(curve[-1]["accuracy"], 4) if curve else None,
              "first_step_over_50": next((r["step"] for r in curve if r["accuracy"] > 0.5), None)}
    path = Path("results/iclca-table2/pilots.jsonl")
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "config"}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
