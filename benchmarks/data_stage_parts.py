"""Where the data stage's time goes: each part of self_study.study (recall windows, sampled continuations, the
training queries' answers, top-k targets) timed with device synchronisation, on random weights of SmolLM2's shapes
with SmolLM2's tokenizer, for `facts` prompts of 2 and 7 people, twice each (the second run warm). A probe that
prints, not a benchmark with a peer:

    python benchmarks/data_stage_parts.py cuda [TOKENIZER_DIR]      # or cpu
"""
import sys, time, functools, torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from absorb_cost import random_smollm2
from incontext.absorb import self_study, get_absorb_method
from incontext.tasks.episodes import get_episode_source
dev = sys.argv[1]
model, codec, _ = random_smollm2(dev, sys.argv[2] if len(sys.argv) > 2 else None)
times = {}
def timed(name, fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        torch.cuda.synchronize() if dev == "cuda" else None
        t = time.perf_counter(); out = fn(*a, **k)
        torch.cuda.synchronize() if dev == "cuda" else None
        times[name] = times.get(name, 0) + time.perf_counter() - t
        return out
    return inner
for name in ("_recall_windows", "_sample", "_answer", "top_k_targets", "teacher_sequences"):
    setattr(self_study, name, timed(name, getattr(self_study, name)))
for people in (2, 7):
    ep = get_episode_source("facts", people=people).episodes(1, seed=0, tokenizer=codec)[0]
    prompt = ep.prompt.to(dev).reshape(-1).long(); train = [q.to(dev).reshape(-1) for q in ep.train_queries]
    m = get_absorb_method("kv-prefix", progress=False)
    for rep in range(2):
        times.clear()
        t = time.perf_counter()
        seqs, counts = self_study.study(model, prompt, train, m.stage, codec, torch.Generator().manual_seed(0), top_k=20)
        torch.cuda.synchronize() if dev == "cuda" else None
        total = time.perf_counter() - t
        print(people, prompt.shape[0], rep, f"study {total:.2f}", {k: round(v, 3) for k, v in times.items()}, counts, flush=True)
