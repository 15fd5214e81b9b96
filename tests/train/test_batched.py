import math

import pytest
import torch

from incontext.models.toy_transformer import ToyTransformer, ToyTransformerConfig
from incontext.train.batched import evaluate_runs, first_crossing, train_runs
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


@pytest.mark.parametrize("chunk", [3, 500])
def test_evaluate_runs_equals_a_loop_over_runs_and_sequences(chunk):
    """Accuracy and mean cross-entropy of each run on each set, whatever the chunking; to_runs maps seeds to runs."""
    streams = ["none", "v", "q", "k"]
    model = ToyTransformer(CONFIG, streams, [torch.Generator().manual_seed(s) for s in range(4)]).double()
    g = torch.Generator().manual_seed(7)
    sets = {name: (torch.randn(2, 11, 5, 10, generator=g, dtype=torch.float64), torch.randint(4, (2, 11), generator=g))
            for name in ("a", "b")}

    def to_runs(per_seed):  # run r = variant r // 2 on seed r % 2
        return per_seed[None].expand(2, *per_seed.shape).reshape(4, *per_seed.shape[1:])

    record = evaluate_runs(model, sets, to_runs, chunk=chunk)
    for name, (inputs, answers) in sets.items():
        logits = model(to_runs(inputs))
        for r in range(4):
            y = to_runs(answers)[r]
            accuracy = float((logits[r].argmax(-1) == y).double().mean())
            loss = float(torch.nn.functional.cross_entropy(logits[r], y))
            assert abs(record["accuracy"][name][r] - accuracy) < 1e-6 and abs(record["loss"][name][r] - loss) < 1e-12
