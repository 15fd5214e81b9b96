"""TinT Table 3: simulator parameter counts from the paper's formula for OPT-125M/350M/1.3B/2.7B next to the
printed numbers, the same counts from a TinT parameter tree built on the meta device for a GPT-2-small-sized
auxiliary model, and one simulated SGD step of such a TinT (random weights) on a short sequence on CPU,
checked against R-approx (plain torch with TinT's gradient rules) and compared with exact SGD.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..models import Transformer, TransformerConfig
from ..tint import TinT, TintConfig, sgd_reference
from ..tint.counting import (
    OPT_MODELS,
    PAPER_TABLE3,
    module_rows,
    paper_sizes,
    transformer_counts,
)
from ..outputs import Result, markdown_table
from ..tint.hsplit import build_parameter_tree, count_weights
from ..tint.reference import compare_with_exact
from .registry import register_experiment


@dataclass
class Table3Config:
    d_model: int = 768  # GPT-2 small
    n_layer: int = 12
    n_head: int = 12
    vocab_size: int = 50257
    t_aux: int = 2048  # context length the position maps are sized for (Table 3's T_aux)
    rows_per_prefix: int = 3  # D_sim = 4 D_aux with the bias slot, H_sim = 12 (OPT-125M's setting)
    shards: int = 3
    run_step: bool = True  # build the simulator for real and run one step
    run_tokens: int = 16
    run_train: int = 10
    learning_rate: float = 1e-3
    dtype: str = "float64"
    seed: int = 0


def _billions(n: int) -> float:
    return round(n / 1e9, 3)


@register_experiment("tint-table3", "TinT Table 3: simulator sizes (formula, built on meta) and a GPT-2-small-sized simulated step", Table3Config)
def run(config: Table3Config, out_dir: Path) -> Result:
    formula = {name: {k: _billions(v) for k, v in transformer_counts(*OPT_MODELS[name]).items()} for name in OPT_MODELS}
    tint_config = TintConfig(rows_per_prefix=config.rows_per_prefix, shards=config.shards, learning_rate=config.learning_rate)
    from ..tint.modules import Layout

    layout = Layout(config.d_model, tint_config)
    tree = build_parameter_tree(layout, config.n_layer, config.t_aux, device="meta")
    built = {op: sum(count_weights(module[key]) for layer in tree.values() for module in layer.values() if key in module)
             for op, key in (("forward", "fwd"), ("backward", "bwd"), ("descent", "descent"))}
    built["total"] = sum(built.values())
    sizes = paper_sizes(config.d_model, layout.n_heads, config.t_aux, k=layout.K)
    rows = module_rows(sizes)
    L = config.n_layer
    ours_formula = {"forward": (7 * sizes.q + sizes.q_split) * L, "backward": (8 * sizes.q + 6 * sizes.dh) * L,
                    "descent": 6 * sizes.q * L}
    ours_formula["total"] = sum(ours_formula.values())
    results = {"formula_billions": formula,
               "paper_billions": PAPER_TABLE3,
               "gpt2_small_layout": {"d_sim": layout.d_sim, "h_sim": layout.n_heads, "K": layout.K, "t_sim": layout.K + config.t_aux},
               "gpt2_small_built_meta": built, "gpt2_small_formula": ours_formula,
               "module_rows_per_layer": rows}
    if config.run_step:
        results["step"] = simulated_step(config, tint_config)
    return Result(results, {"table.md": table})


def simulated_step(config: Table3Config, tint_config: TintConfig) -> dict:
    dtype = getattr(torch, config.dtype)
    torch.manual_seed(config.seed)
    model = Transformer(TransformerConfig(n_layer=config.n_layer, n_head=config.n_head, d_model=config.d_model,
                                          vocab_size=config.vocab_size, max_seq_len=1024)).to(dtype).eval()
    ids = torch.randint(0, config.vocab_size, (config.run_tokens,), generator=torch.Generator().manual_seed(config.seed))
    start = time.perf_counter()
    sim = TinT(model, tint_config)
    prefix_numbers = sum(p.numel() for p in sim.initial_prefixes().values())
    with torch.no_grad():
        logits, banks, losses = sim.simulate(ids, config.run_train)
    seconds = time.perf_counter() - start
    ref_logits, ref_state, _ = sgd_reference(model, ids, config.run_train, tint_config, rules="approx")
    read = sim.read_weights(banks)
    weight_error = max(float((v - ref_state[k]).norm() / ref_state[k].norm().clamp_min(1e-300)) for k, v in read.items())
    logits_error = float((logits - ref_logits).norm() / ref_logits.norm())
    del sim, banks, ref_state  # keep the peak memory down before the exact reference
    state = {**model.state_dict(), **read}
    exact = compare_with_exact(model, ids, config.run_train, tint_config, logits, state)
    return {"seconds_build_and_simulate": round(seconds, 2), "prefix_embedding_numbers": prefix_numbers,
            "training_loss_before": float(losses[0]),
            "logits_rel_error_vs_r_approx": logits_error,
            "max_weight_rel_error_vs_r_approx": weight_error, "vs_r_exact": exact}


def _verdict(formula: dict, paper: list) -> str:
    """"" where every part and the total round to the paper's (one decimal), else which differ by how much."""
    ours = [formula["forward"], formula["backward"], formula["descent"], formula["total_sum"]]
    off = [f"{name} {round(o, 1)} vs {p}" for name, o, p in zip(("F", "B", "D", "total"), ours, paper) if round(o, 1) != p]
    return "" if not off else f" (differs: {', '.join(off)})"


def table(results: dict) -> str:
    lines = [("Simulator parameters (billions, biases ignored): formula (forward / backward / descent / sum of the three)"
             " vs the paper's Table 3"), ""]
    lines += markdown_table(["auxiliary", "forward", "backward", "descent", "total", "paper F / B / D / total"], [
        [name, f["forward"], f["backward"], f["descent"], f["total_sum"], " / ".join(map(str, results["paper_billions"][name]))
         + _verdict(f, results["paper_billions"][name])] for name, f in results["formula_billions"].items()])
    b, o, lay = results["gpt2_small_built_meta"], results["gpt2_small_formula"], results["gpt2_small_layout"]
    lines += ["", (f"GPT-2-small-sized auxiliary (D_sim={lay['d_sim']}, H_sim={lay['h_sim']}, K={lay['K']}, T_sim={lay['t_sim']}): "
              "TinT parameter tree built on the meta device vs the formula for this construction"), "",
              "| | forward | backward | descent | total |", "|---|---|---|---|---|",
              f"| built (meta) | {_billions(b['forward'])} | {_billions(b['backward'])} | {_billions(b['descent'])} | {_billions(b['total'])} |",
              f"| formula | {_billions(o['forward'])} | {_billions(o['backward'])} | {_billions(o['descent'])} | {_billions(o['total'])} |"]
    if "step" in results:
        s = results["step"]
        e = s["vs_r_exact"]
        lines += ["", (f"One simulated SGD step ({results['config']['dtype']}, {results['config']['run_tokens']} tokens, "
                  f"{results['config']['run_train']} training): {s['seconds_build_and_simulate']} s on CPU; "
                  f"vs R-approx: logits {s['logits_rel_error_vs_r_approx']:.1e}, weights {s['max_weight_rel_error_vs_r_approx']:.1e}; "
                  f"vs R-exact: logits gap {e['logits_rel_gap']:.1e}, update cosine {e['update_cosine']:.6f}")]
    return "\n".join(lines) + "\n"
