"""Training throughput on CPU: our Transformer vs Hugging Face GPT2LMHeadModel vs a minimal SDPA GPT.

All three models have the same GPT-2 architecture (learned positions, pre-LayerNorm, fused-qkv softmax
attention through torch SDPA, GELU-tanh MLP of width 4W, biases, tied LM head, dropout 0) and start from
the SAME weights (ours is initialised from --seed; HF and the minimal GPT get a copy of its state dict).
One timed step = forward + next-token cross-entropy + backward + AdamW step + zero_grad, identical code
for every model. Models are interleaved inside each repeat (rotating the order) to cancel drift.

MFU uses the PaLM / nanoGPT estimate: flops per token = 6 N + 12 L T W, N = all parameters except the
position table (the tied embedding / head counted once), divided by the fp32 (or bf16) matmul peak that
this script measures at start-up on the same threads.

    .venv/bin/python benchmarks/train_throughput.py                      # fp32, eager, widths 64 128 256
    .venv/bin/python benchmarks/train_throughput.py --compile --bf16     # add compiled columns, bf16 table
    .venv/bin/python benchmarks/train_throughput.py --widths 64 --steps 2 --repeats 1 --warmup 1  # smoke

Progress goes to stderr; stdout carries only the header and the markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from incontext import Transformer, TransformerConfig
from incontext.runtime import cpu_model_name

MODELS = ("ours", "hf", "minimal")
LABELS = {"ours": "incontext Transformer", "hf": "HF GPT2LMHeadModel", "minimal": "minimal SDPA GPT"}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "train_throughput.json"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- command line


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Run on a quiet machine: other processes on the same cores distort both the peak and the steps.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    shape = p.add_argument_group("model and batch")
    shape.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256], help="d_model values to sweep")
    shape.add_argument("--heads", type=int, default=None, help="fixed n_head for every width; None = max(1, W // 32)")
    shape.add_argument("--n-layer", type=int, default=6, help="transformer blocks")
    shape.add_argument("--vocab-size", type=int, default=8192, help="vocabulary (the LM head costs 2*W*V flops/token)")
    shape.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    shape.add_argument("--seq-len", type=int, default=256, help="context length T (also the position table size)")

    timing = p.add_argument_group("timing")
    timing.add_argument("--steps", type=int, default=20, help="timed training steps per repeat")
    timing.add_argument("--warmup", type=int, default=3, help="untimed steps per model before timing (>= 2 when compiled)")
    timing.add_argument("--repeats", type=int, default=5, help="interleaved repeats; the table reports the median")
    timing.add_argument("--threads", type=int, default=default_threads(), help="torch.set_num_threads")
    timing.add_argument("--peak-size", type=int, default=2048, help="N of the N x N matmul that measures the peak")
    timing.add_argument("--peak-reps", type=int, default=10, help="matmuls timed for the peak (best one counts)")

    modes = p.add_argument_group("modes")
    modes.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    modes.add_argument("--compile", action="store_true", help="add torch.compile (default mode) columns")
    modes.add_argument("--bf16", action="store_true", help="add a bf16 table: torch.autocast('cpu', bfloat16) around forward+loss")
    modes.add_argument(
        "--hf-activation", choices=("gelu_new", "gelu_pytorch_tanh"), default="gelu_new",
        help="HF MLP activation: gelu_new is GPT-2's (a Python tanh-GELU of ~6 elementwise ops), "
        "gelu_pytorch_tanh the fused F.gelu(approximate='tanh') that ours and the minimal GPT use; same math",
    )
    modes.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (betas 0.9/0.95, weight decay 0.1, fused=False)")
    modes.add_argument("--seed", type=int, default=0, help="seed of the weights and of the fixed token batch")

    p.add_argument("--out", type=Path, default=None,
                   help="JSON with raw numbers; the markdown goes next to it (.md) [benchmarks/results/train_throughput.json]")
    args = p.parse_args(argv)
    args.out = args.out or DEFAULT_OUT
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown or not args.models:
        p.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
    for name in ("steps", "repeats", "threads", "n_layer", "vocab_size", "batch_size", "seq_len", "peak_size", "peak_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def heads_for(width: int, args) -> int:
    return args.heads if args.heads is not None else max(1, width // 32)


# ----------------------------------------------------------------------------- machine


def measure_peak_gflops(n: int, reps: int, dtype: torch.dtype) -> float:
    """Best-of-`reps` GFLOP/s of an n x n @ n x n matmul (2 n^3 flops)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm up (thread pool, oneDNN/BLAS kernels)
    best = math.inf
    for _ in range(reps):
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


