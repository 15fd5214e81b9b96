"""Where a kv-prefix absorb's time goes on a device (a probe that prints and writes JSON, not a benchmark with a peer),
on random weights of SmolLM2-135M's shapes with SmolLM2's tokenizer, for one `facts` prompt:

1. the data stage's parts (recall windows, continuations, answers, top-k), decoded on the static cache (replayed as a
   CUDA graph on a GPU) and on a growing cache, each twice (the second run warm);
2. the kernels of one eager decode step and of one eager training step (torch.profiler: how many, which);
3. the time per training step replayed as a CUDA graph at several batch sizes (CUDA events over 48 steps).

    python benchmarks/absorb_profile.py --device cuda --tokenizer DIR [--people 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from absorb_cost import random_smollm2  # noqa: E402

from incontext.absorb import distill, get_absorb_method  # noqa: E402
from incontext.absorb.study import answer as study_answer, stage as study_stage  # noqa: E402
from incontext.absorb.distill import Speed  # noqa: E402
from incontext.models import Cache  # noqa: E402
from incontext.tasks.episodes import get_episode_source  # noqa: E402


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def data_stage_parts(model, codec, prompt, train, device: str) -> list[dict]:
    times: dict[str, float] = {}
    originals = {name: getattr(study_stage, name) for name in ("_recall_windows", "_sample", "_answer", "top_k_targets")}

    def timed(name, fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            sync(device)
            t = time.perf_counter()
            out = fn(*a, **k)
            sync(device)
            times[name] = times.get(name, 0.0) + time.perf_counter() - t
            return out
        return inner

    rows = []
    for name, fn in originals.items():
        setattr(study_stage, name, timed(name, fn))
    stage = get_absorb_method("kv-prefix", progress=False).options.study  # the method's data-stage options (top_k 20)
    try:
        for mode in ("cuda", "never", "cuda", "never"):
            times.clear()
            sync(device)
            t = time.perf_counter()
            _, counts = study_stage.study(model, prompt, train, stage, codec, torch.Generator().manual_seed(0),
                                         static_decode=mode)
            sync(device)
            rows.append({"decode": "static" if mode == "cuda" else "plain", "study_s": time.perf_counter() - t,
                         **{k.strip("_"): v for k, v in times.items()}, "counts": counts})
            print("data stage", rows[-1], flush=True)
    finally:
        for name, fn in originals.items():
            setattr(study_stage, name, fn)
    return rows


def kernels(fn, device: str) -> dict:
    """CUDA kernels (or CPU ops on a CPU) that one call of fn launches: count, total time, the commonest names."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    sync(device)
    t = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    wall = time.perf_counter() - t
    if device.startswith("cuda"):
        events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        events = [e for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children]
    names = collections.Counter(e.name[:60] for e in events)
    busy = sum(e.device_time for e in events) / 1e3 if device.startswith("cuda") else 0.0
    return {"kernels": len(events), "device_busy_ms": busy, "wall_ms": wall * 1e3, "commonest": names.most_common(12)}


def step_kernels(model, codec, prompt, train, device: str, cache_dir: str) -> dict:
    """The kernels of one eager fixed-shape training step (the step a CUDA graph captures): Speed(fixed_shapes=True,
    cuda_graph=False), on a CPU too; the third step is profiled."""
    found = {}
    original = distill._Steps._step

    def step(self, tensors):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            out = {}
            found.update(kernels(lambda: out.setdefault("r", original(self, tensors)), device))
            return out["r"]
        return original(self, tensors)

    distill._Steps._step = step
    try:
        get_absorb_method("kv-prefix", progress=False, speed=Speed(cuda_graph=False, fixed_shapes=True), steps=4,
                          passes=0, study={"cache": cache_dir}).absorb(model, prompt, train_queries=train, codec=codec)
    finally:
        distill._Steps._step = original
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokenizer", type=Path, default=None)
    p.add_argument("--people", type=int, default=7)
    p.add_argument("--batches", default="4,8,16")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-stage", dest="stage_runs", action="store_false", help="skip the data-stage part")
    args = p.parse_args()
    model, codec, description = random_smollm2(args.device, args.tokenizer)
    episode = get_episode_source("facts", people=args.people).episodes(1, seed=0, tokenizer=codec)[0]
    prompt = episode.prompt.to(args.device).reshape(-1).long()
    train = [t.to(args.device).reshape(-1) for t in episode.train_queries]
    record = {"model": description, "device": args.device, "torch": torch.__version__, "prompt_tokens": int(prompt.shape[0])}
    record["data_stage"] = data_stage_parts(model, codec, prompt, train, args.device) if args.stage_runs else []
    with torch.no_grad():
        cache = Cache.empty(model.config.n_layer)
        model(prompt[None], cache=cache)
        token = torch.zeros(2, 1, dtype=torch.long, device=args.device)
        two = study_answer._copy(cache, 2)
        model(token, cache=study_answer._copy(cache, 2))  # warm
        record["decode_step"] = kernels(lambda: model(token, cache=two), args.device)
    print("decode step", record["decode_step"], flush=True)
    with tempfile.TemporaryDirectory() as cache_dir:
        record["train_step"] = step_kernels(model, codec, prompt, train, args.device, cache_dir)
        print("train step", record["train_step"], flush=True)
        record["replayed_step_ms"] = {}
        for batch in (int(b) for b in args.batches.split(",") if b):
            method = get_absorb_method("kv-prefix", progress=False, steps=48, passes=0, batch_size=batch, patience=1000,
                                       study={"cache": cache_dir})
            adapted = method.absorb(model, prompt, train_queries=train, codec=codec)
            h = adapted.history
            record["replayed_step_ms"][batch] = {"train_s": h.get("train_seconds"), "steps": h.get("steps"),
                                                 "ms_per_step": 1e3 * h.get("train_seconds") / max(1, h.get("steps")),
                                                 "cuda_graph": h.get("cuda_graph")}
            print("batch", batch, record["replayed_step_ms"][batch], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
