"""How far the data stage's two decodes on a CPU (the static cache, the default, and the plain growing cache, the old
CPU path) differ on SmolLM2 and `facts` episodes: the sequences whose tokens or teacher top-k ids differ, and the
largest log-prob difference where they agree. Prints one line per episode and a JSON summary.

    python benchmarks/data_stage_decodes.py --episodes 20 --seed 0 --paraphrases 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from incontext.absorb import get_absorb_method
from incontext.absorb.study import stage as study_stage
from incontext.interop.models import load_model
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.splits import split_of


def add_facts_arguments(p: argparse.ArgumentParser, episodes: int, seed: int) -> None:
    """--episodes, --seed, --people, --paraphrases and --threads of a probe over `facts` episodes on SmolLM2 (also
    training_record.py's)."""
    p.add_argument("--episodes", type=int, default=episodes)
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--people", type=int, default=2)
    p.add_argument("--paraphrases", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)


def add_validation_arguments(p: argparse.ArgumentParser) -> None:
    """--allow-test and --out of a probe that reads evaluation questions (chunked_teacher.py, prefix_trajectory.py,
    wording_consistency.py); check_validation_arguments refuses them after parsing."""
    p.add_argument("--allow-test", action="store_true", help="allow a seed of the test split (1,000,000 and up)")
    p.add_argument("--out", type=Path, help="a JSON file to write (an existing one is refused)")


def check_validation_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A seed of the test split (tasks/splits.py: 1,000,000 and up) without --allow-test, and an --out that exists,
    named by p.error. Seed 0 is the dev split (the old test episodes, reused)."""
    if split_of(args.seed) == "test" and not args.allow_test:
        p.error(f"seed {args.seed} draws the test split's episodes: probe validation episodes (seed 10000), or pass "
                "--allow-test")
    if args.out is not None and args.out.exists():
        p.error(f"--out {args.out} exists; give a new file")


def facts_source(p: argparse.ArgumentParser, args: argparse.Namespace):
    """The `facts` episode source of those arguments, a bad one named (p.error) before any model loads; sets the
    threads."""
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    try:  # a bad task value (paraphrases=4) is named before the model loads
        source = get_episode_source("facts", people=args.people, questions=f"paraphrases:{args.paraphrases}")
    except (ValueError, TypeError) as error:
        p.error(str(error))
    torch.set_num_threads(args.threads)
    return source


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_facts_arguments(p, episodes=20, seed=0)
    args = p.parse_args()
    source = facts_source(p, args)
    loaded = load_model("smollm2")
    stage = get_absorb_method("kv-prefix", progress=False).options.study  # the method's data-stage options (top_k 20)
    sequences = differing = episodes_with = 0
    worst = 0.0
    for episode in source.episodes(args.episodes, seed=args.seed, tokenizer=loaded.tokenizer):
        prompt = (episode.prompt[0] if episode.prompt.dim() == 2 else episode.prompt).long()
        queries = [q[0] if q.dim() == 2 else q for q in episode.train_queries]
        out = {}
        with torch.no_grad():
            for mode in ("always", "never"):  # Speed(static_decode=...): the static cache, or the plain one
                out[mode] = study_stage.study(loaded.model, prompt, queries, stage, loaded.tokenizer,
                                             torch.Generator().manual_seed(0), static_decode=mode)[0]
        here = 0
        for static, plain in zip(out["always"], out["never"], strict=True):
            sequences += 1
            if not (torch.equal(static[0], plain[0]) and torch.equal(static[2], plain[2])):
                here += 1
            else:
                worst = max(worst, float((static[1] - plain[1]).abs().max()))
        differing += here
        episodes_with += here > 0
        print(f"{len(out['always'])} sequences, {here} differ", flush=True)
    print(json.dumps({"sequences": sequences, "differing_tokens_or_top_k_ids": differing,
                      "episodes_with_a_difference": episodes_with, "max_log_prob_difference_where_equal": worst}))


if __name__ == "__main__":
    main()
