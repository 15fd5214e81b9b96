"""Cost of one simulated TinT step against the plain step it simulates, and where the simulated step's time goes.

Simulated step: `TinT.simulate(ids, n_train)`, one forward of the simulator: the auxiliary model's forward on the
sequence, the simulated backward of the summed LM loss of the first n_train tokens, the SGD update written into the
prefixes, and the second forward that predicts every token with the updated weights. Plain step (what it
simulates, dynamic evaluation's step): `absorb.methods.dynamic_eval.prompt_sgd` (one autograd SGD step of the same top-n
layers on the same loss; it copies the model first) followed by a prediction forward of the updated model. Both
run under the same dtype and threads; the simulator is built once per model, outside the timing (its build time
is a column of its own). With `fast` in TintConfig (this branch) a third column times the linear layers evaluated
as the attention layers they are written as (`fast=False`, the code before the fast path).

The methods run interleaved (their order rotates every repeat); each cell is the median over the repeats of CPU
time per thread (the absorb harness's CostTimer). Peak memory: the most bytes held at once by tensors allocated
during one further call of each (torch.profiler's memory events), not timed; the simulator's prefixes (built
before the step) are a column of their own. The logits gap column is a sanity check, not an exactness measure:
||TinT - plain|| / ||plain|| on the predicted logits (TinT takes a first-order step of a parameter subset, plain
an exact step of all parameters of the same layers), next to the plain update's own size ||plain - before|| /
||plain|| (float64 exactness against R-approx is tested in tests/tint). Then a profile of the simulated step at one width:
exclusive CPU time per simulator module (wrappers around the module instances; "glue" is everything else: slot
writes, saved activations, RoPE, K/V head expansion, the loss) and torch.profiler's top operators.

Inner models: random GPT-2-style Transformers (learned positions, LayerNorm, tanh-GELU, biases, tied head);
TinT layout S = 3 rows per prefix, S' = 3 shards (2 where the width is not a multiple of 3). `--smollm2` adds the
rows for SmolLM2-135M (float32, top 1 and top 2 layers simulated; S = S' = 4, finite-difference eps 1e-2 as in
the harness's SmolLM2 runs) on random token ids; run those once, they are heavier.

    python benchmarks/tint_step.py [--widths 48 64 96] [--layers 4] [--tokens 128] [--repeats 7] [--threads 1] [--smollm2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from incontext.absorb.methods.dynamic_eval import prompt_sgd
from incontext.harness.compare import CostTimer
from incontext.models import Transformer, TransformerConfig
from incontext.tint import TinT, TintConfig

RESULTS = Path(__file__).resolve().parent / "results"
HAS_FAST = "fast" in {f.name for f in dataclasses.fields(TintConfig)}


def plain_step(model, ids, n_train, lr, n_top):
    """Dynamic evaluation's SGD step on the first n_train tokens, then the prediction of every token."""
    targets = torch.zeros_like(ids, dtype=torch.bool)
    targets[1:n_train] = True
    updated, _ = prompt_sgd(model, [ids], [targets], learning_rate=lr, n_top_layers=n_top)
    with torch.no_grad():
        return updated(ids[None])[0]


def simulated_step(sim, ids, n_train):
    with torch.no_grad():
        return sim.simulate(ids, n_train)[0]


