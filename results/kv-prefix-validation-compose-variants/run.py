"""Composition at compose time (validation episodes, seed 10000): each document of `facts` with documents=2 absorbed
alone by kv-prefix at its defaults, once, then the two prefixes combined five ways and every question answered:

- sum (compose_prefixes, what `compose` does): both prefixes keep their positions, queries start after both;
- max position: queries start at the longer prefix's length (each prefix then sits at the distance it trained at);
- drop 2nd sink: the second prefix's frozen first position (its attention sink) left out;
- max + drop 2nd sink: both;
- 2nd re-rotated after 1st: the second prefix's keys moved to follow the first (as one concatenated document).

Exact match and KL(keep-prompt || composed) over the scored positions, pooled over the episodes, against each
document absorbed alone answering its own questions.

    PYTHONPATH=src python results/kv-prefix-validation-compose-variants/run.py 3 > results/kv-prefix-validation-compose-variants/output.md
"""

import sys

import torch
import torch.nn.functional as F

from incontext.absorb import KeepPrompt, get_absorb_method
from incontext.absorb.kv_prefix import TrainedPrefix, compose_prefixes, rerotate
from incontext.interop.models import load_model
from incontext.models import Cache
from incontext.models.lm import cache_kv
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.metrics import get_metric

torch.set_num_threads(2)
n_episodes = int(sys.argv[1]) if len(sys.argv) > 1 else 3
loaded = load_model("smollm2", "cpu", torch.float32)
model, codec = loaded.model, loaded.tokenizer
source = get_episode_source("facts", people=4, documents=2)
metric = get_metric(source.metric)


def combined(states, position, shift_second=False, drop_sinks=False) -> TrainedPrefix:
    kvs = [cache_kv(state) for state in states]
    layers = []
    for i in range(len(kvs[0])):
        ks, vs, offset = [], [], 0
        for j, kv in enumerate(kvs):
            k, v = kv[i]
            if j and drop_sinks:
                k, v = k[:, :, 1:], v[:, :, 1:]
            if j and shift_second:
                k = rerotate(model, k, torch.full((k.shape[2],), offset, dtype=torch.long))
            offset += kv[i][0].shape[2]
            ks.append(k)
            vs.append(v)
        layers.append((torch.cat(ks, 2), torch.cat(vs, 2)))
    return TrainedPrefix(model, Cache(layers=layers, position=position)).eval()


def variants(alone):
    states = [a.state() for a in alone]
    lengths = [s.position for s in states]
    return {"sum (compose)": compose_prefixes(*alone),
            "max position": combined(states, max(lengths)),
            "drop 2nd sink": combined(states, sum(lengths) - 1, drop_sinks=True),
            "max + drop 2nd sink": combined(states, max(lengths), drop_sinks=True),
            "2nd re-rotated after 1st": combined(states, sum(lengths), shift_second=True)}


totals = {}
for episode in source.episodes(n_episodes, seed=10000, tokenizer=codec):
    keep = KeepPrompt().absorb(model, episode.prompt)
    alone = [get_absorb_method("kv-prefix", progress=False).absorb(model, part.prompt, train_queries=list(part.train_queries))
             for part in episode.parts]
    with torch.no_grad():
        reference = [keep(q.inputs[None])[0] for q in episode.queries]
        for name, model_ in variants(alone).items():
            row = totals.setdefault(name, [0.0, 0, 0.0, 0])
            for q, ref in zip(episode.queries, reference):
                out = model_(q.inputs[None])[0]
                row[0] += float(metric.score_query(out, q).exact)
                row[1] += 1
                p, r = F.log_softmax(ref[q.mask].double(), -1), F.log_softmax(out[q.mask].double(), -1)
                row[2] += float((p.exp() * (p - r)).sum())
                row[3] += int(q.mask.sum())
        row = totals.setdefault("each document alone", [0.0, 0, float("nan"), 1])
        for part, adapted in zip(episode.parts, alone):
            for q in part.queries:
                row[0] += float(metric.score_query(adapted(q.inputs[None])[0], q).exact)
                row[1] += 1
print(f"kv-prefix at its defaults, `facts` documents=2 people=4, {n_episodes} validation episodes (seed 10000)\n")
print("| combination | exact match % | KL (nats) |\n|---|---|---|")
for name, (hits, n, kl, positions) in totals.items():
    print(f"| {name} | {100 * hits / n:.1f} | {kl / positions:.3f} |")