# ----------------------------------------------------------------------------- models


class MinimalAttention(nn.Module):
    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(width, 3 * width)  # rows [q; k; v], the same layout as ours
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = (z.view(b, t, self.n_head, w // self.n_head).transpose(1, 2) for z in self.qkv(x).split(w, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, w))


class MinimalMLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc_in, self.fc_out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.fc_out(F.gelu(self.fc_in(x), approximate="tanh"))


class MinimalBlock(nn.Module):
    def __init__(self, width: int, n_head: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(width), MinimalAttention(width, n_head)
        self.norm2, self.mlp = nn.LayerNorm(width), MinimalMLP(width)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MinimalGPT(nn.Module):
    """nanoGPT-style peer with the lowest Python overhead; parameter names match ours (strict state-dict copy)."""

    def __init__(self, vocab_size: int, width: int, n_layer: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.tok_emb, self.pos_emb = nn.Embedding(vocab_size, width), nn.Embedding(max_seq_len, width)
        self.blocks = nn.ModuleList(MinimalBlock(width, n_head) for _ in range(n_layer))
        self.norm_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.norm_f(x))


def our_config(width: int, args) -> TransformerConfig:
    return TransformerConfig(
        vocab_size=args.vocab_size, n_layer=args.n_layer, d_model=width, n_head=heads_for(width, args),
        max_seq_len=args.seq_len, positions="learned", norm="layernorm", mlp="gelu_tanh", bias=True,
        tie_embeddings=True, dropout=0.0, attn_dropout=0.0,
    )


def build_hf(ours: Transformer, args):
    """GPT2LMHeadModel with the same configuration, SDPA attention, no KV cache, and ours' weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from incontext.interop import to_hf_gpt2

    c = ours.config
    config = GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.max_seq_len, n_embd=c.d_model, n_layer=c.n_layer, n_head=c.n_head,
        n_inner=c.mlp_width, activation_function=args.hf_activation, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=c.norm_eps, tie_word_embeddings=True, use_cache=False,
        bos_token_id=None, eos_token_id=None, attn_implementation="sdpa",
    )
    hf = GPT2LMHeadModel(config)
    hf.load_state_dict(to_hf_gpt2(ours).state_dict(), strict=True)  # the interop name/transpose mapping
    if hf.config._attn_implementation != "sdpa":
        raise RuntimeError(f"HF picked attention {hf.config._attn_implementation!r}, expected 'sdpa'")
    if hf.lm_head.weight is not hf.transformer.wte.weight:
        raise RuntimeError("HF LM head is not tied to the embedding")
    return hf


def build_models(width: int, args) -> dict[str, nn.Module]:
    torch.manual_seed(args.seed)
    ours = Transformer(our_config(width, args))
    models = {}
    if "ours" in args.models:
        models["ours"] = ours
    if "hf" in args.models:
        models["hf"] = build_hf(ours, args)
    if "minimal" in args.models:
        minimal = MinimalGPT(args.vocab_size, width, args.n_layer, heads_for(width, args), args.seq_len)
        minimal.load_state_dict(ours.state_dict(), strict=True)
        models["minimal"] = minimal
    for model in models.values():
        model.train()
    return models


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() deduplicates the tied head


def flops_per_token(width: int, args) -> float:
    """PaLM / nanoGPT estimate: 6 N + 12 L T W, N = every parameter except the position table."""
    n = count_params(Transformer(our_config(width, args))) - args.seq_len * width
    return 6 * n + 12 * args.n_layer * args.seq_len * width


# ----------------------------------------------------------------------------- one training step


def logits_fn(name: str, model):
    if name == "hf":
        return lambda ids: model(input_ids=ids, use_cache=False).logits
    return model


def make_optimizer(model: nn.Module, args) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=False)


def train_step(forward, optimizer, inputs, targets, precision: str) -> torch.Tensor:
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with ctx:
        logits = forward(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def check_same_loss(models: dict[str, nn.Module], inputs, targets) -> dict[str, float]:
    """Initial fp32 loss of each model: equal weights must give equal losses (guards the comparison)."""
    losses = {}
    with torch.no_grad():
        for name, model in models.items():
            logits = logits_fn(name, model)(inputs)
            losses[name] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    spread = max(losses.values()) - min(losses.values())
    if spread > 1e-4:
        log(f"WARNING: initial losses differ by {spread:.2e}: {losses} -- the models are not the same")
    return losses


# ----------------------------------------------------------------------------- measurement


def run_group(width: int, precision: str, compiled: bool, inputs, targets, args) -> dict[str, dict]:
    """Fresh models for one (width, precision, compile) cell; warm up each, then interleave timed repeats."""
    models = build_models(width, args)
    tokens_per_step = inputs.numel()
    if compiled:
        torch._dynamo.reset()
    state = {}
    for name, model in models.items():
        entry = {"params": count_params(model), "compile_s": None, "error": None, "tokens_per_s": [], "step_s": []}
        forward = logits_fn(name, torch.compile(model) if compiled else model)
        optimizer = make_optimizer(model, args)
        warmup = max(args.warmup, 2) if compiled else args.warmup
        try:
            for i in range(warmup):
                start = time.perf_counter()
                train_step(forward, optimizer, inputs, targets, precision)
                if i == 0 and compiled:
                    entry["compile_s"] = time.perf_counter() - start
        except Exception as exc:  # a failed compile skips this cell, not the whole run
            entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log(f"  {name} W={width} {precision} compile={compiled}: FAILED -- {entry['error']}")
        state[name] = (entry, forward, optimizer)

    live = [name for name, (entry, _, _) in state.items() if entry["error"] is None]
    for r in range(args.repeats):
        order = live[r % len(live):] + live[: r % len(live)] if live else []
        for name in order:
            entry, forward, optimizer = state[name]
            if entry["error"] is not None:
                continue
            try:
                start = time.perf_counter()
                for _ in range(args.steps):
                    loss = train_step(forward, optimizer, inputs, targets, precision)
                float(loss)  # CPU ops are synchronous; this just forces the last value
                elapsed = time.perf_counter() - start
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                log(f"  {name} W={width} {precision} compile={compiled}: FAILED -- {entry['error']}")
                continue
            entry["step_s"].append(elapsed / args.steps)
            entry["tokens_per_s"].append(tokens_per_step * args.steps / elapsed)
        log(f"  W={width} {precision} {'compiled' if compiled else 'eager'} repeat {r + 1}/{args.repeats}: "
            + ", ".join(f"{n} {state[n][0]['tokens_per_s'][-1]:,.0f} tok/s" for n in order if state[n][0]["tokens_per_s"]))
    return {name: entry for name, (entry, _, _) in state.items()}


def summarise(entry: dict, flops_token: float, peak_gflops: float) -> None:
    values = entry["tokens_per_s"]
    if not values:
        entry.update(median_tokens_per_s=None, spread_pct=None, mfu=None)
        return
    median = statistics.median(values)
    entry["median_tokens_per_s"] = median
    entry["spread_pct"] = 100 * (max(values) - min(values)) / median
    entry["mfu"] = median * flops_token / (peak_gflops * 1e9)


# ----------------------------------------------------------------------------- report


def header_lines(meta: dict) -> list[str]:
    peaks = ", ".join(f"{p} {g:,.1f} GFLOP/s" for p, g in meta["peak_gflops"].items())
    return [
        f"# Training throughput: torch {meta['torch']}, transformers {meta['transformers']}, "
        f"{meta['threads']} threads, CPU: {meta['cpu']}",
        f"# measured matmul peak ({meta['peak_size']}x{meta['peak_size']}, best of {meta['peak_reps']}): {peaks}",
        f"# batch {meta['batch_size']} x context {meta['seq_len']}, vocab {meta['vocab_size']}, {meta['n_layer']} layers, "
        f"steps {meta['steps']} x repeats {meta['repeats']} (median), warmup {meta['warmup']}, AdamW fused=False",
    ]


def fmt_rate(entry: dict | None) -> tuple[str, str]:
    """(median tokens/s with spread, MFU) cells."""
    if entry is None:
        return ("", "")
    if entry["median_tokens_per_s"] is None:
        return ("failed", "")
    return (f"{entry['median_tokens_per_s']:,.0f} ±{entry['spread_pct']:.0f}%", f"{100 * entry['mfu']:.1f}%")


def markdown_table(results: dict, precision: str, compile_modes: list[bool], args) -> list[str]:
    cols = ["width", "heads", "params (M)", "model"]
    for compiled in compile_modes:
        tag = "compiled" if compiled else "eager"
        cols += [f"{tag} tok/s", f"{tag} vs HF", f"{tag} MFU"]
    lines = [f"### {precision}", "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for width in args.widths:
        for name in args.models:
            first = results[(width, precision, False)][name]
            label = LABELS[name] + (f" (sdpa, {args.hf_activation})" if name == "hf" else "")
            row = [str(width), str(heads_for(width, args)), f"{first['params'] / 1e6:.2f}", label]
            for compiled in compile_modes:
                group = results[(width, precision, compiled)]
                entry = group.get(name)
                rate, mfu = fmt_rate(entry)
                hf = group.get("hf")
                ratio = ""
                if entry and hf and entry.get("median_tokens_per_s") and hf.get("median_tokens_per_s"):
                    ratio = f"{entry['median_tokens_per_s'] / hf['median_tokens_per_s']:.2f}x"
                row += [rate, ratio, mfu]
            lines.append("| " + " | ".join(row) + " |")
    return lines


def compile_notes(results: dict) -> list[str]:
    notes = []
    for (width, precision, compiled), group in results.items():
        for name, entry in group.items():
            if entry["error"]:
                notes.append(f"- W={width} {precision} {'compiled' if compiled else 'eager'} {name}: {entry['error']}")
            elif compiled and entry["compile_s"] is not None:
                notes.append(f"- W={width} {precision} compiled {name}: first step (compile) {entry['compile_s']:.1f} s")
    return notes


def write_outputs(path: Path, markdown: str, meta: dict, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"width": w, "precision": p, "compiled": c, "model": name, **entry}
        for (w, p, c), group in results.items()
        for name, entry in group.items()
    ]
    path.write_text(json.dumps({"meta": meta, "results": rows, "markdown": markdown}, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown + "\n")


# ----------------------------------------------------------------------------- main


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        hf_version = transformers.__version__
    except ImportError:
        if "hf" in args.models:
            raise SystemExit("transformers is not installed: pass --models ours,minimal")
        hf_version = "not installed"

    precisions = ["fp32"] + (["bf16"] if args.bf16 else [])
    compile_modes = [False] + ([True] if args.compile else [])
    log(f"measuring matmul peak with {args.threads} threads ...")
    peaks = {"fp32": measure_peak_gflops(args.peak_size, args.peak_reps, torch.float32)}
    if args.bf16:
        peaks["bf16"] = measure_peak_gflops(args.peak_size, args.peak_reps, torch.bfloat16)
    meta = {
        "torch": torch.__version__, "transformers": hf_version, "python": platform.python_version(),
        "threads": args.threads, "cpu": cpu_model_name(), "peak_gflops": peaks,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        # settings only: output paths are machine-specific and stay out of the results
        **{k: v for k, v in vars(args).items() if k != "out"},
    }
    header = header_lines(meta)
    print("\n".join(header), flush=True)

    gen = torch.Generator().manual_seed(args.seed)
    data = torch.randint(0, args.vocab_size, (args.batch_size, args.seq_len + 1), generator=gen)
    inputs, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    results, losses, flops = {}, {}, {}
    for width in args.widths:
        flops[width] = flops_per_token(width, args)
        losses[width] = check_same_loss(build_models(width, args), inputs, targets)
        log(f"W={width}: initial losses {losses[width]}")
        for precision in precisions:
            for compiled in compile_modes:
                group = run_group(width, precision, compiled, inputs, targets, args)
                for entry in group.values():
                    summarise(entry, flops[width], peaks[precision])
                results[(width, precision, compiled)] = group
    meta["flops_per_token"] = flops
    meta["initial_losses"] = losses

    body = []
    for precision in precisions:
        body += markdown_table(results, precision, compile_modes, args) + [""]
    body.append(f"MFU: (6 N + 12 L T W) x tokens/s / measured {' / '.join(precisions)} matmul peak; "
                "N = parameters without the position table. 'vs HF' = tokens/s divided by HF's; ±% = (max-min)/median.")
    notes = compile_notes(results)
    if notes:
        body += ["", "Notes:"] + notes
    markdown = "\n".join(header + [""] + body)
    print("\n" + "\n".join(body), flush=True)
    write_outputs(args.out, markdown, meta, results)
    log(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
