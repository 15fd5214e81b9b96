"""KVzap's scorer trained for a shipped model (issue 79's amortized absorber): KVzip's log scores regressed on the
hidden states entering each attention layer, over documents that are never test documents (SQuAD's dev articles,
HotpotQA's dev questions' documents, the `documents` task's dev episodes), by least squares in closed form
(absorb/kvzap.py). Writes the scorer as kvpress's KVzapModel (config.json + model.safetensors in <out>/kvzap/), which
`kv-press --set press=kvzap --set weights=<out>/kvzap` runs through kvpress's own KVzapPress: one prefill per
document, no reconstruction pass.

    incontext run kvzap-train --out results/kvzap-smollm2                                   # SmolLM2-135M, ~3 min
    incontext run kvzap-train --set model=qwen2.5-coder-0.5b --out results/kvzap-qwen05    # Qwen2.5-0.5B

Every fifth document is held out of the fit: the table gives R^2 of the predicted log scores there, per layer, and
how much of KVzip's kept set at a tenth (per layer and head) the scorer's top tenth recovers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..outputs import Result, markdown_table
from .registry import register_experiment

SOURCES = ("squad", "hotpotqa", "documents")


@dataclass
class KVzapTrainConfig:
    model: str = "smollm2"  # a shipped model name or a Hugging Face folder
    squad: int = 60  # SQuAD dev-article paragraphs (~170 tokens each)
    hotpotqa: int = 10  # HotpotQA dev questions' documents (~1,000-1,500 tokens)
    documents: int = 20  # the `documents` task's dev episodes
    ridge: float = 1e-3  # the penalty, relative to the mean diagonal of the centred X^T X
    heldout_every: int = 5  # every k-th document is held out of the fit (R^2, kept-set recall)
    keep: float = 0.1  # the share at which the kept-set recall is measured

    def __post_init__(self):
        if min(self.squad, self.hotpotqa, self.documents) < 0 or self.squad + self.hotpotqa + self.documents < 2:
            raise ValueError("give at least two documents (squad, hotpotqa, documents >= 0)")
        if self.heldout_every < 2 or not 0 < self.keep < 1 or self.ridge < 0:
            raise ValueError("heldout_every >= 2, 0 < keep < 1, ridge >= 0")


def _prompts(config: KVzapTrainConfig, codec) -> list[tuple[str, torch.Tensor]]:
    from ..tasks.episodes import get_episode_source
    from ..tasks.splits import episode_seed

    out = []
    for name in SOURCES:
        n = getattr(config, name)
        if n:
            out += [(name, e.prompt) for e in get_episode_source(name).episodes(n, seed=episode_seed("dev", 0), tokenizer=codec)]
    return out


def _recall(predicted: torch.Tensor, truth: torch.Tensor, keep: float) -> float:
    """Per head, the share of KVzip's top `keep` positions that the prediction's top `keep` also holds."""
    k = max(1, round(keep * truth.shape[0]))
    hits = [len(set(predicted[:, h].topk(k).indices.tolist()) & set(truth[:, h].topk(k).indices.tolist())) / k
            for h in range(truth.shape[1])]
    return sum(hits) / len(hits)


@register_experiment("kvzap-train", "KVzap's linear scorer trained for a shipped model on dev documents (KVzip's "
                     "log scores from hidden states), for kv-press --set press=kvzap", KVzapTrainConfig)
def run(config: KVzapTrainConfig, out_dir: Path) -> Result:
    from ..absorb.kvzap import KVzapFit, kvzip_targets, r2, scores_of
    from tqdm.auto import tqdm

    from ..interop.models import load_model

    loaded = load_model(config.model)
    model, codec = loaded.model.eval(), loaded.tokenizer
    if codec is None:
        raise ValueError(f"kvzap-train: {config.model} has no tokenizer (KVzip writes its reconstruction prompt with it)")
    prompts = _prompts(config, codec)
    fit, held, sources = KVzapFit.for_model(model), [], {}
    start = time.process_time()
    for i, (source, prompt) in enumerate(tqdm(prompts, desc="KVzip targets", leave=False)):
        targets = kvzip_targets(model, prompt, codec)
        sources.setdefault(source, [0, 0])
        if i % config.heldout_every == config.heldout_every - 1:
            held.append(targets)
            sources[source][1] += 1
        else:
            fit.add(targets)
            sources[source][0] += 1
    scorer = fit.solve(config.ridge)
    seconds = (time.process_time() - start) / torch.get_num_threads()
    scorer.save_pretrained(out_dir / "kvzap")
    layer_r2 = r2(scorer, held)
    recall = [sum(_recall(scores_of(scorer, d)[layer], d.scores[layer], config.keep) for d in held) / len(held)
              for layer in range(len(layer_r2))]
    results = {"model": loaded.description, "documents": {s: {"fit": a, "heldout": b} for s, (a, b) in sources.items()},
               "fit_positions": fit.n, "heldout_positions": sum(d.positions for d in held),
               "train_cpu_seconds_per_thread": seconds, "threads": torch.get_num_threads(),
               "r2_per_layer": layer_r2, "recall_per_layer": recall,
               "r2_mean": sum(layer_r2) / len(layer_r2), "recall_mean": sum(recall) / len(recall),
               "weights": "kvzap/ (kvpress's KVzapModel: config.json + model.safetensors)",
               "parameters": sum(p.numel() for p in scorer.parameters())}
    return Result(results, tables={"table.md": table})


def table(r: dict) -> str:
    docs = ", ".join(f"{s} {v['fit']} + {v['heldout']}" for s, v in r["documents"].items())
    keep = r["config"]["keep"]
    lines = [f"KVzap's linear scorer for {r['model']}: {r['parameters']:,} parameters, fitted on {r['fit_positions']:,} "
             f"positions of dev documents (fit + held out: {docs}) in {r['train_cpu_seconds_per_thread']:.0f} s "
             f"(CPU time per thread, {r['threads']} threads: KVzip's targets and the fit). Held out "
             f"({r['heldout_positions']:,} positions): R^2 of the predicted log scores and the share of KVzip's kept "
             f"{keep:.0%} per head that the scorer's top {keep:.0%} recovers.", ""]
    rows = [[str(i), f"{a:.2f}", f"{b:.2f}"] for i, (a, b) in enumerate(zip(r["r2_per_layer"], r["recall_per_layer"]))]
    rows.append(["mean", f"{r['r2_mean']:.2f}", f"{r['recall_mean']:.2f}"])
    lines += markdown_table(["layer", "R^2 (log score)", f"recall of KVzip's top {keep:.0%}"], rows)
    return "\n".join(lines) + "\n"
