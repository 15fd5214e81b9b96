"""ICLCA Table 1 analogue: exactness of the prompt-to-bias conversion in float32 as the model grows.

Linear-attention transformers with RoPE, width 128, vocabulary 52, tied embeddings, 4x MLP, depth 1 to 1000
(the paper's sizes: 205K to 198M parameters); random weights; random prompt/query pairs. Relative error
||logits_converted - logits_prompted||_F / ||logits_prompted||_F per pair, then the mean (and the max).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..absorb import ICLCA
from ..models import Transformer, TransformerConfig
from ..outputs import Result, markdown_table
from .registry import register_experiment

# Paper Table 1 (float32, linear attention + RoPE): parameters -> mean relative logits error
PAPER = {1: ("205K", 2.9e-7), 10: ("1.99M", 4.4e-7), 100: ("19.8M", 8.3e-7), 1000: ("198M", 1.7e-6), 10000: ("1.98B", 4.3e-6)}


@dataclass
class Table1Config:
    depths: list[int] = field(default_factory=lambda: [1, 10, 100, 1000])
    d_model: int = 128
    n_head: int = 4
    vocab_size: int = 52
    feature_map: str = "elu"
    pairs: int = 100
    prompt_len: int = 32
    query_len: int = 32
    seed: int = 0


def relative_errors(converted: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per pair (batch row): Frobenius norm of the difference over positions x vocabulary, relative."""
    return (converted - reference).flatten(1).norm(dim=1) / reference.flatten(1).norm(dim=1)


@register_experiment("iclca-table1", "ICLCA Table 1: float32 exactness of prompt-to-bias conversion, depth 1 to 1000", Table1Config)
def run(config: Table1Config, out_dir: Path) -> Result:
    g = torch.Generator().manual_seed(config.seed)
    prompts = torch.randint(0, config.vocab_size, (config.pairs, config.prompt_len), generator=g)
    queries = torch.randint(0, config.vocab_size, (config.pairs, config.query_len), generator=g)
    rows = []
    for depth in config.depths:
        torch.manual_seed(config.seed + depth)
        model = Transformer(TransformerConfig(
            vocab_size=config.vocab_size, n_layer=depth, d_model=config.d_model, n_head=config.n_head,
            attention="linear", feature_map=config.feature_map, positions="rope", tie_embeddings=True,
            max_seq_len=config.prompt_len + config.query_len,
        )).eval()
        start = time.perf_counter()
        with torch.no_grad():
            reference = model(torch.cat([prompts, queries], 1))[:, config.prompt_len:]
            converted = ICLCA().absorb(model, prompts)(queries)
        errors = relative_errors(converted, reference)
        paper = PAPER.get(depth, ("-", None))
        rows.append({"depth": depth, "parameters": model.num_parameters(), "mean_rel_error": float(errors.mean()),
                     "max_rel_error": float(errors.max()), "paper_parameters": paper[0], "paper_rel_error": paper[1],
                     "seconds": round(time.perf_counter() - start, 1)})
        print(f"depth {depth}: {rows[-1]['parameters']:,} parameters, mean relative error {rows[-1]['mean_rel_error']:.2e}")
        del model, reference, converted
    return Result({"dtype": "float32", "rows": rows}, {"table.md": table})


def table(results: dict) -> str:
    lines = markdown_table(["depth", "parameters (ours)", "relative logits error, mean (max)", "paper: parameters", "paper: error"], [
        [r["depth"], f"{r['parameters']:,}", f"{r['mean_rel_error']:.1e} ({r['max_rel_error']:.1e})", r["paper_parameters"],
         f"{r['paper_rel_error']:.1e}" if r["paper_rel_error"] else "-"] for r in results["rows"]])
    return "\n".join(lines) + "\n"
