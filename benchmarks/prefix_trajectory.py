"""How a kv-prefix's evaluation tracks its training, on validation episodes of `facts` on SmolLM2 (a probe that
prints and writes JSON, not a benchmark with a peer): every `--every` steps of one absorb, the exact match and the
KL(prompted model || prefix) on the episode's evaluation questions of the prefix as trained (`raw`), of exponential
moving averages of its iterates (`ema<decay>`) and of the uniform average of the second half's iterates (`swa`),
beside the training loss. Training runs exactly `--steps` steps (no early stop, no passes) with the options --set
gives (default: the test rows' bf16 autocast).

    python benchmarks/prefix_trajectory.py --episodes 6 --seed 10000 --out results/prefix_trajectory_validation.json

Evaluation questions of validation episodes only: a seed of the test split (1,000,000 and up: tasks/splits.py) is refused without --allow-test.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.nn.functional as F
from data_stage_decodes import (add_facts_arguments, add_validation_arguments,  # the shared probe arguments
                                check_validation_arguments, facts_source)
from training_record import option, write_new

from incontext.absorb import distill, get_absorb_method
from incontext.interop.models import load_model
from incontext.models.lm import copy_cache, with_kv


@contextlib.contextmanager
def each_step(hook):
    """The training loop's step (distill._Steps) followed by hook(the trained prefix tensors, loss) after every step."""
    step = distill._Steps.__call__

    def wrapped(self, batch):
        out = step(self, batch)
        hook(self.params, out[0])
        return out

    distill._Steps.__call__ = wrapped
    try:
        yield
    finally:
        distill._Steps.__call__ = step


@torch.no_grad()
def evaluate(model, template, flat, queries, teacher) -> tuple[float, int]:
    """Mean KL(teacher || prefix) over the answer positions of each question, averaged over questions, and how many
    questions' answers are the prefix's argmax at every answer position (exact match, teacher-forced)."""
    kv = [(flat[i].detach(), flat[i + 1].detach()) for i in range(0, len(flat), 2)]
    kls, exact = [], 0
    for query, log_p in zip(queries, teacher):
        log_q = F.log_softmax(model(query.inputs[None], cache=with_kv(template, kv))[0].float(), -1)[query.mask]
        kls.append(float((log_p.exp() * (log_p - log_q)).sum(-1).mean()))
        exact += bool((log_q.argmax(-1) == query.targets[query.mask]).all())
    return sum(kls) / len(kls), exact


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_facts_arguments(p, episodes=6, seed=10000)
    p.add_argument("--steps", type=int, default=96)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--decays", type=float, nargs="*", default=[0.9, 0.97], help="EMA decays of the prefix's iterates")
    p.add_argument("--set", action="append", default=[], type=option, metavar="OPTION=VALUE", help="a kv-prefix option")
    add_validation_arguments(p)
    args = p.parse_args()
    check_validation_arguments(p, args)
    if args.steps < 1 or args.every < 1 or not all(0 < d < 1 for d in args.decays):
        p.error("--steps and --every must be >= 1 and every decay in (0, 1)")
    source = facts_source(p, args)
    options = {"autocast": "bfloat16", **dict(args.set), "progress": False, "steps": args.steps, "passes": 0,
               "patience": 10 ** 9}
    try:
        get_absorb_method("kv-prefix", **options)
        loaded = load_model("smollm2", "cpu")
    except (ValueError, TypeError) as error:
        p.error(str(error))
    model, rows = loaded.model.eval(), []
    for i, episode in enumerate(source.episodes(args.episodes, args.seed, tokenizer=loaded.tokenizer, task=loaded.task)):
        with torch.no_grad():
            cache = model.prefill(episode.prompt[None])
            teacher = [F.log_softmax(model(q.inputs[None], cache=copy_cache(cache))[0].float(), -1)[q.mask]
                       for q in episode.queries]
        keep_prompt = sum(bool((t.argmax(-1) == q.targets[q.mask]).all()) for q, t in zip(episode.queries, teacher))
        method = get_absorb_method("kv-prefix", **options)
        prompt = episode.prompt.reshape(-1).long()
        template = method.start(model, prompt, method.prepare(model, prompt)["p"])  # the absorb's own start
        state = {"step": 0, "ema": {}, "swa": None, "n": 0, "trace": []}

        def hook(flat, loss):
            state["step"] += 1
            now = [t.detach().clone() for t in flat]
            for d in args.decays:
                before = state["ema"].get(d)
                state["ema"][d] = now if before is None else [d * a + (1 - d) * b for a, b in zip(before, now)]
            if state["step"] > args.steps // 2:
                state["n"] += 1
                before = state["swa"]
                state["swa"] = now if before is None else [a + (b - a) / state["n"] for a, b in zip(before, now)]
            if state["step"] % args.every == 0:
                row = {"step": state["step"], "train_loss": loss, "raw": evaluate(model, template, now, episode.queries, teacher)}
                row |= {f"ema{d}": evaluate(model, template, e, episode.queries, teacher) for d, e in state["ema"].items()}
                if state["swa"] is not None:
                    row["swa"] = evaluate(model, template, state["swa"], episode.queries, teacher)
                state["trace"].append(row)

        with each_step(hook):  # the absorb's own data stage and initial prefix (the same seed), trained eagerly
            method.absorb(model, episode.prompt, train_queries=list(episode.train_queries), codec=loaded.tokenizer)
        rows.append({"episode": i, "queries": len(episode.queries), "keep_prompt": keep_prompt, "trace": state["trace"]})
        print(json.dumps({"episode": i, "keep_prompt": keep_prompt, "last": state["trace"][-1]}), flush=True)
    totals = {}
    for k, row in enumerate(rows[0]["trace"]):
        totals[row["step"]] = {name: [sum(r["trace"][k][name][0] for r in rows) / len(rows), sum(r["trace"][k][name][1] for r in rows)]
                               for name in row if name not in ("step", "train_loss") and all(name in r["trace"][k] for r in rows)}
    summary = {"options": options, "episodes": args.episodes, "seed": args.seed, "people": args.people,
               "paraphrases": args.paraphrases, "keep_prompt": sum(r["keep_prompt"] for r in rows),
               "queries": sum(r["queries"] for r in rows), "by_step": totals, "rows": rows}
    for step, by_name in totals.items():
        print(step, {name: (round(kl, 3), exact) for name, (kl, exact) in by_name.items()})
    if args.out is not None:
        write_new(args.out, summary)


if __name__ == "__main__":
    main()
