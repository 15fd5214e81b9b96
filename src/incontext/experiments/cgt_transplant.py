"""CGT Table 1's task-vector baseline (paper sec. 4.2): activation transplantation in the plain Transformer.

Do task vectors (Hendel et al. 2023) emerge in the baseline of cgt-table1? For every task of a held-out sequence,
the baseline reads the whole sequence; the residual stream after layer L at one token of the task's prompt
examples (E1) is taken as the task vector and written into a run of the task's measured examples (E2) alone
(positions from 0, as cgt-table1's no-prompt accuracy), at the same layer:

- "=": the vector at the '=' of E1's last example, written at the '=' of every E2 example (the token before each
  answer);
- "|": the vector at the '|' that ends E1, written at a '|' put before the E2 examples (position 0).

Reported: the answer-character accuracy on E2 by layer for each token, its best layer (the paper's "top
accuracies": 36.8% for "|", 40.7% for "=", against the baseline's 77.7% with the prompt), the baseline with the
prompt (cgt-table1's base accuracy) and without it (no prompt, no vector).

    incontext run cgt-transplant                      # CPU: cgt-table1's preset cpu, baselines of seeds 0 and 1
    incontext run cgt-transplant --set preset=paper   # 6 layers, 3 digits, 4 tasks (a GPU job)
    incontext run cgt-transplant --set reuse=true --out DIR   # DIR of a cgt-table1 run: its trained baselines reused
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..outputs import Result, markdown_table, pyplot
from ..stats import mean_3se
from ..tasks.arithmetic import CHAR_TO_ID
from ..tasks.base import Batch
from ..train import latest_checkpoint, load_for_eval
from ..train.cgt_metrics import TaskSpans, answer_scores, base_accuracy, specialized_accuracy
from ..train.fresh import finished_record, train_many
from .cgt_table1 import RECORD_EVAL_SEED, Table1Config, variant_settings
from .registry import register_experiment

TOKENS = ("=", "|")
PAPER = {"=": 40.7, "|": 36.8, "baseline with prompt": 77.7}  # Table 1's text and table, %


@dataclass
class TransplantConfig(Table1Config):
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    variants: list[str] = field(default_factory=lambda: ["baseline"])  # the baseline alone: its vectors are tested

    def __post_init__(self):
        super().__post_init__()
        if self.variants != ["baseline"]:
            raise ValueError("cgt-transplant tests the baseline's task vectors: leave variants at ['baseline']")


def layer_outputs(model, inputs: torch.Tensor) -> list[torch.Tensor]:
    """The residual stream after every block, (B, T, d) each."""
    seen: list[torch.Tensor] = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: seen.append(out[0].detach())) for block in model.blocks]
    try:
        model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def with_written(model, inputs: torch.Tensor, layer: int, positions: list[int], vector: torch.Tensor) -> torch.Tensor:
    """The model's output with the residual stream after block `layer` replaced at `positions` by `vector` (B, d)."""
    def write(_module, _inputs, out):
        x = out[0].clone()
        x[:, positions] = vector[:, None]
        return (x, *out[1:])

    hook = model.blocks[layer].register_forward_hook(write)
    try:
        return model(inputs)
    finally:
        hook.remove()


@torch.no_grad()
def transplant_accuracy(model, batch: Batch, spans: TaskSpans, digits: int) -> dict[str, list[float]]:
    """Answer-character accuracy on every task's E2 examples run alone with the task vector written, per token and
    layer ({token: [accuracy at layer 0, 1, ...]})."""
    answer_chars, eq = digits + 3, 2 * digits + 1  # '=' sits at offset 2d+1 of an example
    hidden = layer_outputs(model, batch.inputs)
    result = {}
    for token in TOKENS:
        per_layer = []
        for layer in range(len(model.blocks)):
            chars = []
            for k in range(spans.n_tasks):
                _, cut, end = spans.task(k)
                inputs, targets, mask = batch.inputs[:, cut:end], batch.targets[:, cut:end], batch.mask[:, cut:end]
                if token == "=":
                    vector = hidden[layer][:, cut - spans.example_len + eq]
                    positions = [j * spans.example_len + eq for j in range(spans.n_ex - spans.n_prompt)]
                else:  # a '|' before the examples, holding the vector of the '|' that ends E1
                    vector = hidden[layer][:, cut - 1]
                    bar = torch.full_like(inputs[:, :1], CHAR_TO_ID["|"])
                    inputs = torch.cat([bar, inputs], 1)
                    targets, mask = torch.cat([bar, targets], 1), torch.cat([torch.zeros_like(mask[:, :1]), mask], 1)
                    positions = [0]
                logits = with_written(model, inputs, layer, positions, vector)
                c, _ = answer_scores(logits, Batch(inputs, targets, mask, {}), torch.ones_like(mask), answer_chars)
                chars.append(c)
            per_layer.append(torch.cat(chars).mean().item())
        result[token] = per_layer
    return result


