"""What kv-prefix's derived queries (study.derived=16, the default) ask on the sweep's validation episodes (seeds
10000-10007 of `facts` with two people and of `documents`): each kind's count, and how many of the questions the task
asks appear among them word for word (the cause the docs give for the gap to keep-prompt; validation only).

    python results/self-study-validation/coverage.py     # writes coverage.json beside it
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from incontext.absorb.kv_prefix import KVPrefixStudy
from incontext.absorb.self_study import derived_queries, document_text
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source


def kind(query: str) -> str:
    return "about" if "say about" in query else "question" if query.startswith("Q: ") else "prefix"


def main() -> None:
    codec = load_model("smollm2").tokenizer
    options, out = KVPrefixStudy(), {}
    for task, task_options in (("facts", {"people": 2}), ("documents", {})):
        kinds, asked, verbatim = {"prefix": 0, "about": 0, "question": 0}, 0, 0
        for episode in get_episode_source(task, **task_options).episodes(8, seed=10_000, tokenizer=codec):
            derived = derived_queries(document_text(codec, episode.prompt.tolist()), options.derived_kinds,
                                      options.derived, torch.Generator().manual_seed(0))
            for query in derived:
                kinds[kind(query)] += 1
            for query in episode.queries:  # the question: its ids up to the first scored position
                first = int(query.mask.nonzero()[0])
                asked += 1
                verbatim += codec.decode(query.inputs[: first + 1].tolist()).strip() in {q.strip() for q in derived}
        out[task] = {"episodes": 8, "derived_kinds": kinds, "asked": asked, "asked_verbatim_among_derived": verbatim}
    path = Path(__file__).with_name("coverage.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
