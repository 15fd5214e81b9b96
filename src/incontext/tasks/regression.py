"""In-context linear regression (Garg et al. 2022 style), with an affine map and vector outputs.

Each sequence has its own map: U (d_out x d_in), b (d_out), examples x_i and noise q_i, all N(0, 1), and
y_i = U x_i + b + noise * q_i. The sequence (x_1, y_1, ..., x_N, y_N) is fed as 2N vector tokens of width
d_in + d_out, x in the first d_in slots and y in the last d_out, the other slots zero. The model predicts
y_i at the x_i token, having seen i - 1 examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Batch, Predictor, Task, check_non_negative, check_positive_int
from .registry import register_task

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LinearRegressionConfig:
    d_in: int = 16
    d_out: int = 1
    n_points: int = 64  # examples per sequence; the sequence has 2 * n_points tokens
    noise: float = 0.1  # std of the label noise
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("d_in", "d_out", "n_points"):
            check_positive_int(self, name)
        check_non_negative(self, "noise")
        if self.dtype not in DTYPES:
            raise ValueError(f"LinearRegressionConfig.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


@register_task("linear_regression")
class LinearRegression(Task):
    config_class = LinearRegressionConfig
    config: LinearRegressionConfig

    def model_io(self) -> dict[str, int]:
        return {"d_input": self.config.d_in + self.config.d_out, "d_output": self.config.d_out}

    @property
    def sequence_length(self) -> int:
        return 2 * self.config.n_points

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        cfg, B, N = self.config, batch_size, self.config.n_points
        dtype, device = cfg.torch_dtype, generator.device
        # Draw in at least float32 (randn has no half-precision path everywhere), round to the task dtype,
        # then compute y in float64 from the rounded values so that info is self-consistent.
        draw_dtype = torch.float64 if dtype == torch.float64 else torch.float32

        def normal(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=generator, device=device, dtype=draw_dtype).to(dtype)

        U = normal(B, cfg.d_out, cfg.d_in)
        b = normal(B, cfg.d_out)
        x = normal(B, N, cfg.d_in)
        q = normal(B, N, cfg.d_out)
        clean64 = torch.einsum("boi,bni->bno", U.double(), x.double()) + b.double()[:, None, :]
        y = (clean64 + cfg.noise * q.double()).to(dtype)
        clean = clean64.to(dtype)

        inputs = torch.zeros(B, 2 * N, cfg.d_in + cfg.d_out, dtype=dtype, device=device)
        inputs[:, 0::2, : cfg.d_in] = x
        inputs[:, 1::2, cfg.d_in :] = y
        targets = torch.zeros(B, 2 * N, cfg.d_out, dtype=dtype, device=device)
        targets[:, 0::2] = y  # predict y_i while reading x_i
        clean_targets = torch.zeros_like(targets)
        clean_targets[:, 0::2] = clean
        mask = torch.zeros(B, 2 * N, dtype=torch.bool, device=device)
        mask[:, 0::2] = True
        info = {"clean": clean_targets, "U": U, "b": b, "x": x, "y": y}
        return Batch(inputs=inputs, targets=targets, mask=mask, info=info)

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean squared error against the noisy targets, over masked positions and output dimensions."""
        squared_error = (outputs - batch.targets).square().mean(dim=-1)
        return squared_error[batch.mask].mean()

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        by_examples = error_by_examples(outputs, batch)
        return {"mse_by_examples": by_examples.tolist(), "mse": by_examples.mean().item()}

    def baselines(self) -> dict[str, Predictor]:
        return {
            "least_squares": LeastSquares(d_out=self.config.d_out),
            "ridge": Ridge(lam=self.config.noise**2, d_out=self.config.d_out),
        }


def error_by_examples(outputs: torch.Tensor, batch: Batch | torch.Tensor) -> torch.Tensor:
    """(N,) float64: entry k is the squared error against the clean target U x + b of the prediction at
    x_{k+1} (after seeing k examples), averaged over the batch and output dimensions. `batch`: the sampled
    batch, or its clean targets (B, 2N, d_out) (a slice of them for a model that reads a later part)."""
    clean = batch.info["clean"] if isinstance(batch, Batch) else batch
    squared_error = (outputs.double() - clean.double()).square().mean(dim=-1)  # (B, 2N)
    return squared_error[:, 0::2].mean(dim=0)


class _ExampleByExampleRegressor:
    """Predicts y at each x token by fitting an affine map y ~ W x + c to the examples before it.

    Reads x and y from the inputs themselves (never from batch.info), so it sees exactly what a causal
    model sees. Input (B, T, d_in + d_out) -> output (B, T, d_out): predictions at x tokens, zeros elsewhere.
    """

    def __init__(self, d_out: int = 1):
        self.d_out = d_out

    def fit(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(B, k, p) features, (B, k, d_out) y -> (B, p, d_out) weights."""
        raise NotImplementedError

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        B, T, width = inputs.shape
        d_in = width - self.d_out
        x = inputs[:, 0::2, :d_in].double()
        y = inputs[:, 1::2, d_in:].double()
        features = torch.cat([x, torch.ones_like(x[..., :1])], dim=-1)  # the constant 1 fits the offset c
        predictions = torch.zeros(B, x.shape[1], self.d_out, dtype=torch.float64, device=inputs.device)
        for k in range(1, x.shape[1]):  # k = 0: nothing seen, predict 0 (the prior mean)
            weights = self.fit(features[:, :k], y[:, :k])
            predictions[:, k] = (features[:, k : k + 1] @ weights)[:, 0]
        outputs = torch.zeros(B, T, self.d_out, dtype=inputs.dtype, device=inputs.device)
        outputs[:, 0::2] = predictions.to(inputs.dtype)
        return outputs


class LeastSquares(_ExampleByExampleRegressor):
    """Ordinary least squares; the minimum-norm interpolant while there are fewer examples than unknowns."""

    def fit(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.linalg.pinv(features) @ y  # SVD-based, so rank-deficient systems get the min-norm solution

    def __repr__(self) -> str:
        return f"LeastSquares(d_out={self.d_out})"


class Ridge(_ExampleByExampleRegressor):
    """Ridge regression with penalty lam * ||[W, c]||^2.

    With lam = noise**2 this is the Bayes-optimal predictor for this task: W, c and the label noise are
    Gaussian (N(0, 1) priors, noise std `noise`), so the posterior mean of [W, c] is exactly the ridge solution.
    lam = 0 gives the least-squares / minimum-norm solution.
    """

    def __init__(self, lam: float, d_out: int = 1):
        if not lam >= 0:
            raise ValueError(f"Ridge lam must be >= 0, got {lam!r}")
        super().__init__(d_out)
        self.lam = float(lam)

    def fit(self, features: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        k, p = features.shape[-2:]
        features_t = features.transpose(-1, -2)
        if k <= p:  # dual (kernel) form: a k x k system, invertible even at lam = 0 for generic data
            gram = features @ features_t + self.lam * torch.eye(k, dtype=features.dtype, device=features.device)
            return features_t @ torch.linalg.solve(gram, y)
        gram = features_t @ features + self.lam * torch.eye(p, dtype=features.dtype, device=features.device)
        return torch.linalg.solve(gram, features_t @ y)

    def __repr__(self) -> str:
        return f"Ridge(lam={self.lam}, d_out={self.d_out})"