@register_experiment("cgt-transplant", "CGT Table 1's task-vector baseline: activation transplantation at '|' and '=' "
                     "in the plain Transformer", TransplantConfig)
def run(config: TransplantConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = {seed: variant_settings(config, "baseline", seed) for seed in config.seeds}
    run_dirs = {seed: out_dir / f"baseline-seed{seed}" for seed in config.seeds}
    trained = {seed: rec for seed in config.seeds if config.reuse and (rec := finished_record(run_dirs[seed], settings[seed]))}
    trained.update(train_many({s: (run_dirs[s], settings[s]) for s in config.seeds if s not in trained}, config.workers))
    runs = []
    for seed in config.seeds:
        model, train_config = load_for_eval(latest_checkpoint(run_dirs[seed] / "train"))
        task = train_config.build_task()
        batch = task.sample(config.eval_sequences, torch.Generator().manual_seed(RECORD_EVAL_SEED))
        spans, answer_chars = TaskSpans.of(task.config), task.config.digits + 3
        runs.append({"seed": seed, "seconds": trained[seed]["seconds"],
                     "with_prompt": base_accuracy(model, batch, spans, answer_chars)["char_accuracy"],
                     "no_prompt": specialized_accuracy(model, batch, spans, answer_chars, frozen=False)["char_accuracy"],
                     "transplant": transplant_accuracy(model, batch, spans, task.config.digits)})
    summary: dict[str, Any] = {key: list(mean_3se([r[key] for r in runs])) for key in ("with_prompt", "no_prompt")}
    for token in TOKENS:
        layers = len(runs[0]["transplant"][token])
        summary[token] = [list(mean_3se([r["transplant"][token][layer] for r in runs])) for layer in range(layers)]
        summary[f"{token} best"] = list(mean_3se([max(r["transplant"][token]) for r in runs]))
    results = {"resolved": config.resolved(), "runs": runs, "summary": summary, "paper": PAPER}
    return Result(results, tables={"table.md": table}, figures={"transplant.png": plot})


def table(results: dict) -> str:
    s, r = results["summary"], results["resolved"]

    def cell(pair) -> str:
        return f"{100 * pair[0]:.1f} +- {100 * pair[1]:.1f}"

    rows = [["baseline with the prompt (examples 1-2 in context)", cell(s["with_prompt"]), f"{PAPER['baseline with prompt']}"],
            ["no prompt (examples 1-2 dropped)", cell(s["no_prompt"]), ""]]
    for token in TOKENS:
        rows.append([f"task vector at '{token}', best layer per seed", cell(s[f"{token} best"]), f"{PAPER[token]}"])
        rows += [[f"  at '{token}', layer {i + 1}", cell(pair), ""] for i, pair in enumerate(s[token])]
    head = (f"CGT Table 1's transplantation baseline, cgt-table1's preset {results['config']['preset']}: {r['n_layer']} layers, "
            f"d {r['d_x']}, {r['digits']}-digit numbers, {r['n_tasks']} tasks x {r['n_ex']} examples, {r['steps']} steps; "
            f"answer-character accuracy on examples 3-4, mean +- 3 standard errors over "
            f"{len(results['runs'])} seeds ({', '.join(str(x['seed']) for x in results['runs'])}).")
    return "\n".join([head, "", *markdown_table(["baseline Transformer", "ours (%)", "paper (%)"], rows)])


def plot(results: dict):
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    s = results["summary"]
    for token, color in zip(TOKENS, ("tab:blue", "tab:orange")):
        layers = range(1, len(s[token]) + 1)
        ax.errorbar(layers, [100 * m for m, _ in s[token]], yerr=[100 * e for _, e in s[token]], marker="o",
                    color=color, capsize=3, label=f"task vector at '{token}' (paper best {PAPER[token]}%)")
    ax.axhline(100 * s["with_prompt"][0], color="tab:green", ls="--", label="with the prompt")
    ax.axhline(100 * s["no_prompt"][0], color="gray", ls=":", label="no prompt")
    ax.set(xlabel="layer written", ylabel="answer-character accuracy (%)", ylim=(0, 100),
           title="task-vector transplantation in the baseline")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
