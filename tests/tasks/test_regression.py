import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from incontext.tasks import Batch, LeastSquares, LinearRegression, Ridge, error_by_examples, get_task


def sample(seed: int = 0, batch_size: int = 8, **overrides) -> tuple[LinearRegression, Batch]:
    task = get_task("linear_regression", **overrides)
    return task, task.sample(batch_size, torch.Generator().manual_seed(seed))


def x_positions(tensor: torch.Tensor) -> torch.Tensor:
    return tensor[:, 0::2]


def test_shapes_and_dtypes():
    for dtype, torch_dtype in (("float32", torch.float32), ("float64", torch.float64)):
        task, batch = sample(batch_size=3, d_in=5, d_out=2, n_points=7, dtype=dtype)
        assert task.model_io() == {"d_input": 7, "d_output": 2}
        assert task.sequence_length == 14
        assert batch.inputs.shape == (3, 14, 7) and batch.inputs.dtype == torch_dtype
        assert batch.targets.shape == (3, 14, 2) and batch.targets.dtype == torch_dtype
        assert batch.mask.shape == (3, 14) and batch.mask.dtype == torch.bool
        assert batch.info["clean"].shape == (3, 14, 2)
        assert batch.info["U"].shape == (3, 2, 5)
        assert batch.info["b"].shape == (3, 2)
        assert batch.info["x"].shape == (3, 7, 5)
        assert batch.info["y"].shape == (3, 7, 2)
        for name, predictor in task.baselines().items():
            outputs = predictor(batch.inputs)
            assert outputs.shape == (3, 14, 2) and outputs.dtype == torch_dtype, name


def test_same_seed_is_bit_identical_and_different_seed_differs():
    _, first = sample(seed=3, d_in=4, n_points=6)
    _, again = sample(seed=3, d_in=4, n_points=6)
    _, other = sample(seed=4, d_in=4, n_points=6)
    assert torch.equal(first.inputs, again.inputs) and torch.equal(first.targets, again.targets)
    for key in first.info:
        assert torch.equal(first.info[key], again.info[key]), key
    assert not torch.equal(first.inputs, other.inputs)


def test_tokens_hold_x_and_y_zero_padded():
    d_in, d_out = 3, 2
    _, batch = sample(d_in=d_in, d_out=d_out, n_points=5)
    x_tokens, y_tokens = batch.inputs[:, 0::2], batch.inputs[:, 1::2]
    assert torch.equal(x_tokens[..., :d_in], batch.info["x"])
    assert torch.all(x_tokens[..., d_in:] == 0)
    assert torch.equal(y_tokens[..., d_in:], batch.info["y"])
    assert torch.all(y_tokens[..., :d_in] == 0)


def test_mask_is_exactly_the_x_positions_and_targets_are_the_noisy_y():
    _, batch = sample(d_in=3, d_out=2, n_points=6)
    expected_mask = torch.tensor([t % 2 == 0 for t in range(12)]).expand(8, -1)
    assert torch.equal(batch.mask, expected_mask)
    assert torch.equal(x_positions(batch.targets), batch.info["y"])
    assert torch.all(batch.targets[:, 1::2] == 0)
    assert torch.all(batch.info["clean"][:, 1::2] == 0)


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-12), ("float32", 1e-6)])
def test_y_is_affine_map_plus_gaussian_noise(dtype, tolerance):
    noise = 0.3
    _, batch = sample(batch_size=1000, d_in=4, d_out=2, n_points=16, noise=noise, dtype=dtype)
    info = {key: value.double() for key, value in batch.info.items()}
    clean = torch.einsum("boi,bni->bno", info["U"], info["x"]) + info["b"][:, None, :]
    # The stored clean target is U x + b (up to rounding to the task dtype).
    torch.testing.assert_close(x_positions(info["clean"]), clean, rtol=tolerance, atol=tolerance)
    q = (info["y"] - clean) / noise  # the noise draw, recovered
    assert abs(q.mean().item()) < 0.01
    assert abs(q.std().item() - 1.0) < 0.01
    # And the priors are standard normal too.
    for key in ("U", "b", "x"):
        assert abs(info[key].std().item() - 1.0) < 0.05, key


