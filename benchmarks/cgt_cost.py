"""Per-query cost of a CGT context: dynamic with the prompt vs folded into the weights, against a baseline.

For prompt lengths M and a query of N tokens, times one forward pass of:
- (i)   the dynamic CGT on [prompt; query] (M + N tokens, y computed per position);
- (ii)  the folded CGT (y frozen at the end of the prompt, an ordinary Transformer of width d_x) on the query alone;
- (iii) the same-size baseline (a GPT-2 of width d_x + d_y, the model CGT splits in two streams) on [prompt; query];
- (iv)  that baseline on the query against a cached K/V of the prompt.
Also the one-time cost of folding a prompt (context pass + fold) and the bytes kept per prompt: nothing for (i)
and (iii) (the prompt is re-read), the rank-r factors of the fold for (ii) (or the folded layers, if stored
whole), the K/V cache for (iv). Prints a markdown table; writes JSON and markdown to benchmarks/results/.

    python benchmarks/cgt_cost.py [--prompt-lengths 64 256 1024 2048] [--query 32] [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from absorb_latency import median_ms  # same folder: the scripts share one timer
from incontext.absorb import KeepPrompt, fold, lora_factors, prompt_context
from incontext.models import CGT, CGTConfig, Transformer, TransformerConfig

RESULTS = Path(__file__).resolve().parent / "results"


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-lengths", type=int, nargs="+", default=[64, 256, 1024, 2048])
    p.add_argument("--query", type=int, default=32, help="query tokens N")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--split-layer", type=int, default=4)
    p.add_argument("--d-x", type=int, default=112)
    p.add_argument("--heads-x", type=int, default=7)
    p.add_argument("--d-y", type=int, default=64)
    p.add_argument("--heads-y", type=int, default=4)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--templates", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None, help="[benchmarks/results/cgt_cost.json]")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / "cgt_cost.json"
    longest = max(args.prompt_lengths) + args.query
    torch.manual_seed(0)
    cgt = CGT(CGTConfig(n_layer=args.layers, split_layer=args.split_layer, d_x=args.d_x, n_head_x=args.heads_x, d_y=args.d_y,
                        n_head_y=args.heads_y, rank=args.rank, n_templates=args.templates, vocab_size=args.vocab,
                        max_seq_len=longest)).eval()
    baseline = Transformer(TransformerConfig(n_layer=args.layers, d_model=args.d_x + args.d_y, n_head=args.heads_x + args.heads_y,
                                             vocab_size=args.vocab, max_seq_len=longest)).eval()
    g = torch.Generator().manual_seed(0)
    query = torch.randint(0, args.vocab, (1, args.query), generator=g)
    rows = []
    with torch.no_grad():
        for m in args.prompt_lengths:
            prompt = torch.randint(0, args.vocab, (1, m), generator=g)
            full = torch.cat([prompt, query], 1)
            fold_ms = median_ms(lambda prompt=prompt: fold(cgt, prompt_context(cgt, prompt)), 3)
            y = prompt_context(cgt, prompt)
            folded = fold(cgt, y)
            factors = lora_factors(cgt, y)
            kept = KeepPrompt().absorb(baseline, prompt)
            modules = dict(folded.named_modules())
            row = {
                "M": m, "N": args.query, "ideal_speedup": (m + args.query) / args.query,
                "cgt_dynamic_ms": median_ms(lambda full=full: cgt(full), args.repeats),
                "cgt_folded_ms": median_ms(lambda folded=folded: folded(query), args.repeats),
                "baseline_prompted_ms": median_ms(lambda full=full: baseline(full), args.repeats),
                "baseline_cached_ms": median_ms(lambda kept=kept: kept(query), args.repeats),
                "fold_once_ms": fold_ms,
                "fold_factor_bytes": tensor_bytes(t for trio in factors.values() for t in trio),
                "folded_layer_bytes": tensor_bytes(t for name in factors for t in (modules[name].weight, modules[name].bias)),
                "baseline_kv_cache_bytes": tensor_bytes(t for layer in kept.prompt_cache().layers for t in layer),
            }
            rows.append(row)
            print(f"M={m}: CGT dynamic {row['cgt_dynamic_ms']:.1f} / folded {row['cgt_folded_ms']:.1f} ms; baseline "
                  f"prompted {row['baseline_prompted_ms']:.1f} / cached {row['baseline_cached_ms']:.1f} ms")
    params = {"cgt": cgt.num_parameters(), "folded": folded.num_parameters(), "baseline": baseline.num_parameters()}
    lines = [
        (f"# Per-query cost, CGT {args.layers} layers (l = {args.split_layer}), d_x {args.d_x}, d_y {args.d_y}, r {args.rank}, "
        f"M {args.templates} ({params['cgt'] / 1e6:.2f}M parameters; folded {params['folded'] / 1e6:.2f}M) vs a GPT-2 of width "
        f"{args.d_x + args.d_y} ({params['baseline'] / 1e6:.2f}M); vocab {args.vocab}, query N = {args.query}, "
        f"{args.threads} CPU thread(s), median of {args.repeats}"),
        "",
        ("| M | (M+N)/N | (i) CGT dynamic, prompt ms | (ii) CGT folded, no prompt ms | (i)/(ii) | (iii) baseline, prompt ms "
        "| (iv) baseline, cached prompt ms | fold once ms | kept per prompt: fold factors / folded layers / baseline K/V cache |"),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['M']} | {r['ideal_speedup']:.1f} | {r['cgt_dynamic_ms']:.2f} | {r['cgt_folded_ms']:.2f} | "
            f"{r['cgt_dynamic_ms'] / r['cgt_folded_ms']:.1f}x | {r['baseline_prompted_ms']:.2f} | {r['baseline_cached_ms']:.2f} | "
            f"{r['fold_once_ms']:.1f} | {r['fold_factor_bytes'] / 1024:.0f} KiB / {r['folded_layer_bytes'] / 1024:.0f} KiB / "
            f"{r['baseline_kv_cache_bytes'] / 1024:.0f} KiB |")
    table = "\n".join(lines) + "\n"
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items() if k != "out"}, "parameters": params,
                               "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(table)


if __name__ == "__main__":
    main()
