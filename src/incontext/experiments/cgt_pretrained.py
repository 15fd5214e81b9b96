"""CGT on a pretrained LM: a context stream and low-rank generators over frozen SmolLM2 (models/cgt_adapter.py),
trained on BBC News + Shakespeare mixtures, then a context frozen from a 64-token prefix and the prefix dropped.

Training (both runs resumable: killed and re-run with the same settings, each continues from its last safetensors
checkpoint under out/train/<name>, bit-identically, since a step's data and cut points depend on (seed, step) only):
- `cgt`: the adapter's guide (y blocks + generators) on the paper's objective, CE + auxiliary truncation loss
  + R_C/R_D (eta, aux_cuts, w_c, w_d), on two documents joined at a random cut (the mixtures of
  tasks/topic_mixture.py, tokenised by SmolLM2's own tokenizer);
- `lora`: the fair baseline, a LoRA on the same projections of the same blocks (q/k/v, gate/up of the guided
  blocks) with about the guide's parameter count, trained on plain CE on the same batches, without a context stream.
The frozen base never changes. This loop reuses the trainer's optimizer, schedule and checkpoint functions rather than
`incontext train`: its model builder cannot load SmolLM2 (train sits below interop in the layering).

Evaluation on held-out documents (every 10th of each topic, never trained on): the first `prefix` tokens are the
prompt, the next `scored` tokens are scored. Per-position CE of: the base without / with the prefix; the CGT
specialised (y frozen at the prefix's end, prefix dropped: the folded model), with y of another document, dynamic
without / with the prefix; the LoRA without / with the prefix. Paired differences per document with 95%
t-intervals. Also: 5-NN topic accuracy of the frozen y (and, for reference, of the base's mean last hidden state
over the prefix), and a collapse check (spread of y across documents vs within a document). The trained guide is
saved to out/adapter (for `cgt-fold` with adapter=...), and one document's context to out/peft-example as a PEFT
LoRA adapter for transformers' LlamaForCausalLM, checked against the adapter's logits.

    incontext run cgt-pretrained [--set steps=400 --set batch_size=8]
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..absorb.methods.distill_lora import DistilledLoRA
from ..absorb.lora import LoRASpec, init_lora_factors
from ..config import check_choices, to_dict
from ..models import CGTAdapter, CGTAdapterConfig, Transformer
from ..outputs import Result, pyplot
from ..stats import t_interval95
from ..tasks.topic_mixture import topic_documents
from ..train import OptimizerConfig, ScheduleConfig, latest_checkpoint, lr_at, save_checkpoint
from ..train.checkpoint import load_training_state, read_state
from ..train.trainer import build_optimizer, truncate_metrics
from .cgt_text import knn_topic_accuracy
from .common import CGTGuideOptions, check_settings
from .registry import register_experiment


@dataclass
class PretrainedConfig(CGTGuideOptions):
    model: str = "smollm2"  # the frozen base (see interop/models.py)
    split_layer: int = 24  # l: blocks l.. (of SmolLM2's 30) are guided
    n_y_blocks: int = 2
    d_y: int = 64
    n_head_y: int = 4
    mixing: Literal["tanh", "softmax"] = "tanh"
    w_c: float = 0.04  # paper's text setting
    w_d: float = 0.02
    seq_len: int = 128  # training sequences: document 1 cut at U[cut_lo, cut_hi] tokens, then document 2
    cut_lo: int = 48
    cut_hi: int = 80
    max_doc_tokens: int = 512  # documents are truncated to this many tokens
    steps: int = 100
    batch_size: int = 4
    lr: float = 3e-3
    warmup_steps: int = 10
    lora_rank: int = 0  # 0: the rank whose parameter count is closest to the guide's
    checkpoint_every: int = 25
    prefix: int = 64  # prompt tokens read before y is frozen
    scored: int = 64  # tokens scored after the prefix
    eval_docs_per_topic: int = 10
    eval_batch_size: int = 8
    corpus_docs: int = 0  # documents per topic; 0 = all (small values make quick tests)

    def __post_init__(self):
        check_settings(self, counts=("split_layer", "n_y_blocks", "d_y", "n_head_y", "rank", "n_templates", "seq_len",
                                     "max_doc_tokens", "steps", "batch_size", "checkpoint_every", "prefix", "scored",
                                     "eval_docs_per_topic", "eval_batch_size"), rates=("lr",))
        check_choices(self)


# ----------------------------------------------------------------------------- data


def split_documents(encode: Callable[[str], list[int]], corpus_docs: int, max_tokens: int) -> tuple[list[str], dict]:
    """(topics, {"train" | "validation": [(topic id, ids)]}): every 10th document of a topic is held out, as in
    tasks/topic_mixture.py; ids are the first max_tokens tokens of the base's own tokenizer."""
    docs = topic_documents(True, 2500, 500, corpus_docs)
    split: dict[str, list[tuple[int, torch.Tensor]]] = {"train": [], "validation": []}
    for t, topic in enumerate(docs):
        for i, text in enumerate(docs[topic]):
            ids = torch.tensor(encode(text[: 8 * max_tokens])[:max_tokens], dtype=torch.int64)
            split["validation" if i % 10 == 9 else "train"].append((t, ids))
    return list(docs), split


