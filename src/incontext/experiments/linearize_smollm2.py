"""A linearized SmolLM2-135M: learned feature maps by attention transfer, then a short LoRA recovery.

1. Capture every layer's queries and keys (after RoPE) from the frozen softmax SmolLM2 on windows of the
   Shakespeare TRAINING plays (the held-out plays are never read for training) and, with map_data="plays+facts",
   as many `facts` passages each followed by its questions and answers (recall data: episodes drawn from their
   own seeds, never the evaluation's or validation's), and fit one learned
   Hedgehog-style map per layer and head (train/attention_transfer.py). The maps are saved under
   <out>/feature_maps (resumable); `incontext run iclca-approx` reads them for its learned-feature rows.
   With conversion_steps > 0 the maps are then tuned end to end for the approximate conversion (a copy, saved
   under <out>/conversion_maps): KL(prompted || converted) on the query tokens of (prompt, query) pairs, facts
   passages with their Q/A and training-play windows, from seeds of their own (train/attention_transfer.py).
2. Linearize: every softmax attention replaced by linear attention through the maps (same weights).
3. Recover: a LoRA (peft) on the attention projections, plus the maps, trained to match the softmax model's
   next-token distributions (KL) on other training-play windows; saved as <out>/recovery.safetensors.
4. Held-out perplexity (windows of the held-out plays) of SmolLM2, linearized before and after recovery; and
   exact ICLCA on the recovered linearized model: converted prompt + query alone vs the prompted model
   (float32 and float64).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..absorb import ICLCA
from ..config import check_choices
from ..interop.linearized import RECOVERY_FILE, RECOVERY_TARGETS, lora_alpha
from ..interop.models import load_model
from ..models import Transformer
from ..tasks.corpora import shakespeare_plays
from ..tasks.facts import facts_prompt, make_people
from ..tasks.text import ShakespeareConfig, split_plays
from ..train.attention_transfer import (
    TransferConfig, capture_queries_keys, fit_feature_maps, linearize, load_finished_maps, model_scale, read_options,
    save_feature_maps, tune_maps_for_conversion,
)
from ..outputs import Result
from .common import check_settings
from .registry import register_experiment

MAP_DATA = {"plays": "Shakespeare training plays",
            "plays+facts": "Shakespeare training plays + facts passages with their Q/A (own seeds)"}


@dataclass
class LinearizeConfig:
    map_windows: int = 16  # training windows whose q/k train the maps
    map_data: Literal["plays", "plays+facts"] = "plays"  # plays+facts: half the windows are facts passages + Q/A
    facts_split: Literal["random", "prompt"] = "random"  # where the conversion loss splits a facts window
    window_tokens: int = 256
    n_features: int = 128  # per head (64 directions, both signs)
    map_steps: int = 200  # per layer
    map_lr: float = 0.01
    map_batch: int = 2
    recovery_steps: int = 30  # LoRA recovery steps (KL to the softmax model)
    recovery_tokens: int = 128  # tokens per recovery window
    recovery_batch: int = 4
    recovery_windows: int = 64  # training-play windows the recovery draws its batches from
    lora_rank: int = 8
    lora_lr: float = 2e-3
    eval_windows: int = 16  # held-out-play windows for perplexity
    conversion_prompt: int = 128  # exact-conversion check's prompt (held-out play); also where tuning splits play pairs
    conversion_query: int = 32  # exact-conversion check's query tokens
    conversion_steps: int = 0  # end-to-end tuning of a copy of the maps for the approximate conversion (0: none)
    conversion_windows: int = 64  # (prompt, query) pairs for the tuning: 3/4 facts with map_data=plays+facts, the rest plays
    conversion_lr: float = 0.003  # the tuning's Adam learning rate
    conversion_batch: int = 4  # pairs per tuning step
    seed: int = 0

    def __post_init__(self):
        check_choices(self)
        if self.facts_split == "prompt" and self.map_data != "plays+facts":
            raise ValueError("facts_split=prompt needs map_data=plays+facts (only facts windows have a prompt to split at)")
        check_settings(self, counts=("map_windows", "window_tokens", "n_features", "map_steps", "map_batch",
                                     "recovery_tokens", "recovery_batch", "recovery_windows", "lora_rank", "eval_windows",
                                     "conversion_prompt", "conversion_query", "conversion_windows", "conversion_batch"),
                       rates=("map_lr", "lora_lr", "conversion_lr"))
        if not isinstance(self.conversion_steps, int) or self.conversion_steps < 0:
            raise ValueError(f"conversion_steps must be an integer >= 0, got {self.conversion_steps!r}")
        if self.conversion_prompt >= self.window_tokens:
            raise ValueError(f"conversion_prompt ({self.conversion_prompt}) must be shorter than window_tokens ({self.window_tokens})")


def play_windows(tokenizer, names: list[str], n: int, length: int, seed: str) -> torch.Tensor:
    """n windows of `length` tokens, each from a random place of a random play among `names` (seeded)."""
    plays = shakespeare_plays()
    rng = random.Random(seed)
    windows = []
    while len(windows) < n:
        text = plays[rng.choice(names)]
        start = rng.randrange(max(1, len(text) - 12 * length))
        ids = tokenizer.encode(text[start:start + 12 * length])[1:]  # [1:]: the first token may be a cut word
        if len(ids) >= length:
            windows.append(torch.tensor(ids[:length]))
    return torch.stack(windows)


def facts_windows(tokenizer, n: int, length: int, seed: str, people: int = 2) -> tuple[torch.Tensor, list[int]]:
    """n windows of `length` tokens, each a `facts` passage followed by all its questions with their answers (the
    attention of an answer to its fact is the retrieval a converted prompt must keep), and each passage's length
    in tokens (where a conversion would split it); episodes from `seed`."""
    windows, prompts = [], []
    for i in range(n):
        rng = random.Random(f"{seed}-{i}")
        persons = make_people(people, rng)
        text, pairs, _ = facts_prompt(persons, rng)
        ids = list(tokenizer.encode(text))
        prompts.append(len(ids))
        for person, attribute in pairs:
            question, answer = person.question(attribute)
            ids += tokenizer.encode(question) + tokenizer.encode(answer + "\n\n")
        if len(ids) < length:
            raise ValueError(f"a facts window has {len(ids)} tokens, fewer than window_tokens={length}")
        windows.append(torch.tensor(ids[:length]))
    return torch.stack(windows), prompts


def map_training_windows(tokenizer, names: list[str], config: "LinearizeConfig") -> tuple[torch.Tensor, list[int | None] | None]:
    """The maps' training windows and, per window, where the conversion loss splits it (None: a random place)."""
    if config.map_data == "plays":
        return play_windows(tokenizer, names, config.map_windows, config.window_tokens, f"maps-{config.seed}"), None
    n_facts = config.map_windows // 2
    plays = play_windows(tokenizer, names, config.map_windows - n_facts, config.window_tokens, f"maps-{config.seed}")
    facts, prompts = facts_windows(tokenizer, n_facts, config.window_tokens, f"maps-facts-{config.seed}")
    splits = [None] * len(plays) + prompts if config.facts_split == "prompt" else None
    return torch.cat([plays, facts]), splits  # the order does not matter: each step samples windows at random


