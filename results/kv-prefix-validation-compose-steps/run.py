"""Composition trained briefly after concatenation (validation episodes, seed 10000): each document of `facts` with
documents=2 absorbed alone by kv-prefix at its defaults, once, then composed with `compose_steps` = 0 (the plain
concatenation, what `compose` does by default) and with a few steps of training of the concatenation on the union
of both documents' data stages (each sequence against its own document's teacher), and every question answered.

Per row: exact match of each document's questions by that document absorbed alone and by the composition, and
KL(keep-prompt || composed) over the scored positions, pooled over the episodes; the compose time (wall).

    PYTHONPATH=src python results/kv-prefix-validation-compose-steps/run.py 3 [STEPS [METHOD]]

prints one table (sweep.md gathers the three runs' tables into one, each row with its command).

A third argument names another composing method (distill-lora: the summed adapter trained).
"""

import sys
import time

import torch

from incontext.absorb import KeepPrompt, get_absorb_method
from incontext.harness.compare import agreement
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.metrics import get_metric

torch.set_num_threads(2)
n_episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
STEPS = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else [0, 24, 48]
METHOD = sys.argv[3] if len(sys.argv) > 3 else "kv-prefix"
loaded = load_model("smollm2", "cpu", torch.float32)
model, codec = loaded.model, loaded.tokenizer
source = get_episode_source("facts", people=4, documents=2)
metric = get_metric(source.metric)


alone_hits, alone_n = [0, 0], [0, 0]
totals = {n: {"hits": [0, 0], "n": [0, 0], "kl": [0.0, 0], "seconds": []} for n in STEPS}
for episode in source.episodes(n_episodes, seed=10000, tokenizer=codec):
    keep = KeepPrompt().absorb(model, episode.prompt)
    method = get_absorb_method(METHOD, progress=False).use_codec(codec)
    alone = [method.absorb(model, part.prompt, train_queries=list(part.train_queries)) for part in episode.parts]
    with torch.no_grad():
        references = [keep(q.inputs[None])[0] for q in episode.queries]
        for d, (part, adapted) in enumerate(zip(episode.parts, alone)):
            for q in part.queries:
                alone_hits[d] += int(metric.score_query(adapted(q.inputs[None])[0], q).exact)
                alone_n[d] += 1
    owner = [d for d, part in enumerate(episode.parts) for _ in part.queries]
    for steps in STEPS:
        start = time.perf_counter()
        composed = get_absorb_method(METHOD, progress=False, compose_steps=steps).compose(alone)
        row = totals[steps]
        row["seconds"].append(time.perf_counter() - start)
        with torch.no_grad():
            for q, d, ref in zip(episode.queries, owner, references):
                out = composed(q.inputs[None])[0]
                row["hits"][d] += int(metric.score_query(out, q).exact)
                row["n"][d] += 1
                agreed = agreement(out, ref, q, tokens=True)
                row["kl"][0] += agreed["kl_sum"]
                row["kl"][1] += agreed["positions"]
    print({s: r for s, r in totals.items()}, alone_hits, alone_n, file=sys.stderr, flush=True)

print(f"{METHOD} at its defaults, `facts` documents=2 people=4, {n_episodes} validation episodes (seed 10000); each "
      f"document alone: {100 * alone_hits[0] / alone_n[0]:.1f}% and {100 * alone_hits[1] / alone_n[1]:.1f}% exact match "
      f"on its own questions\n")
print("| compose_steps | document 1 composed % (of alone) | document 2 composed % (of alone) | composed KL (nats) | compose s (wall, median) |")
print("|---|---|---|---|---|")
for steps, row in totals.items():
    cells = []
    for d in (0, 1):
        value, base = 100 * row["hits"][d] / row["n"][d], 100 * alone_hits[d] / alone_n[d]
        cells.append(f"{value:.1f} ({100 * value / base:.0f}%)" if base else f"{value:.1f}")
    secs = sorted(row["seconds"])
    print(f"| {steps} | {cells[0]} | {cells[1]} | {row['kl'][0] / row['kl'][1]:.3f} | {secs[len(secs) // 2]:.1f} |")
