"""Probes of a language model trained on the stories task (tasks/stories.py), each a few forward passes in
eval mode: the log-probability of a continuation, IOI name scores, validation loss, the loss by position on
held-out-name stories (in-context curve and score) and induction on repeated random tokens; `probe_model` and
`probe_checkpoints` run them all on a trained model and on the checkpoints of its training run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..tasks.stories import PAPER_IOI_PROMPTS, IOIPrompt, Stories, heldout_stories, ioi_prompts
from ..tasks.text import ENDOFTEXT_ID
from .trainer import load_for_eval


def at_least_float32(logits: torch.Tensor) -> torch.Tensor:
    return logits.to(torch.promote_types(logits.dtype, torch.float32))  # float64 models stay float64


@torch.no_grad()
def continuation_logprobs(model: torch.nn.Module, task: Stories, pairs: list[tuple[str, str]], batch_size: int = 64) -> list[float]:
    """log p(continuation | <|endoftext|> + prompt) for each (prompt, continuation), summed over the
    continuation's tokens. Sequences are right-padded: a causal model's earlier positions do not see the pad."""
    sequences = []
    for prompt, continuation in pairs:
        context, answer = [ENDOFTEXT_ID, *task.encode(prompt)], task.encode(continuation)
        if task.encode(prompt + continuation) != context[1:] + answer:
            raise ValueError(f"{continuation!r} does not tokenize separately after {prompt!r}")
        sequences.append((context, answer))
    out = []
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        length = max(len(c) + len(a) - 1 for c, a in chunk)
        if length > task.sequence_length:
            raise ValueError(f"an IOI prompt of {length} tokens is longer than the model's context {task.sequence_length}")
        inputs = torch.full((len(chunk), length), ENDOFTEXT_ID, dtype=torch.int64)
        for row, (context, answer) in enumerate(chunk):
            tokens = (context + answer)[:-1]
            inputs[row, : len(tokens)] = torch.tensor(tokens)
        logprobs = F.log_softmax(at_least_float32(model(inputs)), dim=-1)
        for row, (context, answer) in enumerate(chunk):
            positions = torch.arange(len(context) - 1, len(context) - 1 + len(answer))
            out.append(float(logprobs[row, positions, torch.tensor(answer)].sum()))
    return out


def ioi_scores(model: torch.nn.Module, task: Stories, prompts: list[IOIPrompt]) -> dict[str, dict[str, float]]:
    """Per group of prompts: mean probability of the correct and incorrect name (percent), mean log-probability
    difference correct - incorrect, and the fraction of prompts where the correct name is the likelier."""
    correct = continuation_logprobs(model, task, [(p.text, " " + p.correct) for p in prompts])
    incorrect = continuation_logprobs(model, task, [(p.text, " " + p.incorrect) for p in prompts])
    groups: dict[str, dict[str, float]] = {}
    for group in dict.fromkeys(p.group for p in prompts):
        idx = [i for i, p in enumerate(prompts) if p.group == group]
        c, w = np.array([correct[i] for i in idx]), np.array([incorrect[i] for i in idx])
        groups[group] = {"correct": float(100 * np.exp(c).mean()), "incorrect": float(100 * np.exp(w).mean()),
                         "logit_diff": float((c - w).mean()), "accuracy": float((c > w).mean()), "prompts": len(idx)}
    return groups


@torch.no_grad()
def validation_loss(model: torch.nn.Module, task: Stories, windows: int, seed: int, batch_size: int = 128) -> float:
    """Mean next-token loss over `windows` random windows of the validation stories."""
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for start in range(0, windows, batch_size):
        batch = task.sample_validation(min(batch_size, windows - start), generator)
        total += float(task.loss(model(batch.inputs), batch)) * batch.batch_size
    return total / windows


@torch.no_grad()
def in_context_curve(model: torch.nn.Module, task: Stories, stories: int, seed: int) -> list[float]:
    """Mean loss at each position of windows that are held-out-name stories from their start (stories with
    many events, cut to the context length)."""
    width = task.sequence_length + 1
    windows = []
    for text in heldout_stories(4 * stories, seed=seed, events=6):
        ids = [ENDOFTEXT_ID, *task.encode(text)]
        if len(ids) >= width:
            windows.append(ids[:width])
        if len(windows) == stories:
            break
    if len(windows) < stories:
        raise ValueError(f"only {len(windows)} held-out stories reach {width} tokens")
    windows = torch.tensor(windows)
    losses = F.cross_entropy(at_least_float32(model(windows[:, :-1])).transpose(1, 2), windows[:, 1:], reduction="none")
    return losses.mean(0).tolist()


def in_context_score(curve: list[float], early: tuple[int, int], late: tuple[int, int]) -> float:
    """Mean loss over positions [late) minus over positions [early): negative when later tokens profit from context."""
    return float(np.mean(curve[late[0] : late[1]]) - np.mean(curve[early[0] : early[1]]))


@torch.no_grad()
def induction_accuracy(model: torch.nn.Module, task: Stories, sequences: int, seed: int) -> dict[str, float]:
    """<|endoftext|> r r with r random tokens (drawn from those in the training text): top-1 accuracy and loss on
    the second copy (its first token excluded: it cannot be inferred), and the loss on the first copy."""
    half = (task.sequence_length - 1) // 2
    seen = torch.unique(task.tokens("train"))
    seen = seen[seen != ENDOFTEXT_ID]
    generator = torch.Generator().manual_seed(seed)
    r = seen[torch.randint(0, len(seen), (sequences, half), generator=generator)]
    tokens = torch.cat([torch.full((sequences, 1), ENDOFTEXT_ID), r, r], dim=1)
    logits = at_least_float32(model(tokens[:, :-1]))
    targets = tokens[:, 1:]
    second = slice(half + 1, 2 * half)  # predicting r[1:] of the second copy
    losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    accuracy = (logits[:, second].argmax(-1) == targets[:, second]).float().mean()
    return {"accuracy": float(accuracy), "loss_second_copy": float(losses[:, second].mean()),
            "loss_first_copy": float(losses[:, 1:half].mean())}


def probe_model(model: torch.nn.Module, task: Stories, *, ioi_pairs: int, seed: int, windows: int, icl_stories: int,
                icl_early: tuple[int, int], icl_late: tuple[int, int], induction_sequences: int) -> dict:
    """Every probe of one trained model, in eval mode: validation loss (`windows` windows), IOI (each paper prompt,
    their mean as "paper", and `ioi_pairs` sampled pairs of training / held-out names), the in-context curve and
    score, and induction. `seed` draws the IOI names and the held-out stories (seed + 1: the validation windows,
    seed + 2: the induction sequences)."""
    model.eval()
    ioi = ioi_scores(model, task, ioi_prompts(ioi_pairs, seed))
    paper_groups = [ioi[f"paper {i}"] for i in range(1, len(PAPER_IOI_PROMPTS) + 1)]
    ioi["paper"] = {key: float(np.mean([g[key] for g in paper_groups])) for key in ("correct", "incorrect", "logit_diff", "accuracy")}
    curve = in_context_curve(model, task, icl_stories, seed=seed)
    return {"validation_loss": validation_loss(model, task, windows, seed=seed + 1),
            "ioi": ioi, "in_context_curve": curve, "in_context_score": in_context_score(curve, icl_early, icl_late),
            "induction": induction_accuracy(model, task, induction_sequences, seed=seed + 2)}


def probe_checkpoints(train_dir: Path, task: Stories, *, ioi_pairs: int, seed: int, windows: int,
                      induction_sequences: int) -> list[dict]:
    """IOI (sampled training and held-out names), induction accuracy and validation loss of every checkpoint of a
    training run, in step order (seeds as in `probe_model`)."""
    prompts = ioi_prompts(ioi_pairs, seed, paper=False)
    rows = []
    for checkpoint in sorted((Path(train_dir) / "checkpoints").glob("step_*")):
        model, _ = load_for_eval(checkpoint)
        rows.append({"step": int(checkpoint.name.removeprefix("step_")), "ioi": ioi_scores(model, task, prompts),
                     "induction_accuracy": induction_accuracy(model, task, induction_sequences, seed=seed + 2)["accuracy"],
                     "validation_loss": validation_loss(model, task, windows, seed=seed + 1)})
    return rows