def test_noise_free_y_equals_clean_target():
    _, batch = sample(d_in=3, n_points=5, noise=0.0, dtype="float64")
    torch.testing.assert_close(batch.info["y"], x_positions(batch.info["clean"]), rtol=0, atol=0)


def test_loss_and_evaluate_of_clean_predictions():
    task, batch = sample(batch_size=64, d_in=4, d_out=2, n_points=10, noise=0.5)
    clean = batch.info["clean"]
    noise_only = (x_positions(batch.targets) - x_positions(clean)).double().square().mean()
    torch.testing.assert_close(task.loss(clean, batch).double(), noise_only, rtol=1e-5, atol=0)
    assert 0.15 < noise_only.item() < 0.35  # ~ noise**2 = 0.25
    metrics = task.evaluate(clean, batch)
    assert metrics["mse"] == 0.0 and metrics["mse_by_examples"] == [0.0] * 10
    # Targets themselves give zero training loss.
    assert task.loss(batch.targets, batch).item() == 0.0


def test_error_by_examples_indexes_queries_by_examples_seen():
    task, batch = sample(d_in=4, n_points=6, noise=0.0)
    outputs = batch.info["clean"].clone()
    outputs[:, 2 * 3] += 2.0  # wrong only at x_4, i.e. after seeing 3 examples
    errors = error_by_examples(outputs, batch)
    assert errors.shape == (6,)
    torch.testing.assert_close(errors, torch.tensor([0, 0, 0, 4.0, 0, 0], dtype=torch.float64))
    # Predicting 0 costs E|U x + b|^2 = d_in + 1 per output at every k.
    _, large = sample(batch_size=2000, d_in=4, n_points=6)
    zeros_mse = task.evaluate(torch.zeros_like(large.targets), large)["mse"]
    assert abs(zeros_mse - 5.0) < 0.25


def test_least_squares_is_exact_once_determined_and_min_norm_before():
    d_in, n_points = 4, 10
    _, batch = sample(batch_size=16, d_in=d_in, n_points=n_points, noise=0.0, dtype="float64")
    outputs = LeastSquares()(batch.inputs)
    errors = error_by_examples(outputs, batch)
    assert torch.all(errors[d_in + 1 :] < 1e-12)
    assert torch.all(errors[1 : d_in + 1] > 1e-3)  # underdetermined: cannot know the map yet
    assert torch.all(x_positions(outputs)[:, 0] == 0)  # nothing seen: predict 0

    # Below d_in + 1 examples, the prediction is that of the minimum-norm interpolant, which lies in the row
    # space of the design matrix: w = F^T (F F^T)^-1 y.
    x, y = batch.info["x"], batch.info["y"]
    features = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)
    for k in range(1, d_in + 1):
        F = features[:, :k]
        weights = F.transpose(1, 2) @ torch.linalg.solve(F @ F.transpose(1, 2), y[:, :k])
        expected = (features[:, k : k + 1] @ weights)[:, 0]
        torch.testing.assert_close(x_positions(outputs)[:, k], expected, rtol=1e-9, atol=1e-9)


def test_least_squares_interpolates_seen_examples_when_underdetermined():
    d_in = 6
    _, batch = sample(batch_size=4, d_in=d_in, n_points=5, noise=0.5, dtype="float64")
    inputs = batch.inputs.clone()
    inputs[:, 2 * 3, :d_in] = inputs[:, 2 * 1, :d_in]  # query x_4 repeats x_2
    outputs = LeastSquares()(inputs)
    torch.testing.assert_close(outputs[:, 2 * 3], batch.info["y"][:, 1], rtol=1e-9, atol=1e-9)


