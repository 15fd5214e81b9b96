"""Whether a teacher that reads a chunk of a long document answers its facts better than one that reads all of it,
on validation episodes of `facts` on SmolLM2 (a probe that prints and writes JSON, not a benchmark with a peer): the
exact match of the evaluation questions asked after the whole document, and after the chunk the data stage would
give each question (study_stage.chunk_spans and assign_chunks: chunks of --chunks tokens at a stride of half a
chunk, the one sharing most of the question's rare tokens). A chunked teacher helps a prompt-free method only if it
answers more than the whole document's reader does.

    python benchmarks/chunked_teacher.py --episodes 3 --seed 10000 --people 15 --chunks 128 192 256 384 \
        --out benchmarks/results/chunked_teacher_facts_long.json

Evaluation questions of validation episodes only: a seed of the test split (1,000,000 and up: tasks/splits.py) is refused without --allow-test.
"""

from __future__ import annotations

import argparse
import time

import torch
from data_stage_decodes import (add_facts_arguments, add_validation_arguments,  # the shared probe arguments
                                check_validation_arguments, facts_source)
from training_record import write_new

from incontext.absorb.study import stage as study_stage
from incontext.interop.models import load_model
from incontext.models import Cache
from incontext.models.lm import copy_cache


@torch.no_grad()
def exact(model, cache: Cache, query) -> bool:
    """The query's answer is the greedy answer (teacher-forced, as the harness scores `exact`) after the cached context."""
    logits = model(query.inputs[None], cache=copy_cache(cache, 1))[0]
    return bool((logits[query.mask].argmax(-1) == query.targets[query.mask]).all())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_facts_arguments(p, episodes=3, seed=10000)
    p.add_argument("--chunks", type=int, nargs="+", default=[128, 192, 256, 384], help="chunk sizes in tokens")
    add_validation_arguments(p)
    args = p.parse_args()
    check_validation_arguments(p, args)
    if any(c < 2 for c in args.chunks):
        p.error("every --chunks size must be >= 2 tokens")
    source = facts_source(p, args)
    loaded = load_model("smollm2")
    model = loaded.model.eval()
    episodes = source.episodes(args.episodes, seed=args.seed, tokenizer=loaded.tokenizer)
    rows = {}
    for size in [None, *args.chunks]:
        start, hits, total = time.process_time(), 0, 0
        for episode in episodes:
            prompt = episode.prompt.long()
            spans = [(0, prompt.shape[0])] if size is None else study_stage.chunk_spans(prompt.shape[0], size, None)
            homes = study_stage.assign_chunks(prompt, spans, [q.inputs for q in episode.queries])
            caches = {}
            for query, home in zip(episode.queries, homes):
                if home not in caches:
                    caches[home] = Cache.empty(model.config.n_layer)
                    a, b = spans[home]
                    model(prompt[None, a:b], cache=caches[home])
                hits += exact(model, caches[home], query)
                total += 1
        name = "whole document" if size is None else f"chunks of {size}"
        rows[name] = {"exact_match": hits / total, "hits": hits, "queries": total,
                      "cpu_s_per_thread": (time.process_time() - start) / args.threads}
        print(f"{name}: {hits}/{total} = {100 * hits / total:.1f}% exact match", flush=True)
    summary = {"model": loaded.description, "task": "facts", "episodes": args.episodes, "seed": args.seed,
               "people": args.people, "prompt_tokens": sum(e.prompt.shape[-1] for e in episodes) / len(episodes),
               "rows": rows}
    if args.out is not None:
        write_new(args.out, summary)


if __name__ == "__main__":
    main()