def joined_batch(docs: list[tuple[int, torch.Tensor]], batch: int, seq_len: int, cut: tuple[int, int],
                 generator: torch.Generator) -> torch.Tensor:
    """(batch, seq_len + 1) ids: a document cut at U[cut] tokens, then others (random, any topic) until full."""
    rows = []
    for _ in range(batch):
        first = docs[int(torch.randint(len(docs), (1,), generator=generator))][1]
        pieces = [first[: int(torch.randint(cut[0], cut[1] + 1, (1,), generator=generator))]]
        while sum(len(p) for p in pieces) < seq_len + 1:
            pieces.append(docs[int(torch.randint(len(docs), (1,), generator=generator))][1])
        rows.append(torch.cat(pieces)[: seq_len + 1])
    return torch.stack(rows)


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


# ----------------------------------------------------------------------------- training


def train_resumable(trainable: nn.Module, step_loss: Callable[[int], tuple[torch.Tensor, dict]], run_dir: Path,
                    record: dict, config: PretrainedConfig, label: str) -> list[dict]:
    """Train `trainable`'s parameters for config.steps AdamW steps (warmup + cosine, gradient clipping at 1) with
    checkpoints of `trainable` alone; continues from the last checkpoint when `record` (the settings) matches,
    starts over when it does not. Returns the per-step log."""
    optimizer_config = OptimizerConfig(lr=config.lr, weight_decay=0.0, grad_clip=1.0)
    schedule = ScheduleConfig(total_steps=config.steps, warmup_steps=config.warmup_steps)
    optimizer = build_optimizer(trainable, optimizer_config)
    log_path = run_dir / "metrics.jsonl"
    checkpoint, start = latest_checkpoint(run_dir), 0
    if checkpoint is not None and read_state(checkpoint)["config"] == record:
        start = load_training_state(checkpoint, trainable, optimizer)["step"]
        truncate_metrics(run_dir, start)  # steps logged after the checkpoint will be logged again
        if start < config.steps:
            print(f"{label}: resuming at step {start} from {checkpoint.name}", flush=True)
    elif run_dir.exists():
        shutil.rmtree(run_dir)  # an earlier run with other settings (the experiment's own folder)
    run_dir.mkdir(parents=True, exist_ok=True)
    params = [p for p in trainable.parameters() if p.requires_grad]
    started = time.perf_counter()
    for step in range(start, config.steps):
        lr = lr_at(step, optimizer_config, schedule)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss, parts = step_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, optimizer_config.grad_clip))
        loss = loss.detach()
        if not math.isfinite(float(loss)) or not math.isfinite(grad_norm):
            raise FloatingPointError(f"{label}: non-finite loss or gradient at step {step + 1}")
        optimizer.step()
        entry = {"step": step + 1, "loss": float(loss), "lr": lr, "grad_norm": grad_norm, **parts,
                 "seconds": time.perf_counter() - started}
        with log_path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        if (step + 1) % 10 == 0 or step + 1 == config.steps:
            print(f"{label} step {step + 1}/{config.steps}: " + ", ".join(f"{k} {v:.4g}" for k, v in entry.items()
                                                                        if k not in ("step", "lr")), flush=True)
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            save_checkpoint(run_dir, step + 1, trainable, optimizer, record, keep=1)
    return [json.loads(line) for line in log_path.read_text().splitlines()]


