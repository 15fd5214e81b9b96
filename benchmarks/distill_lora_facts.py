"""distill-lora (or kv-prefix) as `incontext absorb` runs it (the model's tokenizer given: questions written about the
passage, chat turns), scored the way `incontext generate --chat` is used: on VALIDATION episodes of the `facts` task
(--split test: once, on the test episodes, after the choice).

An episode's passage is the `facts` prompt (people=2; --split validation, the default: seeds 10000 + i as `incontext
compare --tune` uses; dev: the episodes of `incontext compare --split dev`, in order, the old test passages; test: those
of `incontext compare` on its test split, in order). --placement (default system, where `incontext absorb
--placement auto` puts a chat model's document): the passage is absorbed as the system turn of a chat, and each
question follows it as the user's turn, as `incontext generate --chat --adapted` renders it; raw: the passage alone,
each question a conversation of its own (the rows before the option). The method reads the passage alone: the
questions asked below never reach it. Each question the task would ask is put in the chat template and answered
greedily (up to 24 tokens); per answer:

- right: the true answer appears in it;
- wrong person: not right, and the same fact of another person of the passage appears (a binding error).

    python benchmarks/distill_lora_facts.py [--episodes 3] [--threads 2] [--method M] [--train-queries]
                                            [--config NAME key=value ...]
    e.g. --config base --config mlp target_modules=attn.qkv,attn.out,mlp.fc_in,mlp.fc_out --config teacher

--method: distill-lora (default) or kv-prefix. --train-queries task: the method also gets the task's training
queries and their question ids, as `incontext compare` gives them (`facts` with paraphrases=3: each fact's statement
cut before its answer and three other wordings of its question, never the question asked below), so that
`study.wording_ensemble=true` has groups to read; --train-queries questions: the three other wordings alone. Either is what
`incontext absorb --train-queries FILE` gives for a file of those lines (tasks.queries.train_query_text: the statement
cut before its answer read as it is, the questions as "Q: LINE\nA:"; checked below); without it the method reads the
passage alone, as `incontext absorb` without the option. --covered F: only the first round(F * 7) facts of each
passage get training queries; the row then counts right answers on the covered and the other facts apart.
--split dev|test: the passages of the harness's episodes of that split (`incontext compare --task facts --split S
--seed N`, with --seed N) instead; test once, after the settings are chosen on validation.

Writes benchmarks/results/distill_lora_facts.json (one row per config, appended to what is there) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from incontext.absorb import get_absorb_method
from incontext.absorb.decode import stream_tokens
from incontext.tasks.splits import episode_seed
from incontext.absorb.protocol import max_context
from incontext.tasks.queries import train_query_ids, train_query_text
from incontext.config import parse_overrides
from incontext.interop.models import load_model
from incontext.tasks.facts import facts_prompt, make_people
from incontext.tasks.placement import chat_turn, placed_document

RESULTS = Path(__file__).resolve().parent / "results" / "distill_lora_facts.json"
VALIDATION_SEED = 10_000  # as tasks.splits.episode_seed("validation", 0)
TEACHER = "teacher"  # --config teacher: the base model reading the passage in the user turn, the ceiling


PARAPHRASES = 3  # --train-queries: the wordings per question beside its cloze, as the README's short rows


def episodes(n: int, people: int, split: str = "validation", seed: int = 0):
    """(passage, [(question, answer, other people's answers to the same question)], [each question's training
    query texts]) as the facts task draws them (its _train_queries with paraphrases=3: the cloze, then wordings)."""
    out = []
    stream = random.Random(f"facts-{episode_seed(split, seed)}")  # dev, test: the harness's passages, in order
    for i in range(n):
        rng = random.Random(f"facts-{VALIDATION_SEED + seed + i}") if split == "validation" else stream
        persons = make_people(people, rng)
        text, pairs, _ = facts_prompt(persons, rng)
        asked = []
        for person, attribute in pairs:
            question, answer = person.question(attribute)
            others = [p.question(attribute)[1].strip() for p in persons if p is not person]
            asked.append((question.removeprefix("Q: ").removesuffix("\nA:"), answer.strip(), others))
        train = [[person.cloze(a), *(person.paraphrase(a, f) for f in range(PARAPHRASES))] for person, a in pairs]
        out.append((text, asked, train))
    return out


@torch.no_grad()
def chat_answer(runner, codec, question: str, stop: set[int], placement: str = "raw", document: str = "") -> str:
    """The greedy reply to `question` in the chat template: after an absorbed `placement` document (the text of
    `incontext generate --chat --adapted`), or with `document` itself in front (the teacher)."""
    if document and placement == "raw":  # the passage and the question in one user turn
        text = chat_turn(codec, document.strip() + "\n\n" + question, "raw")
    else:
        text = (placed_document(codec, document, placement) if document else "") + chat_turn(codec, question, placement)
    return codec.decode(list(stream_tokens(runner, codec.encode(text), 24, stop_ids=stop))).strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--people", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--method", choices=["distill-lora", "kv-prefix"], default="distill-lora")
    p.add_argument("--train-queries", choices=["task", "questions"], default=None,
                   help="give training queries and their question ids (see above)")
    p.add_argument("--covered", type=float, default=1.0, help="the share of each passage's facts given training queries")
    p.add_argument("--config", nargs="+", action="append", required=True, metavar="NAME [key=value ...]")
    p.add_argument("--show", action="store_true", help="print every question and answer")
    p.add_argument("--split", choices=["validation", "dev", "test"], default="validation",
                   help="the passages: validation (choose here), dev (the old test passages) or test (once, at the end)")
    p.add_argument("--seed", type=int, default=0, help="the split's passages from this seed on (as compare's --seed)")
    p.add_argument("--placement", choices=["system", "raw"], default="system",
                   help="where the passage goes: a system turn (as `incontext absorb` on a chat model) or raw text")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2")
    model, codec = loaded.model, loaded.tokenizer
    vocab = codec.tokenizer.get_vocab()
    stop = {codec.eos_token_id} | {vocab[t] for t in ("<|im_end|>",) if t in vocab}
    data = episodes(args.episodes, args.people, args.split, args.seed)
    if args.split != "validation":  # the same passages as the harness's episodes of that split
        from incontext.tasks.episodes import get_episode_source

        harness = get_episode_source("facts", people=args.people).episodes(
            args.episodes, seed=episode_seed(args.split, args.seed), tokenizer=codec)
        assert all(e.prompt.tolist() == codec.encode(text) for e, (text, *_) in zip(harness, data))
    rows = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    for name, *settings in args.config:
        options = {} if name == TEACHER else {"progress": False, **parse_overrides(settings, flat=True)}
        right = wrong_person = asked = covered_right = covered_asked = 0
        seconds, transcript, pools = [], [], []
        for text, questions, train in data:
            covered = round(args.covered * len(train)) if args.train_queries else 0
            wordings = [w if args.train_queries == "task" else w[1:] for w in train[:covered]]
            # the lines a --train-queries file would hold, read as `incontext absorb` reads them: the same texts
            lines = [[t.removeprefix("Q: ").removesuffix("\nA:") for t in w] for w in wordings]
            assert [[train_query_text(t) for t in w] for w in lines] == wordings
            placed = placed_document(codec, text, args.placement)
            if covered:  # as `incontext absorb --train-queries` reads the lines after the placed passage
                ids, groups = train_query_ids(lines, codec, max_context(model), placed, len(codec.encode(placed)), args.placement)
                given = {"train_queries": [torch.tensor(i) for i in ids], "train_groups": groups}
            else:
                given = {}
            if name == TEACHER:  # no absorb: the base model reading the passage (what is distilled)
                adapted, document = model, text
                seconds.append(0.0)
            else:
                method = get_absorb_method(args.method, **options)
                start = time.perf_counter()
                adapted, document = method.absorb(model, torch.tensor(codec.encode(placed)), codec=codec, **given), ""
                seconds.append(time.perf_counter() - start)
                pools.append(adapted.history["pool"])
            for i, (question, answer, others) in enumerate(questions):
                said = chat_answer(adapted, codec, question, stop, args.placement, document)
                ok = answer in said
                right += ok
                covered_right += ok and i < covered
                covered_asked += i < covered
                wrong_person += (not ok) and any(o in said for o in others)
                asked += 1
                transcript.append({"question": question, "answer": answer, "said": said, "right": ok})
                if args.show:
                    print(f"{'OK ' if ok else '-- '}{question} [{answer}] -> {said}")
        row = {"config": name, "method": None if name == TEACHER else args.method,
               "train_queries": None if name == TEACHER else args.train_queries,
               "covered": args.covered if args.train_queries and name != TEACHER else None,
               "covered_right": covered_right, "covered_questions": covered_asked, "options": options,
               "episodes": args.episodes, "validation_seed": VALIDATION_SEED if args.split == "validation" else None,
               "split": args.split, "seed": args.seed, "test": args.split == "dev",  # "test": the dev split's old name
               "placement": args.placement,
               "questions": asked, "right": right, "wrong_person": wrong_person,
               "absorb_seconds_mean": sum(seconds) / len(seconds), "threads": args.threads, "pools": pools,
               "transcript": transcript}
        rows.append(row)
        if covered_asked and covered_asked < asked:
            print(f"{name:>12}: covered facts right {covered_right}/{covered_asked}, the others "
                  f"{right - covered_right}/{asked - covered_asked}")
        print(f"{name:>12}: right {right}/{asked} ({100 * right / asked:.0f}%), wrong person {wrong_person}, "
              f"absorb {row['absorb_seconds_mean']:.1f} s  {options}", flush=True)
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
