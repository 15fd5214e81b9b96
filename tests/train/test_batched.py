import math

import pytest
import torch

from incontext.models.toy_transformer import ToyTransformer, ToyTransformerConfig
from incontext.train.batched import first_crossing, train_runs
from incontext.train.trainer import NonFiniteLossError

CONFIG = ToyTransformerConfig(d_model=10, n_labels=4, init_dim=5)


def data(runs: int, seeds: list[int]):
    def sample(step: int):
        xs, ys = [], []
        for seed in seeds:
            g = torch.Generator().manual_seed(seed * 1000 + step)
            xs.append(torch.randn(6, 5, 10, generator=g, dtype=torch.float64))
            ys.append(torch.randint(4, (6,), generator=g))
        return torch.stack(xs), torch.stack(ys)
    return sample


def test_batched_training_equals_training_each_run_alone():
    streams, seeds = ["none", "v", "q"], [0, 1, 2]
    gens = lambda: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    together = ToyTransformer(CONFIG, streams, gens()).double()
    train_runs(together, data(3, seeds), steps=15, lr=0.1, decay=1e-3, progress=False)
    for r, (stream, seed) in enumerate(zip(streams, seeds)):
        alone = ToyTransformer(CONFIG, [stream], [torch.Generator().manual_seed(seed)]).double()
        train_runs(alone, data(1, [seed]), steps=15, lr=0.1, decay=1e-3, progress=False)
        for name, p in alone.named_parameters():
            expected = p[0]
            got = dict(together.named_parameters())[name][r]
            assert torch.allclose(got, expected, rtol=1e-12, atol=1e-13), (stream, name)
            assert not torch.equal(got, ToyTransformer(CONFIG, [stream], [torch.Generator().manual_seed(seed)]).double().run_state(0)[name])


def test_evaluation_schedule():
    model = ToyTransformer(CONFIG, ["none"]).double()
    seen = []
    train_runs(model, data(1, [0]), steps=7, lr=0.01, evaluate=lambda s: seen.append(s) or {"step": s}, eval_every=3, progress=False)
    assert seen == [0, 3, 6, 7]


def test_non_finite_loss_names_the_run():
    model = ToyTransformer(CONFIG, ["none", "v"]).double()
    with torch.no_grad():
        model.readout[1].fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match=r"run\(s\) \[1\]"):
        train_runs(model, data(2, [0, 1]), steps=2, lr=0.01, progress=False)


def test_first_crossing():
    assert first_crossing([0, 10, 20], [0.1, 0.6, 0.96], 0.5) == 10
    assert first_crossing([0, 10, 20], [0.1, 0.5, 0.6], 0.5) == 20  # strictly above
    assert math.isnan(first_crossing([0, 10], [0.1, 0.2], 0.9))
