"""Per-query latency of an absorbed prompt against keeping the prompt in the context.

For prompt lengths M and a query of N tokens, times one forward pass of:
- linear attention: the prompted model on [prompt; query] (M + N tokens) vs the ICLCA-converted model on the
  query alone (N tokens; for linear attention the converted bias IS the cached prompt state);
- softmax attention: the prompted model on M + N tokens, the query against a cached K/V of the prompt, and the
  approximately converted model (FAVOR+, m features) on the query alone.
Times are medians of CPU time per thread (the absorb harness's CostTimer), not wall-clock.
Memory: the bytes each approach keeps per prompt (K/V cache, linear state, feature sums), from tensor sizes.
Prints a markdown table with the speedup next to (M + N) / N; writes JSON and markdown to benchmarks/results/.

    python benchmarks/absorb_latency.py [--prompt-lengths 64 256 1024 4096] [--query 32] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from incontext.absorb import ICLCA, ICLCAApprox, KeepPrompt
from incontext.harness.compare import CostTimer
from incontext.models import Transformer, TransformerConfig

RESULTS = Path(__file__).resolve().parent / "results"


def median_ms(fn, repeats: int, device: torch.device | str = "cpu") -> float:
    """Median cost of `fn` in ms over `repeats` calls after one warm-up, measured as the absorb harness does
    (CostTimer: CPU time per thread, which a shared machine's load distorts far less than wall-clock; CUDA
    events on a GPU)."""
    timer = CostTimer(torch.device(device))
    fn()  # warm-up
    return statistics.median(timer(fn)[1] for _ in range(repeats))


def state_bytes(layers) -> int:
    total = 0
    for layer in layers:
        items = layer if isinstance(layer, tuple) else [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        total += sum(t.numel() * t.element_size() for t in items if t is not None)
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--query", type=int, default=32, help="query tokens N")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--features", type=int, default=256, help="FAVOR+ features for the approximate conversion")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="[benchmarks/results/absorb_latency.json]")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / "absorb_latency.json"
    longest = max(args.prompt_lengths) + args.query
    common = dict(vocab_size=1024, n_layer=args.layers, d_model=args.width, n_head=args.heads, positions="rope",
                  max_seq_len=longest)
    torch.manual_seed(0)
    linear = Transformer(TransformerConfig(attention="linear", feature_map="elu", **common)).eval()
    softmax = Transformer(TransformerConfig(attention="softmax", **common)).eval()
    g = torch.Generator().manual_seed(0)
    query = torch.randint(0, 1024, (1, args.query), generator=g)
    rows = []
    with torch.no_grad():
        for m in args.prompt_lengths:
            prompt = torch.randint(0, 1024, (1, m), generator=g)
            full = torch.cat([prompt, query], 1)
            converted = ICLCA().absorb(linear, prompt)
            kept = KeepPrompt().absorb(softmax, prompt)
            approx = ICLCAApprox(args.features).absorb(softmax, prompt)
            row = {
                "M": m, "N": args.query, "ideal_speedup": (m + args.query) / args.query,
                "linear_prompted_ms": median_ms(lambda: linear(full), args.repeats),
                "linear_converted_ms": median_ms(lambda: converted(query), args.repeats),
                "softmax_prompted_ms": median_ms(lambda: softmax(full), args.repeats),
                "softmax_cached_ms": median_ms(lambda: kept(query), args.repeats),
                "softmax_approx_ms": median_ms(lambda: approx(query), args.repeats),
                "linear_state_bytes": state_bytes(converted.state().layers),
                "softmax_kv_cache_bytes": state_bytes(kept.prompt_cache().layers),
                "softmax_features_bytes": state_bytes(approx.state().layers),
            }
            rows.append(row)
            print(f"M={m}: linear {row['linear_prompted_ms']:.1f} -> {row['linear_converted_ms']:.1f} ms, "
                  f"softmax {row['softmax_prompted_ms']:.1f} / cached {row['softmax_cached_ms']:.1f} / approx {row['softmax_approx_ms']:.1f} ms")
    lines = [
        f"# Per-query latency, {args.layers} layers, width {args.width}, {args.heads} heads, query N = {args.query}, "
        f"{args.threads} CPU threads, median of {args.repeats} (CPU time per thread); FAVOR+ m = {args.features}",
        "",
        "| M | (M+N)/N | linear: prompted ms | linear: ICLCA ms | speedup | softmax: prompted ms | softmax: K/V-cached ms "
        "| softmax: ICLCA-approx ms | speedup vs prompted | state kept per prompt: linear / K/V cache / features |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['M']} | {r['ideal_speedup']:.1f} | {r['linear_prompted_ms']:.2f} | {r['linear_converted_ms']:.2f} | "
            f"{r['linear_prompted_ms'] / r['linear_converted_ms']:.1f}x | {r['softmax_prompted_ms']:.2f} | "
            f"{r['softmax_cached_ms']:.2f} | {r['softmax_approx_ms']:.2f} | "
            f"{r['softmax_prompted_ms'] / r['softmax_approx_ms']:.1f}x | "
            f"{r['linear_state_bytes'] / 1024:.0f} KiB / {r['softmax_kv_cache_bytes'] / 1024:.0f} KiB / "
            f"{r['softmax_features_bytes'] / 1024:.0f} KiB |")
    table = "\n".join(lines) + "\n"
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