def test_ridge_with_tiny_penalty_recovers_noise_free_map():
    d_in = 4
    _, batch = sample(batch_size=32, d_in=d_in, d_out=2, n_points=10, noise=0.0, dtype="float64")
    outputs = Ridge(lam=1e-12, d_out=2)(batch.inputs)
    errors = (x_positions(outputs) - x_positions(batch.info["clean"])).abs()
    assert errors[:, d_in + 1 :].max() < 1e-6
    assert errors[:, 1 : d_in + 1].max() > 1e-3


def test_ridge_without_penalty_is_least_squares():
    _, batch = sample(batch_size=8, d_in=3, d_out=2, n_points=8, noise=0.2, dtype="float64")
    torch.testing.assert_close(Ridge(0.0, d_out=2)(batch.inputs), LeastSquares(d_out=2)(batch.inputs))


def test_bayes_optimal_ridge_beats_least_squares_on_noisy_data():
    task, batch = sample(batch_size=256, d_in=8, n_points=20, noise=0.5)
    baselines = task.baselines()
    assert set(baselines) == {"least_squares", "ridge"}
    assert baselines["ridge"].lam == pytest.approx(0.25)
    ridge = task.evaluate(baselines["ridge"](batch.inputs), batch)
    least_squares = task.evaluate(baselines["least_squares"](batch.inputs), batch)
    assert ridge["mse"] < 0.8 * least_squares["mse"]
    # Both learn in context: error falls well below the prior's d_in + 1 = 9 by the end.
    assert ridge["mse_by_examples"][-1] < 1.0 and ridge["mse_by_examples"][0] > 5.0


@pytest.mark.parametrize("predictor", [LeastSquares(d_out=2), Ridge(0.1, d_out=2)])
def test_baselines_never_look_ahead(predictor):
    _, batch = sample(batch_size=4, d_in=3, d_out=2, n_points=8, noise=0.1)
    outputs = predictor(batch.inputs)
    generator = torch.Generator().manual_seed(123)
    for k in (0, 2, 4, 7):  # query x_{k+1} sits at position 2k; its own y at 2k + 1 must not matter
        changed = batch.inputs.clone()
        changed[:, 2 * k + 1 :] = torch.randn(changed[:, 2 * k + 1 :].shape, generator=generator)
        changed_outputs = predictor(changed)
        torch.testing.assert_close(changed_outputs[:, : 2 * k + 1], outputs[:, : 2 * k + 1], rtol=0, atol=0)
        if k < 7:  # and the later predictions do change, so the test can fail
            assert not torch.equal(changed_outputs[:, 2 * k + 2], outputs[:, 2 * k + 2])


def test_baselines_ignore_info():
    task, batch = sample(d_in=3, n_points=6)
    stripped = Batch(batch.inputs, batch.targets, batch.mask, info={})
    for predictor in task.baselines().values():
        torch.testing.assert_close(predictor(stripped.inputs), predictor(batch.inputs))


def test_batch_to_moves_everything():
    _, batch = sample(d_in=2, n_points=3)
    moved = batch.to("cpu")
    assert moved.batch_size == 8 and set(moved.info) == set(batch.info)


@settings(max_examples=8, deadline=None)
@given(
    d_in=st.integers(1, 6),
    d_out=st.integers(1, 3),
    n_points=st.integers(1, 8),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_sizes_keep_the_layout(d_in, d_out, n_points, seed):
    task, batch = sample(seed=seed, batch_size=2, d_in=d_in, d_out=d_out, n_points=n_points, dtype="float64")
    assert task.sequence_length == 2 * n_points
    assert task.model_io() == {"d_input": d_in + d_out, "d_output": d_out}
    assert batch.inputs.shape == (2, 2 * n_points, d_in + d_out)
    assert torch.equal(batch.inputs[:, 1::2, d_in:], batch.info["y"])
    assert torch.equal(batch.mask[0], torch.arange(2 * n_points) % 2 == 0)
    for predictor in task.baselines().values():
        outputs = predictor(batch.inputs)
        assert outputs.shape == (2, 2 * n_points, d_out)
        assert torch.all(outputs[:, 1::2] == 0) and torch.all(outputs[:, 0] == 0)
