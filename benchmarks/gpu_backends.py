"""Our Transformer vs transformers' LlamaForCausalLM with the same weights (random, SmolLM2-135M's shapes), and every
absorb method's costs, on a GPU. Not a timed test: a measurement to read, written to benchmarks/results/.

1. Speed, same weights, interleaved repeats (CUDA events; CPU time per thread on a CPU), ratio = theirs / ours:
   - training step: forward + backward + AdamW step on batch x length tokens;
   - prefill: one forward over a 2,048-token prompt (no grad);
   - cached decode: ms per token for 64 tokens after a 2,048-token prompt (each with its own K/V cache; ours
     through our Cache, theirs through transformers' DynamicCache, and our Hugging Face backend's wrapper too).
2. Absorb methods at prompt lengths 512 / 2,048 / 4,096: absorb ms, ms per 16-token query, kept bytes per prompt and
   peak memory (the harness's CostTimer and PeakMemory), on our backend and on the Hugging Face backend.

    PYTHONPATH=src python3 benchmarks/gpu_backends.py --device cuda --dtype bfloat16        # ~3 min on an H100
    PYTHONPATH=src python3 benchmarks/gpu_backends.py --device cpu --quick --out gpu_dry_run.json # a dry run, tiny shapes
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from incontext.absorb import get_absorb_method
from incontext.harness.compare import CostTimer, PeakMemory
from incontext.interop.hf import to_hf_llama
from incontext.models.hf_backend import HFCausalLM
from incontext.models import Cache, Transformer, TransformerConfig
from incontext.runtime import resolve_runtime

RESULTS = Path(__file__).resolve().parent / "results"
SMOLLM2 = dict(n_layer=30, n_head=9, n_kv_head=3, d_model=576, d_mlp=1536, vocab_size=49152, max_seq_len=8192,
               positions="rope", rope_theta=100000.0, norm="rmsnorm", norm_eps=1e-5, mlp="swiglu", bias=False,
               tie_embeddings=True)
TINY = dict(SMOLLM2, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_mlp=128, vocab_size=512, max_seq_len=1024)
METHODS = {"keep-prompt": {}, "drop-prompt": {}, "dynamic-eval": {"learning_rate": 1e-4},
           "distill-lora": {"progress": False}, "kv-prefix": {"progress": False},
           "iclca-approx": {"n_features": 256, "exact_sinks": 1}}


def timed(timer: CostTimer, fn, repeats: int) -> list[float]:
    return [timer(fn)[1] for _ in range(repeats)]


def interleaved(timer: CostTimer, fns: dict, repeats: int) -> dict[str, float]:
    """Median ms of each function, the repeats interleaved (one warm-up each first)."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timer(fn)[1])
    return {name: statistics.median(t) for name, t in times.items()}


