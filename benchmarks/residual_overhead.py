"""Overhead of a residual attention stream on a training step (Burns et al. sec. 4: the residual-V LMs took
30.18 +- 0.49 h to train against 29.12 +- 0.40 h for the classic ones, +3.6% wall clock, zero extra parameters).

Two GPT-2-style LMs of the same size and the same starting weights (the stream adds no parameter): classic, and
the residual-V-stream model (`TransformerConfig.residual_stream="v"`: every layer but the first adds the previous
layer's raw value projection of the same head; `--streams q k v value_residual` adds other variants). The
architecture is residual-lm's (pre-LN, learned positions, GELU MLP x4, tied head, no 1/sqrt(d_head) scaling,
dropout 0.1 on the residual branches and the attention probabilities) and the optimizer the paper's (Adam, lr 1e-3,
betas 0.9 / 0.95). One training step = forward on a batch of random token ids, next-token cross-entropy,
backward, optimizer step, zero_grad; the same pre-drawn batches for every model.

Timing: the models run interleaved, their order rotated every repeat; each repeat times `--steps` consecutive
steps of one model (after `--warmup` untimed steps per model) with the harness's CostTimer: CPU time per thread on
the CPU (steadier than wall time on a shared machine), CUDA events on a GPU. Reported: median ms per step over the
repeats and the ratio to classic, both as the ratio of the medians and as the median (min, max) of the per-repeat
ratios (each repeat's residual time over the classic time of the same repeat: drift cancels), with a 95% bootstrap
interval of that median (the repeats resampled). A set-up check runs
before timing: the residual model's logits differ from the classic model's on the same weights (the stream is on).

    python benchmarks/residual_overhead.py                    # residual-lm's size, 1 CPU thread (under 2 minutes)
    python benchmarks/residual_overhead.py --preset paper     # the paper's LM (8 layers, width 256, T 256, batch 64): a GPU
    python benchmarks/residual_overhead.py --streams q k v --repeats 20 --threads 2 --out /tmp/overhead.json

Sizes: `small` = residual-lm's reduced LM (4 layers, width 128, 8 heads, T 64, batch 32, vocab 1024); `paper` = the
paper's (8 layers, width 256, 16 heads, T 256, batch 64; the paper does not print its vocabulary: 50257 is the
GPT-2 / GPT-Neo tokenizer TinyStories ships with). Any size flag overrides the preset's value. Writes
benchmarks/results/residual_overhead.{json,md} (`--out` moves both), with the command that made them.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from incontext.harness.compare import CostTimer
from incontext.models import Transformer, TransformerConfig

RESULTS = Path(__file__).resolve().parent / "results"
PRESETS = {
    "small": {"layers": 4, "width": 128, "heads": 8, "seq_len": 64, "batch": 32, "vocab": 1024},
    "paper": {"layers": 8, "width": 256, "heads": 16, "seq_len": 256, "batch": 64, "vocab": 50257},
}
STREAMS = {"q": "residual Q", "k": "residual K", "v": "residual V", "value_residual": "value residual"}
PAPER = {"classic_hours": (29.12, 0.40), "residual_v_hours": (30.18, 0.49), "overhead_percent": 3.6}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="small", help="model and batch size [small]")
    for name in PRESETS["small"]:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override the preset's {name}")
    p.add_argument("--streams", nargs="+", choices=list(STREAMS), default=["v"], help="residual variants timed [v]")
    p.add_argument("--dropout", type=float, default=0.1, help="residual-branch and attention dropout [0.1, the paper's]")
    p.add_argument("--steps", type=int, default=5, help="training steps per timed block [5]")
    p.add_argument("--repeats", type=int, default=30, help="interleaved rounds, each times every model once [30]")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model before timing [2]")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads [1]")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="[benchmarks/results/residual_overhead.json]")
    args = p.parse_args(argv)
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in (*PRESETS["small"], "steps", "repeats", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0 or not 0 <= args.dropout < 1:
        p.error("--warmup must be >= 0 and --dropout in [0, 1)")
    if args.width % args.heads:
        p.error(f"--width {args.width} is not divisible by --heads {args.heads}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device here")
    args.streams = list(dict.fromkeys(args.streams))
    return args


def build(args: argparse.Namespace, stream: str, device: torch.device) -> Transformer:
    config = TransformerConfig(n_layer=args.layers, n_head=args.heads, d_model=args.width, vocab_size=args.vocab,
                               max_seq_len=args.seq_len, positions="learned", norm="layernorm", mlp="gelu",
                               tie_embeddings=True, scale_attn=False, dropout=args.dropout,
                               attn_dropout=args.dropout, residual_stream=stream)
    torch.manual_seed(args.seed)
    return Transformer(config).to(device)


def make_step(model: Transformer, batches: list[torch.Tensor]):
    """A closure running `len(batches)`-cyclic training steps: forward, cross-entropy, backward, Adam, zero_grad."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    at = [0]

    def step(n: int) -> None:
        model.train()
        for _ in range(n):
            batch = batches[at[0] % len(batches)]
            at[0] += 1
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def bootstrap_median_interval(values: list[float], seed: int, resamples: int = 2000) -> tuple[float, float]:
    """95% percentile interval of the median of `values` (the repeats resampled with replacement)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=g).to(device)
               for _ in range(args.steps)]
    names = {"none": "classic", **{s: STREAMS[s] for s in args.streams}}
    models = {"none": build(args, "none", device)}
    start = models["none"].state_dict()
    for stream in args.streams:  # the same starting weights (value_residual's mixing scalars are its own)
        models[stream] = build(args, stream, device)
        missing, unexpected = models[stream].load_state_dict(start, strict=False)
        if unexpected or any(not k.endswith("value_mix") for k in missing):
            raise RuntimeError(f"{stream}: weights do not match the classic model's ({missing}, {unexpected})")
    with torch.no_grad():  # set-up check: the stream changes the function (eval mode: no dropout)
        probe = batches[0][:2, :-1]
        classic = models["none"].eval()(probe)
        same = {s: bool(torch.equal(models[s].eval()(probe), classic)) for s in args.streams}
    if any(same.values()):
        raise RuntimeError(f"the residual stream changed nothing for {[s for s, v in same.items() if v]}")
    steps = {name: make_step(model, batches) for name, model in models.items()}
    timer = CostTimer(device)
    for step in steps.values():
        step(args.warmup)
    if device.type == "cuda":
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {name: [] for name in models}
    order = list(models)
    for r in range(args.repeats):
        for name in order[r % len(order):] + order[: r % len(order)]:
            times[name].append(timer(lambda name=name: steps[name](args.steps))[1] / args.steps)
    rows = []
    for name in models:
        ratios = [t / c for t, c in zip(times[name], times["none"])]
        low, high = bootstrap_median_interval(ratios, args.seed)
        median = statistics.median(times[name])
        rows.append({"stream": name, "model": names[name], "parameters": sum(p.numel() for p in models[name].parameters()),
                     "ms_per_step": median, "ms_per_step_all": times[name],
                     "ratio_of_medians": median / statistics.median(times["none"]),
                     "paired_ratio_median": statistics.median(ratios), "paired_ratio_low95": low,
                     "paired_ratio_high95": high, "paired_ratio_min": min(ratios), "paired_ratio_max": max(ratios)})
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), None) if Path("/proc/cpuinfo").is_file() else None
    return {"command": " ".join(["python benchmarks/residual_overhead.py", *args.argv]), "settings": settings,
            "torch": torch.__version__, "device": torch.cuda.get_device_name() if device.type == "cuda" else (cpu or platform.machine()),
            "timer": "CUDA events" if device.type == "cuda" else "CPU time per thread", "paper": PAPER, "rows": rows}


def table(result: dict) -> str:
    s = result["settings"]
    where = (f"{s['threads']} CPU thread(s) of {result['device']}" if s["device"] == "cpu" else result["device"])
    lines = [f"# Residual attention stream overhead on a training step ({s['preset']} size)", "",
             f"Command: `{result['command']}`", "",
             (f"{s['layers']} layers, width {s['width']}, {s['heads']} heads, T {s['seq_len']}, batch {s['batch']}, "
              f"vocab {s['vocab']}, dropout {s['dropout']}; forward + cross-entropy + backward + Adam step; {where}, "
              f"torch {result['torch']}; {result['timer']}, median of {s['repeats']} interleaved repeats of "
              f"{s['steps']} steps (after {s['warmup']} warm-up steps per model)."), "",
             "| model | parameters | ms per step | ratio of medians | per-repeat ratio: median [95% interval] (min, max) | overhead | paper |",
             "|---|---|---|---|---|---|---|"]
    paper = result["paper"]
    for row in result["rows"]:
        overhead = "-" if row["stream"] == "none" else f"{100 * (row['paired_ratio_median'] - 1):+.1f}%"
        paired = ("-" if row["stream"] == "none" else
                  f"{row['paired_ratio_median']:.3f} [{row['paired_ratio_low95']:.3f}, {row['paired_ratio_high95']:.3f}] "
                  f"({row['paired_ratio_min']:.3f}, {row['paired_ratio_max']:.3f})")
        cell = {"none": "{:.2f} +- {:.2f} h".format(*paper["classic_hours"]),
                "v": "{:.2f} +- {:.2f} h, +{}%".format(*paper["residual_v_hours"], paper["overhead_percent"])}
        lines.append(f"| {row['model']} | {row['parameters']:,} | {row['ms_per_step']:.2f} | {row['ratio_of_medians']:.3f} | "
                     f"{paired} | {overhead} | {cell.get(row['stream'], '-')} |")
    lines += ["", ("Paper: whole training runs (3 epochs of TinyStories, 3 seeds) timed by wall clock on a PC with 4 x RTX A4000, "
                   "8 layers, width 256, 16 heads, T 256, batch 64; the overhead column here is the per-repeat ratio's "
                   "median minus 1, its interval the bracketed one.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    args.argv = argv
    result = run(args)
    del result["settings"]["argv"]
    out = args.out or RESULTS / "residual_overhead.json"
    text = table(result)
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    return result


if __name__ == "__main__":
    main()
