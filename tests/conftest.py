import os

import pytest
import torch
from hypothesis import settings

# property tests: few examples, no deadline (CPU timing varies with load), reproducible in CI
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-300))


class ByteCodec:
    """A byte-level tokenizer (UTF-8 bytes as ids): enough for the text sources on tiny random models."""

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8")