def speed(ours: Transformer, theirs, device: torch.device, sizes: dict, repeats: int) -> dict:
    timer = CostTimer(device)
    vocab = ours.config.vocab_size
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (sizes["train_batch"], sizes["train_length"] + 1), generator=g).to(device)
    wrapper = HFCausalLM(theirs)
    results = {}

    # training step: each model its own AdamW
    optims = {"ours": torch.optim.AdamW(ours.parameters(), lr=1e-5), "theirs": torch.optim.AdamW(theirs.parameters(), lr=1e-5)}

    def train_step(name):
        def step():
            model = ours if name == "ours" else theirs
            logits = model(batch[:, :-1]) if name == "ours" else model(input_ids=batch[:, :-1]).logits
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optims[name].step()
            optims[name].zero_grad(set_to_none=True)
        return step

    ours.train(), theirs.train()
    results["train_step_ms"] = interleaved(timer, {"ours": train_step("ours"), "theirs": train_step("theirs")}, repeats)
    ours.eval(), theirs.eval()

    prompt = torch.randint(0, vocab, (1, sizes["prefill"]), generator=g).to(device)
    with torch.no_grad():
        results["prefill_ms"] = interleaved(timer, {"ours": lambda: ours(prompt),
                                                    "theirs": lambda: theirs(input_ids=prompt, use_cache=False).logits},
                                            repeats)
        n_new = sizes["decode_tokens"]
        tokens = torch.randint(0, vocab, (1, n_new), generator=g).to(device)
        ours_cache = ours.prefill(prompt)
        wrapper_cache = wrapper.prefill(prompt)
        from transformers import DynamicCache

        theirs_cache = DynamicCache(config=theirs.config)
        theirs(input_ids=prompt, use_cache=True, **{wrapper._cache_arg: theirs_cache})
        start = prompt.shape[1]

        def decode_ours():
            cache = Cache(list(ours_cache.layers), ours_cache.position)
            for t in range(n_new):
                ours(tokens[:, t : t + 1], cache=cache)

        def decode_theirs():
            cache = copy.copy(theirs_cache)
            cache.layers = [copy.copy(layer) for layer in theirs_cache.layers]  # cat makes new tensors: a shallow copy
            for t in range(n_new):
                theirs(input_ids=tokens[:, t : t + 1], position_ids=torch.tensor([[start + t]], device=device),
                       use_cache=True, **{wrapper._cache_arg: cache})

        def decode_wrapper():
            cache = Cache(list(wrapper_cache.layers), wrapper_cache.position)
            for t in range(n_new):
                wrapper(tokens[:, t : t + 1], cache=cache)

        per_call = interleaved(timer, {"ours": decode_ours, "theirs": decode_theirs, "hf_backend": decode_wrapper},
                               max(3, repeats // 2))
        results["decode_ms_per_token"] = {k: v / n_new for k, v in per_call.items()}
    for key in ("train_step_ms", "prefill_ms", "decode_ms_per_token"):
        results[key]["ratio_theirs_over_ours"] = results[key]["theirs"] / results[key]["ours"]
    return results


def absorb_costs(ours: Transformer, theirs, device: torch.device, lengths: list[int], query_tokens: int,
                 repeats: int, rows: list[dict], save) -> list[dict]:
    """Appends a row per (length, backend, method) to `rows`, calling save() after each (a run cut short keeps
    what it measured)."""
    timer = CostTimer(device)
    backends = {"incontext": ours, "hf": HFCausalLM(theirs).eval()}
    g = torch.Generator().manual_seed(1)
    for length in lengths:
        prompt = torch.randint(0, ours.config.vocab_size, (length,), generator=g).to(device)
        query = torch.randint(0, ours.config.vocab_size, (1, query_tokens), generator=g).to(device)
        for backend, model in backends.items():
            for name, options in METHODS.items():
                method = get_absorb_method(name, **options)
                reason = method.unsupported(model)
                row = {"method": name, "backend": backend, "prompt_tokens": length}
                if reason is not None:
                    rows.append({**row, "status": f"n/a: {reason}"})
                    continue
                try:
                    with PeakMemory(device) as peak:
                        adapted, absorb_ms = timer(lambda: method.absorb(model, prompt))
                    with torch.no_grad():
                        adapted(query)  # warm-up
                        query_ms = statistics.median(timed(timer, lambda: adapted(query), repeats))
                    row.update(status="ok", absorb_ms=absorb_ms, query_ms=query_ms,
                               kept_bytes=adapted.kept_bytes(method.runs_on(model)), peak_bytes=peak.peak)
                except (RuntimeError, ValueError) as error:  # e.g. out of memory: recorded, the rest goes on
                    row["status"] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
                adapted = None
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                rows.append(row)
                save()
                print(json.dumps(row), flush=True)
    return rows


def markdown(record: dict) -> str:
    s = record["speed"]
    lines = [f"# ours vs transformers, {record['shapes']} shapes, {record['device_name']} {record['dtype']}", "",
             "| measure | ours | transformers | ratio (theirs / ours) |", "|---|---|---|---|"]
    for key, label in (("train_step_ms", "training step (ms)"), ("prefill_ms", "prefill (ms)"),
                       ("decode_ms_per_token", "cached decode (ms / token)")):
        lines.append(f"| {label} | {s[key]['ours']:.2f} | {s[key]['theirs']:.2f} | {s[key]['ratio_theirs_over_ours']:.2f}x |")
    lines.append(f"\nour Hugging Face backend's decode: {s['decode_ms_per_token']['hf_backend']:.2f} ms / token\n")
    lines += ["| method | backend | prompt | absorb ms | ms / query | kept MB | peak MB |", "|---|---|---|---|---|---|---|"]
    for r in record["absorb"]:
        if r["status"] != "ok":
            lines.append(f"| {r['method']} | {r['backend']} | {r['prompt_tokens']} | {r['status'][:60]} | | | |")
            continue
        peak = "–" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**20:.1f}"
        lines.append(f"| {r['method']} | {r['backend']} | {r['prompt_tokens']} | {r['absorb_ms']:.1f} | {r['query_ms']:.2f} "
                     f"| {r['kept_bytes'] / 2**20:.2f} | {peak} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and short prompts (a dry run)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--lengths", type=int, nargs="*", default=None)
    parser.add_argument("--skip-absorb", action="store_true")
    parser.add_argument("--sizes", nargs=4, type=int, metavar=("TRAIN_BATCH", "TRAIN_LENGTH", "PREFILL", "DECODE"),
                        help="override the speed sizes (e.g. a CPU run at SmolLM2's shapes: 1 256 512 16)")
    parser.add_argument("--methods", default=None, help="comma-separated absorb methods (default: all in METHODS)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default benchmarks/results/gpu_backends.json)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_backends: no CUDA device here: benchmark skipped (run with --device cpu --quick for a dry run)")
        return 0
    runtime = resolve_runtime(args.device, args.dtype)
    shapes = TINY if args.quick else SMOLLM2
    sizes = ({"train_batch": 2, "train_length": 64, "prefill": 128, "decode_tokens": 8} if args.quick else
             {"train_batch": 8, "train_length": 1024, "prefill": 2048, "decode_tokens": 64})
    if args.sizes:
        sizes = dict(zip(("train_batch", "train_length", "prefill", "decode_tokens"), args.sizes))
    if args.methods:
        unknown = set(args.methods.split(",")) - set(METHODS)
        if unknown:
            print(f"unknown methods {sorted(unknown)}; known: {', '.join(METHODS)}", file=sys.stderr)
            return 2
        for name in set(METHODS) - set(args.methods.split(",")):
            METHODS.pop(name)
    lengths = args.lengths or ([32, 64] if args.quick else [512, 2048, 4096])
    out = args.out or RESULTS / "gpu_backends.json"
    if out.exists():
        print(f"{out} exists: give --out a new file", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    ours = Transformer(TransformerConfig(**shapes)).to(runtime.device, runtime.dtype).eval()
    theirs = to_hf_llama(ours).eval()
    start = time.perf_counter()
    record = {"shapes": "tiny" if args.quick else "SmolLM2-135M", "config": shapes, "sizes": sizes,
              "device": str(runtime.device), "dtype": args.dtype, "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(runtime.device) if runtime.device.type == "cuda" else "cpu",
              "speed": speed(ours, theirs, runtime.device, sizes, args.repeats)}
    print(json.dumps(record["speed"], indent=1), flush=True)
    record["absorb"] = []

    def save():
        record["seconds"] = time.perf_counter() - start
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1))
        out.with_suffix(".md").write_text(markdown(record))

    save()
    if not args.skip_absorb:
        absorb_costs(ours, theirs, runtime.device, lengths, 16, args.repeats, record["absorb"], save)
    save()
    print(markdown(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