def conversion_pairs(tokenizer, names: list[str], config: "LinearizeConfig") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(prompt, query) pairs for tuning the maps end to end: facts passages (prompt) with their Q/A (query), 3/4 of
    them with map_data=plays+facts, and training-play windows split after conversion_prompt tokens; seeds of their
    own (never the evaluation's, validation's or the maps' fit's)."""
    n_facts = 3 * config.conversion_windows // 4 if config.map_data == "plays+facts" else 0
    pairs = []
    if n_facts:
        facts, prompts = facts_windows(tokenizer, n_facts, config.window_tokens, f"conversion-facts-{config.seed}")
        pairs += [(window[:m], window[m:]) for window, m in zip(facts, prompts)]
    plays = play_windows(tokenizer, names, config.conversion_windows - n_facts, config.window_tokens, f"conversion-{config.seed}")
    return pairs + [(window[:config.conversion_prompt], window[config.conversion_prompt:]) for window in plays]


def tuned_conversion_maps(model: Transformer, maps: list, tokenizer, names: list[str], config: "LinearizeConfig",
                          folder: Path) -> tuple[list, list[float]]:
    """A copy of `maps` tuned end to end for the conversion and saved in `folder`, or the finished copy there when
    it was tuned alike from the same fit (a different one: one-line error)."""
    settings = {key: getattr(config, key) for key in ("conversion_steps", "conversion_windows", "conversion_lr",
                                                        "conversion_batch", "conversion_prompt", "seed")}
    fitted = read_options(folder.parent / "feature_maps")
    wanted = {**{key: fitted.get(key) for key in ("training", "data", "splits")}, "conversion": settings}
    done = load_finished_maps(folder, model.config.n_layer, wanted)
    if done is not None:
        return done, read_options(folder)["conversion_losses"]
    tuned = copy.deepcopy(maps)
    losses = tune_maps_for_conversion(model, tuned, conversion_pairs(tokenizer, names, config), steps=config.conversion_steps,
                                      lr=config.conversion_lr, batch=config.conversion_batch, seed=config.seed)
    options = {key: value for key, value in fitted.items() if key not in ("layers_done", "losses")}
    save_feature_maps(tuned, folder, {**options, "conversion": settings, "conversion_losses": losses})
    return tuned, losses


@torch.no_grad()
def perplexity(model: Transformer, windows: torch.Tensor, batch: int = 4) -> float:
    total, count = 0.0, 0
    for start in range(0, windows.shape[0], batch):
        x = windows[start:start + batch]
        logits = model(x[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1).float(), x[:, 1:].flatten(), reduction="sum").item()
        count += x[:, 1:].numel()
    return math.exp(total / count)


def recover(teacher: Transformer, student: Transformer, windows: torch.Tensor, config: LinearizeConfig,
            progress: bool = True) -> list[float]:
    """LoRA (peft) on the student's attention projections, plus its feature maps, trained by KL(teacher || student)
    on next-token distributions; the rest of the student stays frozen. Returns the loss per step."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = [f"blocks.{i}.{name}" for i in range(student.config.n_layer) for name in RECOVERY_TARGETS]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        inject_adapter_in_model(LoraConfig(r=config.lora_rank, lora_alpha=lora_alpha(config.lora_rank), lora_dropout=0.0,
                                           target_modules=targets), student)
    for name, p in student.named_parameters():
        p.requires_grad_(".lora_" in name or ".learned." in name)
    trainable = [p for p in student.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lora_lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(config.seed)
    student.train()
    losses = []
    for _ in tqdm(range(config.recovery_steps), desc="LoRA recovery", disable=not progress):
        x = windows[torch.randperm(windows.shape[0], generator=generator)[: config.recovery_batch]]
        with torch.no_grad():
            target = torch.log_softmax(teacher(x), -1)
        log_student = torch.log_softmax(student(x), -1)
        loss = F.kl_div(log_student.flatten(0, 1), target.flatten(0, 1), log_target=True, reduction="batchmean")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        losses.append(loss.item())
    student.eval()
    return losses


def conversion_check(model: Transformer, prompt: torch.Tensor, query: torch.Tensor) -> dict[str, float]:
    """Relative logits error of (converted prompt + query alone) vs (the prompted model), and of the query alone."""
    with torch.no_grad():
        prompted = model(torch.cat([prompt, query], 1))[:, prompt.shape[1]:]
        converted = ICLCA().absorb(model, prompt)(query)
        alone = model(query)

    def rel(a):
        return float((a - prompted).norm() / prompted.norm())

    return {"converted": rel(converted), "without prompt": rel(alone)}


@register_experiment("linearize-smollm2", "SmolLM2-135M linearized by learned feature maps (attention transfer) + LoRA recovery; exact ICLCA on it", LinearizeConfig)
def run(config: LinearizeConfig, out_dir: Path) -> Result:
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    loaded = load_model("smollm2")
    model, codec = loaded.model, loaded.tokenizer
    model.requires_grad_(False)
    train_plays, heldout_plays = split_plays(ShakespeareConfig(), shakespeare_plays())
    seconds = {}

    map_windows, splits = map_training_windows(codec, train_plays, config)
    transfer = TransferConfig(n_features=config.n_features, steps=config.map_steps, lr=config.map_lr,
                              batch=config.map_batch, seed=config.seed)
    folder = out_dir / "feature_maps"
    tick = time.perf_counter()
    # finished maps are reused (a re-run for the recovery) only when fitted alike
    maps = load_finished_maps(folder, model.config.n_layer, {"training": dataclasses.asdict(transfer),
                                                              "data": MAP_DATA[config.map_data], "splits": splits})
    if maps is None:
        captures = capture_queries_keys(model, map_windows)
        maps = fit_feature_maps(captures, transfer, scale=model_scale(model), folder=folder,
                                extra={"model": "SmolLM2-135M-Instruct", "data": MAP_DATA[config.map_data]}, splits=splits)
        del captures
    seconds["feature maps"] = round(time.perf_counter() - tick, 1)
    map_losses = read_options(folder)["losses"]
    conversion = None
    if config.conversion_steps:
        tick = time.perf_counter()
        _, conversion_losses = tuned_conversion_maps(model, maps, codec, train_plays, config, out_dir / "conversion_maps")
        seconds["conversion tuning"] = round(time.perf_counter() - tick, 1)
        conversion = {"folder": "conversion_maps", "kl": conversion_losses}

    tick = time.perf_counter()
    eval_windows = play_windows(codec, heldout_plays, config.eval_windows, config.window_tokens, f"eval-{config.seed}")
    linear = linearize(model, maps)
    ppl = {"SmolLM2 (softmax)": perplexity(model, eval_windows), "linearized, before recovery": perplexity(linear, eval_windows)}
    seconds["perplexity"] = round(time.perf_counter() - tick, 1)

    tick = time.perf_counter()
    recovery_windows = play_windows(codec, train_plays, config.recovery_windows, config.recovery_tokens, f"recovery-{config.seed}")
    recovery_losses = recover(model, linear, recovery_windows, config)
    save_file({name: p.detach().contiguous() for name, p in linear.named_parameters() if p.requires_grad},
              str(out_dir / RECOVERY_FILE))
    linear.requires_grad_(False)
    seconds["recovery"] = round(time.perf_counter() - tick, 1)
    ppl["linearized, after recovery"] = perplexity(linear, eval_windows)

    tick = time.perf_counter()
    text = play_windows(codec, heldout_plays, 1, config.conversion_prompt + config.conversion_query, f"convert-{config.seed}")
    prompt, query = text[:, : config.conversion_prompt], text[:, config.conversion_prompt:]
    exactness = {"float32": conversion_check(linear, prompt, query)}
    exactness["float64"] = conversion_check(linear.double(), prompt, query)
    linear.float()
    seconds["conversion"] = round(time.perf_counter() - tick, 1)

    results = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, float32)",
               "data": {"training": f"maps: {MAP_DATA[config.map_data]}; recovery: Shakespeare training plays", "evaluation": f"held-out plays {heldout_plays}"},
               "perplexity": ppl, "perplexity_ratio_after": ppl["linearized, after recovery"] / ppl["SmolLM2 (softmax)"],
               "feature_map_losses": map_losses, "conversion_tuning": conversion, "recovery_kl": recovery_losses,
               "exact_conversion": exactness,
               "seconds": {**seconds, "total": round(time.perf_counter() - start, 1)}}
    return Result(results, tables={"table.md": lambda r: table(r, config)})