def peak_tensor_bytes(fn) -> int:
    """Peak of the bytes held by tensors allocated during fn() (torch.profiler's allocation and free events in
    time order; resident memory does not show it once the allocator reuses freed blocks)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    live = peak = 0
    for e in events:
        live += e.self_cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(model, config: TintConfig, ids, n_train, repeats, label) -> dict:
    """Interleaved medians (ms, CPU time per thread) of the plain step and the simulated step(s)."""
    n_top = config.n_simulation_layers or model.config.n_layer
    timer = CostTimer(torch.device("cpu"))
    start = time.thread_time()
    sim = TinT(model, config)
    build_ms = 1000 * (time.thread_time() - start)
    steps = {"plain": lambda: plain_step(model, ids, n_train, config.learning_rate, n_top),
             "tint": lambda: simulated_step(sim, ids, n_train)}
    if HAS_FAST and config.fast:
        reference = TinT(model, dataclasses.replace(config, fast=False))
        steps["tint_attention"] = lambda: simulated_step(reference, ids, n_train)
    # the two predict alike (TinT's approximate gradient vs exact SGD): a broken setup shows here, not as a fast time
    # (and the update's own size, the gap to the model before it, for scale)
    plain_logits = steps["plain"]()
    gap = float((steps["tint"]() - plain_logits).norm() / plain_logits.norm())
    with torch.no_grad():
        moved = float((model(ids[None])[0] - plain_logits).norm() / plain_logits.norm())
    times = defaultdict(list)
    names = list(steps)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(timer(steps[name])[1])
    row = {"label": label, "d_model": model.config.d_model, "n_layer": model.config.n_layer, "n_top": n_top,
           "tokens": int(ids.shape[0]), "n_train": n_train, "dtype": str(model.tok_emb.weight.dtype).replace("torch.", ""),
           "build_ms": build_ms, "logits_rel_gap_tint_vs_plain": gap, "logits_rel_gap_plain_vs_before": moved,
           "prefix_bytes": sum(t.numel() * t.element_size() for t in sim.initial_prefixes().values())}
    for name in names:
        row[f"{name}_ms"] = statistics.median(times[name])
        row[f"{name}_all_ms"] = times[name]
        row[f"{name}_peak_bytes"] = peak_tensor_bytes(steps[name])
    row["ratio"] = row["tint_ms"] / row["plain_ms"]
    if "tint_attention_ms" in row:
        row["ratio_attention"] = row["tint_attention_ms"] / row["plain_ms"]
    return row


# ------------------------------------------------------------------------------------------- profile


class Timed:
    """Wraps a simulator module instance: adds its exclusive CPU time (nested wrapped calls subtracted)."""

    stack: list[list[float]] = []

    def __init__(self, inner, name, totals):
        self.inner, self.name, self.totals = inner, name, totals

    def __getattr__(self, attr):
        return getattr(self.inner, attr)

    def __call__(self, *args, **kwargs):
        Timed.stack.append([0.0])
        start = time.thread_time()
        try:
            return self.inner(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            inner_spent = Timed.stack.pop()[0]
            self.totals[self.name] += spent - inner_spent
            if Timed.stack:
                Timed.stack[-1][0] += spent


MODULES = {"linear_forward": "Linear Forward", "linear_backward": "Linear Backward", "linear_descent": "Linear Descent",
           "norm_forward": "LayerNorm Forward (group norm)", "norm_backward": "LayerNorm Backward (group norms)",
           "act_forward": "activation Forward", "act_backward": "activation Backward",
           "gate_forward": "GLU Forward", "gate_backward": "GLU Backward",
           "attn_forward": "softmax attention Forward", "attn_backward": "attention value Backward",
           "lm_gradient": "LM-head gradient"}


def profile(model, config, ids, n_train, repeats) -> dict:
    sim = TinT(model, config)
    totals: dict[str, float] = defaultdict(float)
    for attr, name in MODULES.items():
        if hasattr(sim, attr):
            setattr(sim, attr, Timed(getattr(sim, attr), name, totals))
    for owner in ("norm_forward", "norm_backward"):  # their Linear Forward (gamma * x + b): counted as linear
        inner = getattr(sim, owner).inner
        inner.linear = Timed(inner.linear, "Linear Forward", totals)
    simulated_step(sim, ids, n_train)
    totals.clear()
    start = time.thread_time()
    for _ in range(repeats):
        simulated_step(sim, ids, n_train)
    total = time.thread_time() - start
    modules = {name: 1000 * t / repeats for name, t in sorted(totals.items(), key=lambda kv: -kv[1])}
    modules["glue (slot writes, saved activations, RoPE, K/V expansion, loss)"] = 1000 * (total - sum(totals.values())) / repeats
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    plain_sim = TinT(model, config)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            simulated_step(plain_sim, ids, n_train)
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:10]
    return {"total_ms": 1000 * total / repeats, "modules_ms": modules,
            "top_ops": [{"op": e.key, "self_ms": e.self_cpu_time_total / 1000 / repeats, "calls": e.count // repeats}
                        for e in ops]}


# ------------------------------------------------------------------------------------------- main


def random_gpt2(width, layers, heads, vocab, seq_len, dtype) -> Transformer:
    torch.manual_seed(0)
    config = TransformerConfig(n_layer=layers, n_head=heads, d_model=width, vocab_size=vocab, max_seq_len=seq_len,
                               positions="learned", norm="layernorm", mlp="gelu_tanh")
    return Transformer(config).to(dtype).eval()


def table(rows) -> list[str]:
    attention = any("tint_attention_ms" in r for r in rows)
    head = "| model | D | layers (simulated) | T (train) | plain step ms | TinT step ms | ratio |"
    rule = "|---|---|---|---|---|---|---|"
    if attention:
        head += " TinT, attention path ms | ratio |"
        rule += "---|---|"
    head += " TinT build ms | peak MB: plain / TinT | prefixes MB | logits gap TinT-plain (plain-before) |"
    rule += "---|---|---|---|"
    lines = [head, rule]
    for r in rows:
        line = (f"| {r['label']} | {r['d_model']} | {r['n_layer']} ({r['n_top']}) | {r['tokens']} ({r['n_train']}) | "
                f"{r['plain_ms']:.1f} | {r['tint_ms']:.1f} | {r['ratio']:.2f}x |")
        if attention:
            line += (f" {r['tint_attention_ms']:.1f} | {r['ratio_attention']:.2f}x |" if "tint_attention_ms" in r else " - | - |")
        line += (f" {r['build_ms']:.0f} | {r['plain_peak_bytes'] / 2**20:.1f} / {r['tint_peak_bytes'] / 2**20:.1f} | "
                 f"{r['prefix_bytes'] / 2**20:.1f} | {r['logits_rel_gap_tint_vs_plain']:.1e} "
                 f"({r.get('logits_rel_gap_plain_vs_before', float('nan')):.1e}) |")
        lines.append(line)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[48, 64, 96])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=128, help="sequence length T")
    p.add_argument("--train-tokens", type=int, default=None, help="n_train (default T / 2)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile-width", type=int, default=96)
    p.add_argument("--smollm2", action="store_true", help="add SmolLM2-135M rows (top 1 and 2 layers, float32)")
    p.add_argument("--smollm2-repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="[benchmarks/results/tint_step.json]")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / "tint_step.json"
    dtype = getattr(torch, args.dtype)
    n_train = args.train_tokens or args.tokens // 2
    ids = torch.randint(0, args.vocab, (args.tokens,), generator=torch.Generator().manual_seed(0))
    rows, profiles = [], {}
    for width in args.widths:
        model = random_gpt2(width, args.layers, args.heads, args.vocab, args.tokens, dtype)
        config = TintConfig(learning_rate=args.lr, shards=3 if width % 3 == 0 else 2)
        rows.append(measure(model, config, ids, n_train, args.repeats, "random GPT-2"))
        print("\n".join(table(rows[-1:])[2:]), flush=True)
        if width == args.profile_width:
            profiles[f"random GPT-2 D={width}"] = profile(model, config, ids, n_train, args.repeats)
    if args.smollm2:
        from incontext.interop.models import load_model

        model = load_model("smollm2", "cpu", "float32").model
        vocab = model.config.vocab_size
        smol_ids = torch.randint(0, vocab, (args.tokens,), generator=torch.Generator().manual_seed(0))
        for n_top in (1, 2):
            config = TintConfig(learning_rate=1e-4, rows_per_prefix=4, shards=4, ln_eps=1e-2, act_eps=1e-2,
                                n_simulation_layers=n_top)
            rows.append(measure(model, config, smol_ids, n_train, args.smollm2_repeats, "SmolLM2-135M"))
            print("\n".join(table(rows[-1:])[2:]), flush=True)
        profiles["SmolLM2-135M top 1"] = profile(model, dataclasses.replace(config, n_simulation_layers=1), smol_ids,
                                                 n_train, 1)
    lines = [f"# One simulated TinT step vs the plain SGD step + prediction it simulates ({args.dtype}, {args.threads} "
             f"thread(s), median of {args.repeats} interleaved repeats, CPU time per thread; "
             f"{'fast linear layers' if HAS_FAST else 'linear layers as attention (no fast path)'})", ""]
    lines += table(rows)
    for name, prof in profiles.items():
        lines += ["", f"## Where the simulated step's time goes: {name} ({prof['total_ms']:.1f} ms per step, exclusive CPU time)", "",
                  "| simulator module | ms | share |", "|---|---|---|"]
        lines += [f"| {m} | {ms:.2f} | {100 * ms / prof['total_ms']:.0f}% |" for m, ms in prof["modules_ms"].items()]
        lines += ["", "| top torch operators | self ms | calls |", "|---|---|---|"]
        lines += [f"| {o['op']} | {o['self_ms']:.2f} | {o['calls']} |" for o in prof["top_ops"]]
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    out.write_text(json.dumps({"settings": {**settings, "fast_path": HAS_FAST, "torch": torch.__version__},
                               "rows": rows, "profiles": profiles}, indent=2))
    out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
