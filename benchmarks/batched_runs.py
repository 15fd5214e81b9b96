"""Training throughput of many small runs at once (residual-stream study: 4 variants x 4 seeds of the toy model).

One SGD step of every run (forward, backward, update) on a batch of bursty sequences, three ways:
- batched: our ToyTransformer with a run axis (one bmm per projection for all runs; models/toy_transformer.py);
- vmap: torch.func.vmap over torch.func.functional_call of a one-run model, parameters stacked (the peer: the
  library's generic way to batch runs);
- one at a time: a one-run model per run, stepped in turn (what a loop over seeds and variants does).
Data sampling is excluded (the same pre-drawn batch for all). Prints runs x steps per second and the speed-up.

    python benchmarks/batched_runs.py [--runs 16] [--batch 128] [--repeats 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.func import functional_call, grad, vmap

from absorb_latency import median_ms  # same folder: the scripts share one timer
from incontext.models.toy_transformer import STREAMS, ToyTransformer, ToyTransformerConfig
from incontext.tasks.bursty import BurstyConfig, BurstyTask
from incontext.train.batched import per_run_cross_entropy

RESULTS = Path(__file__).resolve().parent / "results"


def seconds(fn, repeats: int) -> float:
    return median_ms(fn, repeats) / 1000


def sgd_step(model: ToyTransformer, x: torch.Tensor, y: torch.Tensor, lr: float = 0.01) -> None:
    params = list(model.parameters())
    grads = torch.autograd.grad(per_run_cross_entropy(model(x), y).sum(), params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.add_(g, alpha=-lr)


def measure(dim: int, max_pairs: int, runs: int, batch: int, repeats: int) -> dict:
    task = BurstyTask(BurstyConfig(dim=dim, max_pairs=max_pairs))
    sample = task.sample(batch, torch.Generator().manual_seed(0))
    x = sample.inputs[None].expand(runs, -1, -1, -1).contiguous()
    y = sample.targets[:, -1][None].expand(runs, -1).contiguous()
    config = ToyTransformerConfig(d_model=x.shape[-1], init_dim=dim)
    streams = [STREAMS[r % len(STREAMS)] for r in range(runs)]

    batched = ToyTransformer(config, streams)
    t_batched = seconds(lambda: sgd_step(batched, x, y), repeats)

    singles = [ToyTransformer(config, [s]) for s in streams]
    t_loop = seconds(lambda: [sgd_step(m, x[r:r + 1], y[r:r + 1]) for r, m in enumerate(singles)], max(3, repeats // 4))

    # vmap peer: a one-run module, parameters stacked over runs; the stream choice rides along as a buffer
    template = ToyTransformer(config, ["none"])
    stacked = {name: torch.stack([dict(m.named_parameters())[name][0] for m in singles]).unsqueeze(1)
               for name, _ in template.named_parameters()}
    masks = torch.stack([m.stream_mask for m in singles])

    def loss_one(params, mask, xr, yr):
        out = functional_call(template, {**params, "stream_mask": mask}, (xr[None],))
        return per_run_cross_entropy(out, yr[None]).sum()

    step_all = vmap(grad(loss_one), in_dims=(0, 0, 0, 0))

    def vmap_step():
        grads = step_all(stacked, masks, x, y)
        with torch.no_grad():
            for name in stacked:
                stacked[name].sub_(0.01 * grads[name])

    t_vmap = seconds(vmap_step, repeats)
    return {"dim": dim, "d_model": x.shape[-1], "runs": runs, "batch": batch,
            "run_steps_per_s": {"batched": runs / t_batched, "vmap": runs / t_vmap, "one at a time": runs / t_loop}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=16)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(32, 16, args.runs, args.batch, args.repeats), measure(85, 32, args.runs, args.batch, args.repeats)]
    lines = [f"{args.runs} runs (variants x seeds) of the toy transformer, batch {args.batch}, {args.threads} threads, "
             f"torch {torch.__version__}; run-steps per second (higher is better)", "",
             "| scale | width | batched (ours) | vmap (torch.func) | one at a time | batched / one at a time | batched / vmap |",
             "|---|---|---|---|---|---|---|"]
    for row, name in zip(rows, ("reduced (D 32, Nmax 16)", "paper (D 85, Nmax 32)")):
        r = row["run_steps_per_s"]
        lines.append(f"| {name} | {row['d_model']} | {r['batched']:.0f} | {r['vmap']:.0f} | {r['one at a time']:.0f} | "
                     f"{r['batched'] / r['one at a time']:.2f}x | {r['batched'] / r['vmap']:.2f}x |")
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "batched_runs.json").write_text(json.dumps(rows, indent=2))
    (RESULTS / "batched_runs.md").write_text(table)


if __name__ == "__main__":
    main()