def table(results: dict, config: LinearizeConfig) -> str:
    ppl, map_losses, exactness = results["perplexity"], results["feature_map_losses"], results["exact_conversion"]
    lines = [f"Held-out perplexity ({config.eval_windows} windows of {config.window_tokens} tokens from the held-out plays):", "",
             "| model | perplexity | vs SmolLM2 |", "|---|---|---|"]
    base = ppl["SmolLM2 (softmax)"]
    lines += [f"| {name} | {value:.2f} | {value / base:.2f}x |" for name, value in ppl.items()]
    lines += ["", "Attention-distillation KL per query row, mean over layers (before = the FAVOR+ start):", "",
              "| keys through features | before | after |", "|---|---|---|"]
    for key, label in (("linear", "all (linearized)"), ("converted", "before a split (conversion)")):
        lines.append(f"| {label} | {sum(l['before'][key] for l in map_losses) / len(map_losses):.4f} | "
                     f"{sum(l['after'][key] for l in map_losses) / len(map_losses):.4f} |")
    if results.get("conversion_tuning"):
        kl = results["conversion_tuning"]["kl"]
        first, last = kl[: min(10, len(kl))], kl[-min(10, len(kl)):]
        lines += ["", f"Maps tuned end to end for the approximate conversion (conversion_maps/, {len(kl)} steps): KL per "
                  f"query token {sum(first) / len(first):.3f} (first {len(first)} steps) -> {sum(last) / len(last):.3f} "
                  f"(last {len(last)})"]
    lines += ["", f"Exact ICLCA on the recovered linearized model ({config.conversion_prompt}-token prompt, "
              f"{config.conversion_query}-token query; relative logits error vs the prompted linearized model):", "",
              "| dtype | converted | without prompt |", "|---|---|---|"]
    lines += [f"| {dtype} | {row['converted']:.2e} | {row['without prompt']:.2e} |" for dtype, row in exactness.items()]
    return "\n".join(lines)
