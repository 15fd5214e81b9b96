"""The episode splits: an episode's seed is its split's base plus the run's seed.

    seed = episode_seed("validation", 0)      # 10_000: where settings are chosen (--tune, sweeps)
    split_of(seed)                             # "validation"

dev: the seeds compare used for its test episodes before splits were named (reused, no longer a test set);
validation: where settings are chosen; test: a fresh range, run once per change. Sources that draw from a fixed
data set (squad, hotpotqa) read the split from the seed (`split_of`) and draw only from that split's share of it.
"""

from __future__ import annotations

SPLITS = {"dev": 0, "validation": 10_000, "test": 1_000_000}


def episode_seed(split: str, seed: int) -> int:
    """The seed an episode source draws `split`'s episodes from (one-line error for an unknown split)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    return SPLITS[split] + seed


def split_of(seed: int) -> str:
    """The split an episode seed belongs to (the highest base at or below it)."""
    if seed < 0:
        raise ValueError(f"an episode seed is >= 0, got {seed}")
    return max((base, name) for name, base in SPLITS.items() if base <= seed)[1]
