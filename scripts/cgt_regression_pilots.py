"""Why does a y frozen after k examples lose most of the CGT's regression accuracy (CGT Figure 4)? Pilots through
the experiment's own code (incontext.experiments.cgt_regression: `train_models`, `evaluate`): input width d_in,
training length, the auxiliary loss (its weight 1 - eta, its horizon) and where the frozen y is read.

    PYTHONPATH=src python scripts/cgt_regression_pilots.py [--out results/cgt-regression-pilots] [--only NAME ...] [--table-only]

Every pilot starts from the setting of results/cgt-regression (d_in 4, 24 points, 3,000 steps, eta 0.5, 4 cuts,
no horizon) and changes what its row says. Each trained CGT is evaluated with the three read-outs of y (y_token:
at the k-th y token, as the experiment; x_token: at the k-th x token; mean: over the k y tokens). The baseline
Transformer is not trained (results/cgt-regression has it). Writes
pilots.jsonl (one line per pilot and read-out), table.md and curves.png; checkpoints go to runs/cgt-pilots/.

"y worth j examples": the number of examples after which the dynamic model's error falls to the frozen model's
error on its first prediction (linear interpolation between example counts; the frozen model has then seen
k examples through y and none in its context).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from incontext.experiments.cgt_regression import READOUTS, RegressionConfig, evaluate, train_models

SETTING = {"d_in": 4, "n_points": 24, "steps": 3000, "freeze_after": [5, 10, 20]}  # results/cgt-regression
PILOTS = {  # name -> changes to SETTING (auxiliary-loss pilots mostly at the short length, to save CPU)
    "d_in 2, 1000 steps": {"d_in": 2, "steps": 1000},
    "d_in 2, 3000 steps": {"d_in": 2},
    "d_in 2, 8000 steps": {"d_in": 2, "steps": 8000},
    "d_in 4, 1000 steps": {"steps": 1000},
    "d_in 4, 3000 steps": {},
    "d_in 4, 1000 steps, aux weight 0.8 (eta 0.2)": {"steps": 1000, "eta": 0.2},
    "d_in 4, 1000 steps, aux horizon 2": {"steps": 1000, "aux_horizon": 2},
    "d_in 4, 3000 steps, aux weight 0.8 (eta 0.2)": {"eta": 0.2},
}
RUNS = Path("runs/cgt-pilots")


def worth(dynamic: list[float], error: float) -> float:
    """Examples the dynamic model needs to reach `error` (interpolated; its curve index is examples seen)."""
    if error >= dynamic[0]:
        return 0.0
    for j in range(1, len(dynamic)):
        if dynamic[j] <= error:
            return j - 1 + (dynamic[j - 1] - error) / (dynamic[j - 1] - dynamic[j])
    return float(len(dynamic) - 1)  # never reached


def summarise(curves: dict, probe: dict, ks: list[int]) -> dict:
    dynamic = curves["cgt dynamic"]
    return {str(k): {"dynamic": dynamic[k], "frozen": curves[f"cgt frozen after {k}"][k], "r2": probe[str(k)],
                     "frozen_end": curves[f"cgt frozen after {k}"][-1], "dynamic_end": dynamic[-1],
                     "y_worth_examples": worth(dynamic, curves[f"cgt frozen after {k}"][k])} for k in ks}


def run_pilots(names: list[str], out: Path) -> list[dict]:
    torch.set_num_threads(2)
    records = []
    for name in names:
        config = RegressionConfig(**{**SETTING, **PILOTS[name]})
        start, wall = time.process_time(), time.perf_counter()
        slug = name.replace(",", "").replace(" ", "-").replace("(", "").replace(")", "")
        _, cgt, task = train_models(config, RUNS / slug, baseline=False)  # no baseline Transformer: CPU for the grid
        train_cpu, train_wall = time.process_time() - start, time.perf_counter() - wall
        for readout in READOUTS:
            results = evaluate(None, cgt, task, dataclasses.replace(config, readout=readout))
            records.append({"pilot": name, "changes": PILOTS[name], "readout": readout, "config": dataclasses.asdict(dataclasses.replace(config, readout=readout)),
                            "train_cpu_seconds": round(train_cpu, 1), "train_wall_seconds": round(train_wall, 1), "mse_by_examples": results["mse_by_examples"],
                            "y_probe_r2": results["y_probe_r2"],
                            "summary": summarise(results["mse_by_examples"], results["y_probe_r2"], config.freeze_after)})
        print(f"{name}: {train_wall:.0f} s ({train_cpu:.0f} s CPU); " + ", ".join(
            f"k={k}: dyn {s['dynamic']:.2f} frozen {s['frozen']:.2f} R2 {s['r2']:.2f}" for k, s in records[-3]["summary"].items()), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "pilots.jsonl", "a") as f:
            for record in records[-len(READOUTS):]:
                f.write(json.dumps(record) + "\n")
    return records


def table(records: list[dict]) -> str:
    ks = records[0]["config"]["freeze_after"]
    head = " / ".join(f"k={k}" for k in ks)
    lines = [f"Frozen y vs dynamic CGT on linear regression ({records[0]['config']['n_points']} points, noise "
             f"{records[0]['config']['noise']}, {records[0]['config']['eval_sequences']} sequences): MSE against U x + b on the "
             "first prediction after k examples (dynamic: the same position with the examples in context), the probe R^2 "
             "of (U, b) from the frozen y, the share of the no-example error the frozen y removes, and how many examples "
             "the frozen y is worth (meaningful only where the dynamic model learns in context). CPU s: training, process "
             "CPU time (2 threads).", "",
             f"| pilot | y read at | probe R^2 ({head}) | 1 - frozen / no-example MSE ({head}) | dynamic MSE ({head}) | frozen-y MSE ({head}) | y worth examples ({head}) | frozen MSE at the end ({head}) | CPU s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        s = r["summary"]
        zero = r["mse_by_examples"]["cgt dynamic"][0]  # the error with no example: the variance of U x + b
        explained = " / ".join(f"{1 - s[str(k)]['frozen'] / zero:.2f}" for k in ks)

        def col(key, fmt):
            return " / ".join(format(s[str(k)][key], fmt) for k in ks)

        lines.append(f"| {r['pilot']} | {r['readout']} | {col('r2', '.2f')} | {explained} | {col('dynamic', '.2f')} | {col('frozen', '.2f')} | "
                     f"{col('y_worth_examples', '.1f')} | {col('frozen_end', '.2f')} | {r['train_cpu_seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(records: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in records if r["readout"] == "y_token"]
    cols = 3
    rows = -(-len(shown) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), sharey=True, squeeze=False)
    for ax, r in zip(axes.flat, shown):
        curves = r["mse_by_examples"]
        for name, curve in curves.items():
            xs = [k for k, v in enumerate(curve) if v is not None]
            style = {"cgt dynamic": dict(color="black", lw=2), "ridge": dict(color="gray", ls="--"),
                     "baseline": dict(color="gray", ls=":")}.get(name, dict(lw=1.2))
            ax.plot(xs, [curve[k] for k in xs], label=name.replace("cgt ", ""), **style)
        r2 = ", ".join(f"{v:.2f}" for v in r["y_probe_r2"].values())
        ax.set(yscale="log", title=f"{r['pilot']}\nprobe R^2 {r2}", xlabel="examples seen k")
        ax.title.set_fontsize(8)
    for ax in axes.flat[len(shown):]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel("MSE vs U x + b")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="results/cgt-regression-pilots")
    parser.add_argument("--only", nargs="*", choices=list(PILOTS), help="pilots to run, added to pilots.jsonl (default: all, replacing it)")
    parser.add_argument("--table-only", action="store_true", help="rewrite table.md and curves.png from pilots.jsonl")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.table_only:
        if (out / "pilots.jsonl").exists() and not args.only:
            (out / "pilots.jsonl").unlink()  # a full run replaces the earlier one
        run_pilots(args.only or list(PILOTS), out)
    records = [json.loads(line) for line in (out / "pilots.jsonl").read_text().splitlines()]
    records.sort(key=lambda r: (list(PILOTS).index(r["pilot"]), READOUTS.index(r["readout"])))
    (out / "table.md").write_text(table(records))
    plot(records, out / "curves.png")


if __name__ == "__main__":
    main()
