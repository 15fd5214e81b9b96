"""One-minute pilots for the induction task (ICLCA Table 2): train a small model for at most `seconds` and print
its accuracy during training at every committed trigger and at second occurrences only (the output was seen
once before, so counting tokens does not reveal it; only an induction head does).

    PYTHONPATH=src python scripts/induction_pilot.py '{"attention": "linear", "linear_norm": "none"}'

Settings (JSON, all optional): the model's n_layer, d_model, n_head, attention, feature_map, linear_norm,
positions, rope_theta; the task's seq_len, trigger_prob; steps, batch, lr, warmup, seconds, seed, eval_every;
committed_loss (1: cross-entropy on the committed triggers only, instead of the task's loss on every token).
"""

import json
import math
import sys
import time

import torch
import torch.nn.functional as F

from incontext.models import Transformer, TransformerConfig
from incontext.tasks import get_task

DEFAULTS = {"n_layer": 2, "d_model": 64, "n_head": 2, "attention": "linear", "feature_map": "elu", "linear_norm": "kernel",
            "positions": "rope", "rope_theta": 10000.0, "seq_len": 64, "trigger_prob": 0.3, "steps": 1000, "batch": 32,
            "lr": 3e-3, "warmup": 50, "seconds": 50, "seed": 0, "eval_every": 100, "committed_loss": 0}


def second_occurrences(batch) -> torch.Tensor:
    """The committed triggers that occurred exactly once before."""
    second = batch.mask.clone()
    for b, t in batch.mask.nonzero().tolist():
        second[b, t] = int((batch.inputs[b, :t] == batch.inputs[b, t]).sum()) == 1
    return second


def main(settings: dict) -> None:
    torch.set_num_threads(1)
    s = {**DEFAULTS, **settings}
    task = get_task("induction", seq_len=s["seq_len"], trigger_prob=s["trigger_prob"])
    torch.manual_seed(s["seed"])
    model = Transformer(TransformerConfig(
        n_layer=s["n_layer"], d_model=s["d_model"], n_head=s["n_head"], vocab_size=task.config.vocab_size, max_seq_len=s["seq_len"],
        attention=s["attention"], feature_map=s["feature_map"], linear_norm=s["linear_norm"], positions=s["positions"],
        rope_theta=s["rope_theta"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.0, betas=(0.9, 0.99))
    train_generator = torch.Generator().manual_seed(s["seed"])
    held_out = task.sample(256, torch.Generator().manual_seed(999))
    second = second_occurrences(held_out)

    def accuracies() -> tuple[float, float]:
        model.eval()
        with torch.no_grad():
            right = model(held_out.inputs).argmax(-1) == held_out.targets
        model.train()
        return round(right[held_out.mask].float().mean().item(), 3), round(right[second].float().mean().item(), 3)

    start, curve = time.time(), []
    for step in range(1, s["steps"] + 1):
        lr = s["lr"] * min(1, step / s["warmup"]) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / s["steps"])))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = task.sample(s["batch"], train_generator)
        logits = model(batch.inputs)
        loss = F.cross_entropy(logits[batch.mask], batch.targets[batch.mask]) if s["committed_loss"] else task.loss(logits, batch)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        out_of_time = time.time() - start > s["seconds"]
        if step % s["eval_every"] == 0 or step == s["steps"] or out_of_time:
            curve.append((step, round(loss.item(), 3), *accuracies()))
        if out_of_time:
            break
    print(json.dumps(s))
    print("(step, loss, accuracy at committed triggers, at second occurrences):", curve, f"{1000 * (time.time() - start) / step:.0f} ms/step")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
