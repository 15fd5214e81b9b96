"""Composition with foreign-name queries (validation episodes, seed 10000): each document of `facts` with
documents=2 absorbed alone by kv-prefix at its defaults and with `n_foreign` (the training queries also asked about
invented names the document does not hold, answered by the teacher reading the document), then the two prefixes
composed (`compose`) and every question answered.

Per variant: exact match of each document's questions absorbed alone and composed, and KL(keep-prompt || composed)
over the scored positions, pooled over the episodes.

    PYTHONPATH=src python results/kv-prefix-validation-foreign/run.py 3 > results/kv-prefix-validation-foreign/output.md
"""

import sys

import torch

from incontext.absorb import KeepPrompt, get_absorb_method
from incontext.absorb.harness import agreement
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.metrics import get_metric

torch.set_num_threads(2)
n_episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
VARIANTS = {"defaults": {}, "n_foreign=16": {"n_foreign": 16}}
loaded = load_model("smollm2", "cpu", torch.float32)
model, codec = loaded.model, loaded.tokenizer
source = get_episode_source("facts", people=4, documents=2)
metric = get_metric(source.metric)


totals = {name: {"alone": [0, 0], "composed": [0, 0], "kl": [0.0, 0], "steps": [], "seconds": []} for name in VARIANTS}
for episode in source.episodes(n_episodes, seed=10000, tokenizer=codec):
    keep = KeepPrompt().absorb(model, episode.prompt)
    for name, options in VARIANTS.items():
        method = get_absorb_method("kv-prefix", progress=False, **options).use_codec(codec)
        row = totals[name]
        alone = []
        for part in episode.parts:
            adapted = method.absorb(model, part.prompt, train_queries=list(part.train_queries))
            row["steps"].append(adapted.history["steps"])
            row["seconds"].append(adapted.history["teacher_seconds"] + adapted.history["train_seconds"])
            alone.append(adapted)
        composed = method.compose(alone)
        with torch.no_grad():
            for part, adapted in zip(episode.parts, alone):
                for q in part.queries:
                    row["alone"][0] += int(metric.score_query(adapted(q.inputs[None])[0], q).exact)
                    row["alone"][1] += 1
            for q in episode.queries:
                out = composed(q.inputs[None])[0]
                row["composed"][0] += int(metric.score_query(out, q).exact)
                row["composed"][1] += 1
                agreed = agreement(out, keep(q.inputs[None])[0], q, tokens=True)
                row["kl"][0] += agreed["kl_sum"]
                row["kl"][1] += agreed["positions"]
    print(totals, file=sys.stderr, flush=True)

print(f"kv-prefix, `facts` documents=2 people=4, {n_episodes} validation episodes (seed 10000), each document absorbed "
      "alone, then composed\n")
print("| variant | alone exact % | composed exact % | composed / alone | composed KL (nats) | steps (median) | absorb s wall (median) |")
print("|---|---|---|---|---|---|---|")
for name, row in totals.items():
    alone, composed = 100 * row["alone"][0] / row["alone"][1], 100 * row["composed"][0] / row["composed"][1]
    share = f"{100 * composed / alone:.0f}%" if alone else "n/a"
    steps, secs = sorted(row["steps"]), sorted(row["seconds"])
    print(f"| {name} | {alone:.1f} | {composed:.1f} | {share} | {row['kl'][0] / row['kl'][1]:.3f} | "
          f"{steps[len(steps) // 2]} | {secs[len(secs) // 2]:.0f} |")
