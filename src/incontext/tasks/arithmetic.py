"""Synthetic in-context arithmetic sequences from the CGT paper (sec. 4.1, Fig. 2).

A sequence holds n_tasks tasks. Each task has hidden coefficients (a, b), and n_ex examples
"AAA*BBB=sCCCCC" with C = trunc(a*A + b*B); examples are separated by '|' and each task ends with '#':

    154*709=+07058|648*011=+05920|526*187=+06230|893*495=+11997#

The model reads characters and is scored on predicting the answer (sign and d+2 digits) of every example,
which it can only do by inferring (a, b) from the earlier examples of the same task.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import Batch, Task, check_positive_int
from .registry import register_task

VOCAB = "0123456789*=+-|#"
CHAR_TO_ID = {char: i for i, char in enumerate(VOCAB)}
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index


def encode(text: str) -> list[int]:
    return [CHAR_TO_ID[char] for char in text]


def decode(ids: list[int] | torch.Tensor) -> str:
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return "".join(VOCAB[i] for i in ids)


def to_strings(inputs: torch.Tensor) -> list[str]:
    """(B, T) token ids -> B strings."""
    return [decode(row) for row in inputs.tolist()]


def example_length(digits: int) -> int:
    """Characters per example, its trailing '|' or '#' included: A, '*', B, '=', sign, d+2 digits, separator."""
    return 3 * digits + 6


@dataclass
class ArithmeticConfig:
    n_tasks: int = 4  # tasks per sequence
    n_ex: int = 4  # examples per task
    digits: int = 3  # d: digits of the operands A and B; answers get a sign and d + 2 digits
    integer_coefficients: bool = False  # draw a, b as integers instead of reals
    a_range: tuple[float, float] = (0.0, 10.0)  # a ~ U[lo, hi); integers: {ceil(lo), ..., ceil(hi) - 1}
    b_range: tuple[float, float] = (-10.0, 10.0)  # b ~ U(lo, hi); integers: {floor(lo) + 1, ..., ceil(hi) - 1}

    def __post_init__(self):
        for name in ("n_tasks", "n_ex", "digits"):
            check_positive_int(self, name)
        if self.digits > 12:  # keeps a*A + b*B exact enough in float64 and the answers inside int64
            raise ValueError(f"ArithmeticConfig.digits must be <= 12, got {self.digits}")
        for name in ("a_range", "b_range"):
            value = getattr(self, name)
            if len(value) != 2 or not float(value[0]) < float(value[1]):
                raise ValueError(f"ArithmeticConfig.{name} must be a pair (lo, hi) with lo < hi, got {value!r}")
            setattr(self, name, (float(value[0]), float(value[1])))  # lists (from YAML) become tuples
        if self.integer_coefficients:
            for name, (lo, hi) in (("a_range", self.integer_a_range), ("b_range", self.integer_b_range)):
                if lo > hi:
                    raise ValueError(f"ArithmeticConfig.{name} {getattr(self, name)!r} contains no integer")
        # Every answer must fit in d + 2 digits: |C| <= (max|a| + max|b|) * (10^d - 1) < 10^(d+2).
        max_abs_a, max_abs_b = (max(abs(lo), abs(hi)) for lo, hi in (self.a_range, self.b_range))
        largest_operand = 10**self.digits - 1
        if (max_abs_a + max_abs_b) * largest_operand >= 10 ** (self.digits + 2):
            raise ValueError(
                f"ArithmeticConfig: a_range={self.a_range} and b_range={self.b_range} allow answers "
                f"|a*A + b*B| up to {(max_abs_a + max_abs_b) * largest_operand:g}, which does not fit in "
                f"digits + 2 = {self.digits + 2} digits "
                f"(need max|a| + max|b| < {10 ** (self.digits + 2) / largest_operand:g})"
            )

    @property
    def integer_a_range(self) -> tuple[int, int]:
        """Inclusive integer bounds for a (half-open real range [lo, hi))."""
        return math.ceil(self.a_range[0]), math.ceil(self.a_range[1]) - 1

    @property
    def integer_b_range(self) -> tuple[int, int]:
        """Inclusive integer bounds for b (open real range (lo, hi))."""
        return math.floor(self.b_range[0]) + 1, math.ceil(self.b_range[1]) - 1


@register_task("arithmetic")
class Arithmetic(Task):
    config_class = ArithmeticConfig
    config: ArithmeticConfig

    def model_io(self) -> dict[str, int]:
        return {"vocab_size": len(VOCAB)}

    @property
    def sequence_length(self) -> int:
        cfg = self.config
        return cfg.n_tasks * cfg.n_ex * example_length(cfg.digits)

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        cfg, d = self.config, self.config.digits
        device = generator.device
        n_tasks, n_ex = cfg.n_tasks, cfg.n_ex
        if cfg.integer_coefficients:
            (a_lo, a_hi), (b_lo, b_hi) = cfg.integer_a_range, cfg.integer_b_range
            a = torch.randint(a_lo, a_hi + 1, (batch_size, n_tasks), generator=generator, device=device)
            b = torch.randint(b_lo, b_hi + 1, (batch_size, n_tasks), generator=generator, device=device)
            a, b = a.double(), b.double()
        else:
            (a_lo, a_hi), (b_lo, b_hi) = cfg.a_range, cfg.b_range
            uniform = torch.rand(2, batch_size, n_tasks, generator=generator, device=device, dtype=torch.float64)
            a = a_lo + (a_hi - a_lo) * uniform[0]
            b = b_lo + (b_hi - b_lo) * uniform[1]
        shape = (batch_size, n_tasks, n_ex)
        A = torch.randint(0, 10**d, shape, generator=generator, device=device)
        B = torch.randint(0, 10**d, shape, generator=generator, device=device)
        # Two separate products then a sum, in float64, as Python's trunc(a*A + b*B) would do it (no fused ops).
        C = torch.trunc(a[..., None] * A.double() + b[..., None] * B.double()).long()

        def char(c: str) -> torch.Tensor:
            return torch.full(shape + (1,), CHAR_TO_ID[c], dtype=torch.long, device=device)

        sign = torch.where(C >= 0, CHAR_TO_ID["+"], CHAR_TO_ID["-"])[..., None]
        separator = char("|")
        separator[:, :, -1] = CHAR_TO_ID["#"]  # the last example closes its task
        examples = torch.cat(
            [digit_ids(A, d), char("*"), digit_ids(B, d), char("="), sign, digit_ids(C.abs(), d + 2), separator],
            dim=-1,
        )  # (B, n_tasks, n_ex, 3d + 6)
        inputs = examples.reshape(batch_size, -1)

        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, :-1] = inputs[:, 1:]
        # Within an example, the answer's sign and digits sit at offsets 2d+2 .. 3d+4, so the logits that
        # predict them sit one position earlier: offsets 2d+1 ('=') .. 3d+3.
        L = example_length(d)
        offset = torch.arange(inputs.shape[1], device=device) % L
        answer_mask = ((offset >= 2 * d + 1) & (offset <= 3 * d + 3)).expand(batch_size, -1).clone()

        # Task / example of each target token, i.e. aligned with `targets` and `mask`; -1 where the target
        # is a separator (or the ignored last position).
        next_position = torch.arange(1, inputs.shape[1] + 1, device=device)
        example_number = next_position // L  # which example (counted over the whole sequence) t + 1 is in
        inside = (next_position % L != L - 1) & (next_position < inputs.shape[1])  # not a separator, not past the end
        task_index = torch.where(inside, example_number // n_ex, -1).expand(batch_size, -1).clone()
        example_index = torch.where(inside, example_number % n_ex, -1).expand(batch_size, -1).clone()

        info = {
            "a": a,
            "b": b,
            "A": A,
            "B": B,
            "C": C,
            "task_index": task_index,
            "example_index": example_index,
            "answer_mask": answer_mask,
        }
        return Batch(inputs=inputs, targets=targets, mask=answer_mask, info=info)

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Cross-entropy of the (B, T, 16) logits on the answer characters (teacher forcing)."""
        logits = outputs[batch.mask]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half-precision logits: float32 loss
        return F.cross_entropy(logits, batch.targets[batch.mask])

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        cfg = self.config
        correct = outputs.argmax(dim=-1) == batch.targets  # (B, T)
        mask = batch.mask
        answer_chars = cfg.digits + 3  # sign + d + 2 digits
        # Boolean indexing keeps row-major order, so each answer's characters are contiguous.
        per_answer = correct[mask].reshape(-1, answer_chars)
        by_example = [
            correct[mask & (batch.info["example_index"] == e)].float().mean().item() for e in range(cfg.n_ex)
        ]
        return {
            "char_accuracy": correct[mask].float().mean().item(),
            "exact_match": per_answer.all(dim=-1).float().mean().item(),
            "char_accuracy_by_example": by_example,
        }


def digit_ids(values: torch.Tensor, width: int) -> torch.Tensor:
    """Non-negative integers (...) -> their zero-padded decimal digits (..., width), most significant first.

    The digit ids equal the digit values because VOCAB starts with "0123456789".
    """
    powers = 10 ** torch.arange(width - 1, -1, -1, device=values.device)
    return values[..., None] // powers % 10
