"""Hugging Face parity: our Transformer against transformers' GPT-2 and Llama (random weights, both
directions) and against the pretrained SmolLM2-135M on real text (logits and greedy generation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..outputs import Result, markdown_table
from .registry import register_experiment

# A few sentences of ordinary English prose (public-domain style), enough for ~100 tokens.
REAL_TEXT = (
    "It was a bright cold day in April, and the clocks in the old town hall were striking thirteen. "
    "The market square was already full of traders selling apples, bread and warm wool, while children ran "
    "between the stalls. Paris is the capital of France, Rome is the capital of Italy, and the river that "
    "runs through London is called the Thames. Water freezes at zero degrees Celsius and boils at one hundred."
)
FACT_PROMPTS = [
    "The capital of France is Paris. The capital of Italy is",
    "Water boils at",
    "The first president of the United States was",
]


@dataclass
class ParityConfig:
    seed: int = 0
    new_tokens: int = 16


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def _random_pairs(seed: int) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from ..interop import from_hf_gpt2, from_hf_llama, to_hf_gpt2, to_hf_llama

    torch.manual_seed(seed)
    x = torch.randint(0, 1000, (4, 64), generator=torch.Generator().manual_seed(seed))
    rows = {}
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=4, n_head=4,
                                      bos_token_id=None, eos_token_id=None)).eval()
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).eval()
    for name, hf, to_ours, to_theirs in (("gpt2", gpt2, from_hf_gpt2, to_hf_gpt2), ("llama", llama, from_hf_llama, to_hf_llama)):
        with torch.no_grad():
            reference = hf(x).logits
            ours = to_ours(hf).eval()
            imported = ours(x)
            exported = to_theirs(ours).eval()(x).logits
        # import: ours vs transformers on its weights; export: transformers on our weights vs ours
        rows[name] = {"import_max_abs": _max_abs(imported, reference), "export_max_abs": _max_abs(exported, imported)}
    return rows


def _smollm2(new_tokens: int) -> dict:
    from ..interop import from_hf_llama, load_smollm2

    hf, tokenizer = load_smollm2()
    ours = from_hf_llama(hf).eval()
    ids = tokenizer(REAL_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        reference, mine = hf(ids).logits, ours(ids)
    result = {
        "tokens": ids.shape[1],
        "parameters": ours.num_parameters(),
        "max_abs": _max_abs(mine, reference),
        "relative": float((mine - reference).norm() / reference.norm()),
        "argmax_agreement": float((mine.argmax(-1) == reference.argmax(-1)).float().mean()),
        "generations": [],
    }
    eos = hf.generation_config.eos_token_id
    for prompt in FACT_PROMPTS:
        p = tokenizer(prompt, return_tensors="pt").input_ids
        theirs = hf.generate(p, max_new_tokens=new_tokens, do_sample=False)
        mine_ids = ours.generate(p, new_tokens, eos_token_id=eos if isinstance(eos, int) else None)
        result["generations"].append({
            "prompt": prompt,
            "ours": tokenizer.decode(mine_ids[0, p.shape[1]:]),
            "transformers": tokenizer.decode(theirs[0, p.shape[1]:]),
            "identical": bool(torch.equal(mine_ids, theirs)),
        })
    return result


@register_experiment("hf-parity", "logits of our Transformer vs transformers' GPT-2 / Llama and pretrained SmolLM2-135M", ParityConfig)
def run(config: ParityConfig, out_dir: Path) -> Result:
    return Result({"dtype": "float32", "random_weights": _random_pairs(config.seed), "smollm2": _smollm2(config.new_tokens)},
                  {"table.md": table})


def table(results: dict) -> str:
    s = results["smollm2"]
    rows = [[f"{name} (random, 4 layers, width 128)", direction, f"{row[key]:.2e}"] for name, row in results["random_weights"].items()
            for direction, key in (("HF -> ours", "import_max_abs"), ("ours -> HF", "export_max_abs"))]
    rows.append([f"SmolLM2-135M pretrained, {s['tokens']} tokens of text", "HF -> ours", f"{s['max_abs']:.2e} "
                 f"(relative {s['relative']:.2e}, argmax agreement {s['argmax_agreement']:.3f})"])
    lines = [*markdown_table(["model", "direction", "max abs logit difference (float32)"], rows), ""]
    lines += markdown_table(["prompt", "greedy continuation (ours)", "identical to transformers"],
                            [[g["prompt"], repr(g["ours"]), g["identical"]] for g in s["generations"]])
    return "\n".join(lines) + "\n"
