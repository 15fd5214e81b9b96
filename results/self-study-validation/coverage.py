"""What kv-prefix's derived queries (study.derived=16, the default) ask on the sweep's validation episodes (seeds
10000-10007 of `facts` with two people and of `documents`): each kind's count (a query is "qa" or "about" only when it
is a whole rule-made question ending in "A:"; a sentence prefix that happens to start with "Q:", such as a cut of the
worked example, is a prefix), how many of the questions the task asks appear among them word for word, and how many
asked facts have their cloze form (the fact's sentence up to the answer) among them; the last two over 30 draws of
the derived queries' generator (the min, median and max), since which 16 are kept depends on the draw (the cause the
docs give for the gap to keep-prompt; validation only).

    python results/self-study-validation/coverage.py     # writes coverage.json beside it
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from incontext.absorb.methods.kv_prefix import KVPrefixStudy
from incontext.absorb.study import cloze, derived_queries, document_text
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source


def kind(query: str) -> str:
    if query.startswith("Q: What does the text say about ") and query.endswith("?\nA:"):
        return "about"
    return "question" if query.startswith("Q: ") and query.endswith("?\nA:") else "prefix"


def main() -> None:
    codec = load_model("smollm2").tokenizer
    options, out, draws = KVPrefixStudy(), {}, range(30)
    for task, task_options in (("facts", {"people": 2}), ("documents", {})):
        kinds, asked, verbatim, clozes = {"prefix": 0, "about": 0, "question": 0}, 0, [0] * len(draws), [0] * len(draws)
        for episode in get_episode_source(task, **task_options).episodes(8, seed=10_000, tokenizer=codec):
            text = document_text(codec, episode.prompt.tolist())
            for draw in draws:
                derived = {q.strip() for q in derived_queries(text, options.derived_kinds, options.derived,
                                                               torch.Generator().manual_seed(draw))}
                if draw == 0:
                    for query in derived:
                        kinds[kind(query)] += 1
                for query in episode.queries:  # the question: its ids up to the first scored position
                    first = int(query.mask.nonzero()[0])
                    question = codec.decode(query.inputs[: first + 1].tolist()).strip()
                    answer = codec.decode(query.inputs[first + 1:].tolist()).strip()
                    asked += draw == 0
                    verbatim[draw] += question in derived
                    clozes[draw] += cloze(text, answer) in derived
        spread = lambda counts: {"min": min(counts), "median": sorted(counts)[len(counts) // 2], "max": max(counts)}
        out[task] = {"episodes": 8, "derived_kinds": kinds, "asked": asked, "asked_verbatim_among_derived": verbatim[0],
                     "asked_verbatim_over_draws": spread(verbatim), "cloze_among_derived": clozes[0],
                     "cloze_over_draws": spread(clozes), "draws": len(draws)}
    path = Path(__file__).with_name("coverage.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
