"""Does the prompted model (the teacher) answer a fact the same way in every wording? On SmolLM2 (CPU) and `facts`
episodes, each asked fact is scored (exact match, as the harness scores it) in the evaluation wording and in the
training queries' wordings (the statement cut before its answer, and `paraphrases` other questions), by keep-prompt
and, with --student, by a kv-prefix (or distill-lora) absorbed from the same training queries.

A prompt-free method learns each fact from the teacher's answers to the training wordings; where the teacher answers
the evaluation wording right but the training wordings wrong, a student that fits its targets answers it wrong. The
table splits the facts keep-prompt answers right by how many training wordings it also answers right, and gives the
student's hits in each group. A diagnosis (nothing is chosen from it), on validation episodes: a seed of the
test split (1,000,000 and up: tasks/splits.py) is refused without --allow-test.

    python benchmarks/wording_consistency.py --people 15 --episodes 3 --seed 10000
    python benchmarks/wording_consistency.py --people 15 --episodes 3 --seed 10000 --student \\
        --set prefix_tokens=100 --set init=document-spread --set passes=8 --set learning_rate=0.03 --set autocast=bfloat16
"""

from __future__ import annotations

import argparse
import json

import torch
from data_stage_decodes import (add_facts_arguments, add_validation_arguments,  # the shared probe arguments
                                check_validation_arguments, facts_source)
from training_record import option, write_new

from incontext.absorb import get_absorb_method
from incontext.interop.models import load_model
from incontext.tasks.episodes import Query, token_query
from incontext.tasks.metrics import token_scores


def answer_ids(query: Query) -> torch.Tensor:
    """The tokens a query is scored on (its answer)."""
    return query.targets[query.mask]


@torch.no_grad()
def hits(adapted, queries: list[Query]) -> list[bool]:
    return [bool(token_scores(adapted(q.inputs[None])[0], q).exact) for q in queries]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_facts_arguments(p, episodes=3, seed=10000)
    p.add_argument("--student", action="store_true", help="also absorb each episode with --method and score it")
    p.add_argument("--method", choices=("kv-prefix", "distill-lora"), default="kv-prefix")
    p.add_argument("--set", action="append", default=[], type=option, metavar="OPTION=VALUE", help="a method option")
    add_validation_arguments(p)
    args = p.parse_args()
    check_validation_arguments(p, args)
    source = facts_source(p, args)
    options = {"progress": False, **dict(args.set)}
    try:
        get_absorb_method(args.method, **options)
        loaded = load_model("smollm2", "cpu")
    except (ValueError, TypeError) as error:
        p.error(str(error))
    group = 1 + args.paraphrases  # training queries per asked fact: the cut statement, then the paraphrases
    facts = []
    for i, episode in enumerate(source.episodes(args.episodes, args.seed, tokenizer=loaded.tokenizer, task=loaded.task)):
        train = list(episode.train_queries)
        if len(train) != group * len(episode.queries):
            raise SystemExit(f"episode {i}: {len(train)} training queries for {len(episode.queries)} facts")
        wordings = [token_query(t, answer_ids(episode.queries[j // group])) for j, t in enumerate(train)]
        models = {"teacher": get_absorb_method("keep-prompt").absorb(loaded.model, episode.prompt)}
        if args.student:
            models["student"] = get_absorb_method(args.method, **options).absorb(
                loaded.model, episode.prompt, train_queries=train, codec=loaded.tokenizer)
        scored = {name: (hits(m, episode.queries), hits(m, wordings)) for name, m in models.items()}
        for j in range(len(episode.queries)):
            facts.append({"episode": i, **{f"{name}_eval": ev[j] for name, (ev, _) in scored.items()},
                          **{f"{name}_train": tr[j * group:(j + 1) * group] for name, (_, tr) in scored.items()}})
        print(json.dumps({"episode": i, **{f"{name}_eval_hits": sum(ev) for name, (ev, _) in scored.items()},
                          **{f"{name}_train_hits": sum(tr) for name, (_, tr) in scored.items()}}), flush=True)
    summary = summarise(facts, group, args.student)
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        write_new(args.out, {"people": args.people, "paraphrases": args.paraphrases, "episodes": args.episodes,
                             "seed": args.seed, "method": args.method if args.student else None,
                             "options": options if args.student else None, "summary": summary, "facts": facts})


def summarise(facts: list[dict], group: int, student: bool) -> dict:
    """Accuracy per wording; the facts keep-prompt answers right in the evaluation wording, grouped by how many of
    their training wordings it also answers right (with the student's hits in each group)."""
    out = {"facts": len(facts), "teacher_eval": sum(f["teacher_eval"] for f in facts),
           "teacher_by_wording": [sum(f["teacher_train"][w] for f in facts) for w in range(group)]}
    right = [f for f in facts if f["teacher_eval"]]
    out["teacher_right_by_train_hits"] = {str(k): sum(sum(f["teacher_train"]) == k for f in right) for k in range(group + 1)}
    if student:
        out["student_eval"] = sum(f["student_eval"] for f in facts)
        out["student_eval_of_teacher_right"] = sum(f["student_eval"] for f in right)
        out["student_right_by_train_hits"] = {str(k): sum(f["student_eval"] for f in right if sum(f["teacher_train"]) == k)
                                              for k in range(group + 1)}
        out["student_by_wording"] = [sum(f["student_train"][w] for f in facts) for w in range(group)]
        out["student_train_matches_teacher"] = sum(s == t for f in facts for s, t in zip(f["student_train"], f["teacher_train"]))
        out["student_right_teacher_wrong"] = sum(f["student_eval"] and not f["teacher_eval"] for f in facts)
    return out


if __name__ == "__main__":
    main()