def next_token_ce(logits: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor | None = None) -> torch.Tensor:
    """Mean CE of logits (B, T, V) against targets (B, T) over `scored` (B, T) positions (all when None)."""
    if scored is None:
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    if not bool(scored.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[scored].float(), targets[scored])


def lora_baseline(base: Transformer, layers: list[int], target_params: int, rank: int, seed: int) -> DistilledLoRA:
    """A LoRA (scaling 1) on q/k/v and gate/up of `layers` of a copy of base; rank `rank`, or (0) the rank whose
    parameter count is closest to target_params."""
    import copy

    modules = tuple(f"blocks.{i}.{m}" for i in layers for m in ("attn.qkv", "mlp.fc_in"))
    per_rank = sum(base.get_submodule(m).in_features + base.get_submodule(m).out_features for m in modules)
    rank = rank or max(1, round(target_params / per_rank))
    lora = DistilledLoRA(copy.deepcopy(base), LoRASpec(rank, float(rank), modules), offset=0, merged=False)
    with torch.no_grad():
        init_lora_factors(lora.lora_factors().values(), torch.Generator().manual_seed(seed))
    return lora


def lora_layers(lora: DistilledLoRA) -> nn.ModuleDict:
    """The LoRA factors alone as one module (what its checkpoints hold)."""
    return nn.ModuleDict({name.replace(".", "_"): nn.ModuleList([lora.base.get_submodule(name).lora_A["default"],
                                                                   lora.base.get_submodule(name).lora_B["default"]])
                          for name in lora.spec.modules})


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def per_position_ce(adapter: CGTAdapter, lora: DistilledLoRA, docs: list[torch.Tensor],
                    config: PretrainedConfig) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """CE (documents x scored positions) per condition; y at the prefix's end (documents x d_y) and the base's
    mean final hidden state over the prefix (documents x d_model)."""
    p, n = config.prefix, config.scored
    base = adapter.base
    out: dict[str, list[torch.Tensor]] = {}
    contexts, hidden = [], []
    for start in range(0, len(docs), config.eval_batch_size):
        tokens = torch.stack([d[: p + n + 1] for d in docs[start : start + config.eval_batch_size]])
        full, rest, targets = tokens[:, :-1], tokens[:, p:-1], tokens[:, p + 1 :]
        y = adapter.context(tokens[:, :p])[:, -1]
        other = y.roll(len(y) // 2, dims=0)  # another document's context (a different one for batches > 1)
        logits_full, states = base(full, return_hidden=True)
        runs = {
            "base, no prefix": lambda: base(rest),
            "base, with prefix": lambda: logits_full[:, p:],
            "CGT specialised (y frozen from the prefix, prefix dropped)": lambda: adapter(rest, y=y),
            "CGT, y of another document": lambda: adapter(rest, y=other),
            "CGT dynamic, no prefix": lambda: adapter(rest),
            "CGT dynamic, with prefix": lambda: adapter(full)[:, p:],
            "LoRA (no context stream), no prefix": lambda: lora(rest),
            "LoRA (no context stream), with prefix": lambda: lora.base(full)[:, p:],
        }
        for name, run in runs.items():
            ce = F.cross_entropy(run().transpose(1, 2).float(), targets, reduction="none")
            out.setdefault(name, []).append(ce)
        contexts.append(y)
        hidden.append(states[:, :p].mean(1))
    return ({k: torch.cat(v).numpy() for k, v in out.items()}, torch.cat(contexts).numpy(), torch.cat(hidden).numpy())


@torch.no_grad()
def collapse_check(adapter: CGTAdapter, docs: list[torch.Tensor], prefix: int, last: int = 32) -> dict[str, float]:
    """Spread of n = y/|y| over the last `last` prefix positions: within a document (mean squared distance to the
    document's mean) and across documents (of the documents' means around their grand mean); and the mean cosine
    of two different documents' y at the prefix's end. Collapse: across ~ 0 and cosine ~ 1."""
    y = torch.cat([adapter.context(torch.stack([d[:prefix] for d in docs[i : i + 8]]))[:, -last:]
                   for i in range(0, len(docs), 8)])
    n = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    means = n.mean(1)
    within = float((n - means[:, None]).square().sum(-1).mean())
    across = float((means - means.mean(0)).square().sum(-1).mean())
    ends = n[:, -1]
    cos = ends @ ends.T
    pairs = len(docs) * (len(docs) - 1)
    return {"within_document": within, "across_documents": across, "across_over_within": across / max(within, 1e-12),
            "mean_cosine_between_documents": float((cos.sum() - cos.diagonal().sum()) / max(pairs, 1))}


def paired(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """Mean over documents of (a - b) (each document's mean CE over its scored positions), with a 95% interval."""
    return t_interval95((a.mean(1) - b.mean(1)).tolist())


@torch.no_grad()
def export_example(adapter: CGTAdapter, prompt: torch.Tensor, query: torch.Tensor, folder: Path) -> dict[str, float]:
    """One document's context as a PEFT adapter on LlamaForCausalLM; max |logit difference| to the adapter."""
    from peft import PeftModel

    from ..absorb.methods.cgt_fold.export import save_llama_adapter
    from ..interop.hf import to_hf_llama

    y = adapter.context(prompt[None])[0, -1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft: merging is impossible on bias-free layers (we never merge)
        save_llama_adapter(adapter, y, folder)
        hf = PeftModel.from_pretrained(to_hf_llama(adapter.base).eval(), folder).eval()
        got = hf(query[None]).logits
    expected = adapter(query[None], y=y[None])
    return {"max_abs_logit_difference": float((got - expected).abs().max()),
            "logit_scale": float(expected.abs().max()), "adapter_bytes": sum(p.stat().st_size for p in folder.iterdir())}


# ----------------------------------------------------------------------------- the experiment


@register_experiment("cgt-pretrained", "CGT adapter over frozen SmolLM2: context from a 64-token prefix folded into "
                     "a LoRA, vs no prefix, prompted, and a same-size LoRA", PretrainedConfig)
def run(config: PretrainedConfig, out_dir: Path) -> Result:
    from ..interop.models import load_model

    loaded = load_model(config.model)
    if loaded.tokenizer is None:
        raise ValueError(f"cgt-pretrained needs a text model with a tokenizer; {config.model!r} has none")
    return run_on(loaded.model, loaded.tokenizer.encode, config, out_dir, loaded.description)


def run_on(base: Transformer, encode: Callable[[str], list[int]], config: PretrainedConfig, out_dir: Path,
           description: str = "") -> Result:
    """The experiment on a given frozen base and its tokenizer's encode (tests pass a tiny random base); its
    Result, which the registry writes (with the experiment's name and config) next to the training it left in
    out_dir (train/, adapter/, peft-example/)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    topics, split = split_documents(encode, config.corpus_docs, config.max_doc_tokens)
    train_docs = [d for d in split["train"] if len(d[1]) > 8]
    if not train_docs:
        raise ValueError("no training documents")
    adapter_config = CGTAdapterConfig(split_layer=config.split_layer, n_y_blocks=config.n_y_blocks, d_y=config.d_y,
                                      n_head_y=config.n_head_y, rank=config.rank, n_templates=config.n_templates,
                                      mixing=config.mixing, loss=config.loss_section())
    adapter = CGTAdapter(base, adapter_config, generator=torch.Generator().manual_seed(config.seed))
    lora = lora_baseline(base, [i for i, _, _ in adapter.guided_layers()], adapter.num_trainable(), config.lora_rank,
                         config.seed)
    record = {"experiment": "cgt-pretrained", "config": dataclasses.asdict(config),
              "base": to_dict(base.config)}

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = joined_batch(train_docs, config.batch_size, config.seq_len, (config.cut_lo, config.cut_hi),
                              step_generator(config.seed, step))
        return tokens[:, :-1], tokens[:, 1:]

    def cgt_step(step: int):
        inputs, targets = batch(step)
        return adapter.training_loss(inputs, lambda out, scored: next_token_ce(out, targets, scored),
                                     step_generator(config.seed + 1, step))

    def lora_step(step: int):
        inputs, targets = batch(step)
        loss = next_token_ce(lora(inputs), targets)
        return loss, {"loss_task": float(loss.detach())}

    timings = {}
    adapter.train()
    started = time.perf_counter()
    cgt_log = train_resumable(adapter.guide, cgt_step, out_dir / "train" / "cgt", {**record, "run": "cgt"}, config, "cgt")
    timings["cgt_train_seconds_this_call"] = time.perf_counter() - started
    started = time.perf_counter()
    lora_log = train_resumable(lora_layers(lora), lora_step, out_dir / "train" / "lora", {**record, "run": "lora"}, config,
                               "lora")
    timings["lora_train_seconds_this_call"] = time.perf_counter() - started
    adapter.eval()
    lora.eval()
    adapter.save_guide(out_dir / "adapter")

    started = time.perf_counter()
    need = config.prefix + config.scored + 1
    held_out = []
    for t in range(len(topics)):
        held_out += [(t, ids) for topic, ids in split["validation"] if topic == t and len(ids) >= need][: config.eval_docs_per_topic]
    if len(held_out) < 2:
        raise ValueError(f"fewer than 2 held-out documents have {need} tokens")
    labels, docs = [t for t, _ in held_out], [ids for _, ids in held_out]
    ce, y_end, hidden = per_position_ce(adapter, lora, docs, config)
    timings["eval_seconds"] = time.perf_counter() - started
    reference = "base, no prefix"
    special = "CGT specialised (y frozen from the prefix, prefix dropped)"
    comparisons = {f"{special} - {other}": paired(ce[special], ce[other]) for other in ce if other != special}
    comparisons["LoRA (no context stream), no prefix - base, no prefix"] = paired(ce["LoRA (no context stream), no prefix"],
                                                                                  ce[reference])
    results = {
        "base": description,
        "topics": topics, "documents": {"train": len(train_docs), "evaluated": len(docs),
                                        "per_topic": {topics[t]: labels.count(t) for t in sorted(set(labels))}},
        "parameters": {"cgt_guide": adapter.num_trainable(),
                       "lora": sum(p.numel() for p in lora_layers(lora).parameters()), "lora_rank": lora.spec.rank,
                       "guided_blocks": [i for i, _, _ in adapter.guided_layers()]},
        "training": {"cgt": cgt_log[-1] if cgt_log else {}, "lora": lora_log[-1] if lora_log else {},
                     "cgt_first": cgt_log[0] if cgt_log else {}, "lora_first": lora_log[0] if lora_log else {},
                     **timings},
        "ce": {name: {"per_document": t_interval95(v.mean(1).tolist()), "per_position": v.mean(0).tolist()}
               for name, v in ce.items()},
        "differences": comparisons,
        "y": {"knn_topic_accuracy": knn_topic_accuracy(y_end, labels),
              "knn_topic_accuracy_base_hidden_mean": knn_topic_accuracy(hidden, labels),
              "chance": max(labels.count(t) for t in set(labels)) / len(labels),
              "collapse": collapse_check(adapter, docs, config.prefix)},
        "export": export_example(adapter, docs[0][: config.prefix], docs[0][config.prefix : need - 1],
                                 out_dir / "peft-example"),
    }
    key = f"{special} - {reference}"
    results["acceptance"] = {"specialised_below_no_prefix": bool(comparisons[key]["high"] < 0), "difference": comparisons[key]}
    return Result(results, tables={"table.md": table}, figures={"cgt_pretrained.png": plot})


def table(results: dict) -> str:
    c, p = results["config"], results["parameters"]
    t = results["training"]
    lines = [
        (f"CGT adapter over frozen {results['base'] or 'base'}: y blocks beside blocks {c['split_layer'] - c['n_y_blocks']}.."
         f"{c['split_layer'] - 1}, generators (r {c['rank']}, M {c['n_templates']}, {c['mixing']}) on blocks "
         f"{p['guided_blocks'][0]}..{p['guided_blocks'][-1]}; {p['cgt_guide']:,} trained parameters vs a LoRA of rank "
         f"{p['lora_rank']} ({p['lora']:,}) on the same projections. {c['steps']} steps of {c['batch_size']} x "
         f"{c['seq_len']} tokens each (eta {c['eta']}, w_C {c['w_c']}, w_D {c['w_d']}); training CE (dynamic pass) "
         f"{t['cgt_first'].get('loss_task', float('nan')):.3f} -> {t['cgt'].get('loss_task', float('nan')):.3f}, LoRA "
         f"{t['lora_first'].get('loss_task', float('nan')):.3f} -> {t['lora'].get('loss_task', float('nan')):.3f}."),
        "",
        (f"Held-out documents: {results['documents']['evaluated']} ({', '.join(f'{k} {v}' for k, v in results['documents']['per_topic'].items())}); "
         f"CE (nats/token) over the {c['scored']} tokens after a {c['prefix']}-token prefix, mean over documents with 95% interval."),
        "",
        "| condition | CE | 95% interval |",
        "|---|---|---|",
    ]
    for name, entry in results["ce"].items():
        d = entry["per_document"]
        lines.append(f"| {name} | {d['mean']:.4f} | [{d['low']:.4f}, {d['high']:.4f}] |")
    lines += ["", "| paired difference (per document) | mean | 95% interval |", "|---|---|---|"]
    for name, d in results["differences"].items():
        lines.append(f"| {name} | {d['mean']:+.4f} | [{d['low']:+.4f}, {d['high']:+.4f}] |")
    y = results["y"]
    col = y["collapse"]
    knn = "–" if y["knn_topic_accuracy"] is None else f"{y['knn_topic_accuracy']:.3f}"
    knn_base = "–" if y["knn_topic_accuracy_base_hidden_mean"] is None else f"{y['knn_topic_accuracy_base_hidden_mean']:.3f}"
    e = results["export"]
    lines += ["",
              f"y at the prefix's end: 5-NN topic accuracy {knn} (the base's mean final hidden state over the prefix: "
              f"{knn_base}; majority class {y['chance']:.3f}). Collapse check on n = y/|y| over the last 32 prefix positions: "
              f"spread across documents {col['across_documents']:.4f} vs within a document {col['within_document']:.4f} "
              f"(ratio {col['across_over_within']:.2f}); mean cosine between documents {col['mean_cosine_between_documents']:.3f}.",
              "",
              f"Export: one document's context as a PEFT LoRA adapter ({e['adapter_bytes']:,} bytes) on transformers' "
              f"LlamaForCausalLM; max |logit difference| to the adapter {e['max_abs_logit_difference']:.2e} "
              f"(logits up to {e['logit_scale']:.1f}).",
              f"Specialised CE below no-prefix CE with the interval excluding zero: {results['acceptance']['specialised_below_no_prefix']}."]
    return "\n".join(lines) + "\n"


def plot(results: dict):
    fig, axes = pyplot().subplots(1, 2, figsize=(13, 4.5))
    base = np.array(results["ce"]["base, no prefix"]["per_position"])
    smooth = np.ones(4) / 4
    for name, entry in results["ce"].items():
        if name != "base, no prefix":
            axes[0].plot(np.convolve(np.array(entry["per_position"]) - base, smooth, mode="valid"), label=name)
    axes[0].axhline(0, color="gray", lw=0.6)
    axes[0].set(xlabel="position after the prefix", ylabel="CE minus CE of the base without prefix (nats)",
                title="per-position CE (smoothed over 4)")
    axes[0].legend(fontsize=6)
    names = list(results["ce"])
    means = [results["ce"][n]["per_document"]["mean"] for n in names]
    errors = [[m - results["ce"][n]["per_document"]["low"] for n, m in zip(names, means)],
              [results["ce"][n]["per_document"]["high"] - m for n, m in zip(names, means)]]
    axes[1].barh(range(len(names)), means, xerr=errors, color="tab:blue")
    axes[1].set_yticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=6)
    axes[1].set_xlim(min(means) - 0.3, max(means) + 0.3)
    axes[1].set(xlabel="CE per document (nats), 95% interval", title="held-out documents")
    fig.tight_layout()
    return fig
