"""The absorb harness: every method on the same model and episodes, one table (compare.py)."""

from .compare import compare

__all__ = ["compare"]
