"""The start kv-prefix takes on the test split, chosen on validation (runs/press-curve-validation/trained-*): the one
with the most right answers summed over the trained compares (facts and documents at 25% and 10%), ties to the
earlier of press, rerotated, document. Prints its name (run.sh's STARTS)."""

import json
from pathlib import Path

totals = {}
for file in sorted(Path("runs/press-curve-validation").glob("trained-*/results.json")):
    results = json.loads(file.read_text())
    for row in results["rows"]:
        if row["method"].startswith("kv-prefix:") and row["status"] == "ok":
            name = row["method"].split(":", 1)[1]
            totals[name] = totals.get(name, 0) + round(row["score"]["mean"] * results["queries"])
order = ["press", "rerotated", "document"]
best = max(order, key=lambda name: (totals.get(name, -1), -order.index(name)))
Path("results/press-curve/choice.json").write_text(json.dumps({"right_answers_on_validation": totals, "chosen": best},
                                                              indent=1) + "\n")
print(best)
