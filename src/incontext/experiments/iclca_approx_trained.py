"""ICLCA sec. 6.4 on a small GPT-2-style model trained here: approximate conversion (FAVOR+) of a prompt for
softmax attention, on held-out Shakespeare text.

Trains (through the ordinary trainer) a GPT-2-style model (learned positions, LayerNorm, tanh-GELU, tied head)
on the training plays with a byte-level BPE trained on them, then for pairs of consecutive held-out passages
measures the relative logits error against the prompted model of the query without the prompt and after
absorbing the prompt into m random features. Paper (pretrained GPT-2): 16.56% -> 9.17%.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..outputs import Result
from ..tasks.episodes import get_episode_source
from ..train.fresh import train_fresh
from .common import GPT2_ADAMW, GPT2_BLOCK, TrainedModelOptions
from .iclca_approx import approximation_errors, error_table
from .registry import register_experiment


@dataclass
class TrainedApproxConfig(TrainedModelOptions):
    vocab_size: int = 2048
    seq_len: int = 128
    pairs: int = 50
    prompt_tokens: int = 96
    features: list[int] = field(default_factory=lambda: [64, 256, 1024])
    exact_sinks: list[int] = field(default_factory=lambda: [0, 1])


@register_experiment("iclca-approx-trained", "ICLCA approximate conversion on a GPT-2-style model trained here on Shakespeare", TrainedApproxConfig)
def run(config: TrainedApproxConfig, out_dir: Path) -> Result:
    task = {"name": "shakespeare", "vocab_size": config.vocab_size, "seq_len": config.seq_len}
    model, train_config, trained = train_fresh(out_dir, config.train_config(task, model=GPT2_BLOCK, optimizer=GPT2_ADAMW))
    task = train_config.build_task()
    g = torch.Generator().manual_seed(config.seed + 7)
    windows = task.validation_windows(config.pairs, g)[:, : config.seq_len]
    with torch.no_grad():
        logits = model(windows[:, :-1])
        validation_loss = float(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten()))
    m_prompt = config.prompt_tokens
    source = get_episode_source("continuation", prompt_tokens=m_prompt, query_tokens=config.seq_len - m_prompt + 1,
                                passages="task")  # + 1: the windows' last token, so the query's inputs are ids[m_prompt:seq_len]
    episodes = source.episodes(config.pairs, config.seed + 7, task=task)  # the windows above, cut at the prompt
    summary = approximation_errors(model, source, episodes, config.features, config.exact_sinks, config.seed)
    results = {"parameters": model.num_parameters(), "train_eval_loss": trained["eval"].get("loss"),
               "validation_loss": validation_loss, "relative_logits_error": summary,
               "paper_gpt2": {"without prompt": 0.1656, "converted": 0.0917}}
    head = (f"GPT-2-style model, {config.n_layer} layers, width {config.d_model}, {model.num_parameters():,} parameters, "
            f"{config.steps} steps; held-out loss {validation_loss:.3f}. Prompt {m_prompt} tokens, query "
            f"{config.seq_len - m_prompt} tokens, {config.pairs} held-out pairs.")
    return Result(results, {"table.md": lambda r: "\n".join([head, "", *error_table(summary)])})
