from dataclasses import dataclass

import pytest
import torch

from incontext.tasks import registry

from incontext.tasks import (
    ArithmeticConfig,
    Batch,
    LinearRegressionConfig,
    Task,
    get_task,
    list_tasks,
    register_task,
)


def test_lists_both_tasks():
    assert {"linear_regression", "arithmetic"} <= set(list_tasks())


def test_get_task_applies_overrides():
    task = get_task("linear_regression", d_in=5, n_points=7, noise=0.0)
    assert isinstance(task.config, LinearRegressionConfig)
    assert (task.config.d_in, task.config.n_points, task.config.noise) == (5, 7, 0.0)
    assert task.name == "linear_regression"
    assert task.model_io() == {"d_input": 6, "d_output": 1}
    assert task.sequence_length == 14

    task = get_task("arithmetic", digits=2, a_range=[0, 5])  # lists (as from YAML) are accepted
    assert isinstance(task.config, ArithmeticConfig)
    assert task.config.a_range == (0.0, 5.0)
    assert task.model_io() == {"vocab_size": 16}


def test_unknown_task_lists_registered_tasks():
    with pytest.raises(KeyError) as excinfo:
        get_task("linear_regresion")
    message = str(excinfo.value)
    assert "linear_regresion" in message and "linear_regression" in message and "arithmetic" in message


def test_unknown_config_key_names_key_and_allowed_keys():
    with pytest.raises(ValueError) as excinfo:
        get_task("linear_regression", dim=3)
    message = str(excinfo.value)
    assert "'dim'" in message
    for key in ("d_in", "d_out", "n_points", "noise", "dtype"):
        assert key in message


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        ("linear_regression", {"d_in": 0}, "d_in"),
        ("linear_regression", {"d_out": -1}, "d_out"),
        ("linear_regression", {"n_points": 2.5}, "n_points"),
        ("linear_regression", {"noise": -0.1}, "noise"),
        ("linear_regression", {"noise": float("nan")}, "noise"),
        ("linear_regression", {"dtype": "float8"}, "dtype"),
        ("arithmetic", {"n_tasks": 0}, "n_tasks"),
        ("arithmetic", {"n_ex": -2}, "n_ex"),
        ("arithmetic", {"digits": 0}, "digits"),
        ("arithmetic", {"a_range": (3.0, 1.0)}, "a_range"),
        ("arithmetic", {"b_range": (0.2, 0.8), "integer_coefficients": True}, "b_range"),
    ],
)
def test_invalid_values_raise_naming_the_field(name, overrides, field):
    with pytest.raises(ValueError, match=field):
        get_task(name, **overrides)


def test_register_task_and_default_baselines():
    try:
        _check_register_task()
    finally:
        registry.TASKS.unregister("test_constant")  # leave the global registry as we found it


def _check_register_task():
    @dataclass
    class ConstantConfig:
        length: int = 3

    @register_task("test_constant")
    class Constant(Task):
        config_class = ConstantConfig

        def model_io(self):
            return {"vocab_size": 2}

        @property
        def sequence_length(self):
            return self.config.length

        def sample(self, batch_size, generator):
            tokens = torch.zeros(batch_size, self.config.length, dtype=torch.long)
            return Batch(tokens, tokens, torch.ones_like(tokens, dtype=torch.bool))

        def loss(self, outputs, batch):
            return outputs.sum()

        def evaluate(self, outputs, batch):
            return {}

    task = get_task("test_constant", length=5)
    assert isinstance(task, Constant) and task.name == "test_constant" and task.config.length == 5
    assert task.baselines() == {}
    assert "test_constant" in list_tasks()
    batch = task.sample(2, torch.Generator()).to("cpu")
    assert batch.inputs.shape == (2, 5) and batch.info == {}
