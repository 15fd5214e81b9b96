import pytest

from incontext.config import ConfigError, parse_overrides
from incontext.train import load_config


def test_defaults_and_yaml_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {n_layer: 2}\ntask: {name: arithmetic, digits: 2}\noptimizer: {lr: 3e-4}\n")
    config = load_config(path, ["run.batch_size=16", "model.positions=rope"])
    assert config.optimizer.lr == pytest.approx(3e-4)  # YAML reads 3e-4 as a string: coerced to float
    model = config.model_config()
    assert model.vocab_size == 16 and model.max_seq_len == config.build_task().sequence_length
    assert model.positions == "rope" and config.run.batch_size == 16


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["optimizer.lrr=1"], r"optimizer: unknown key\(s\) \['lrr'\]; allowed keys: \['name', 'lr'"),
        (["runn.seed=1"], r"unknown key\(s\) \['runn'\]"),
        (["optimizer.lr=fast"], r"TrainConfig.optimizer.lr: 'fast' is not float"),
        (["optimizer.lr=-1"], r"lr must be > 0, got -1.0"),
        (["optimizer.name=adam"], r"optimizer.name: 'adam' is not one of 'adamw', 'sgd'"),
        (["run.batch_size=2.5"], r"run.batch_size: 2.5 is not int"),
        (["run.batch_size=0"], r"batch_size must be >= 1, got 0"),
        (["model.attention=sparse"], r"model.attention: 'sparse' is not one of 'softmax', 'linear'"),
        (["model.n_layers=2"], r"model: unknown key\(s\) \['n_layers'\]"),
        (["model.vocab_size=99"], r"model.vocab_size=99 contradicts the task"),
        (["task.name=linear_regression", "task.d_inn=3"], r"task: .*d_inn"),
        (["task.d_in=3"], r"task.name must name a registered task, got None"),
        (["task.name=regression"], r"task.name: unknown task 'regression'"),
        (["schedule.min_lr_ratio=2"], r"min_lr_ratio must lie in \[0, 1\], got 2.0"),
    ],
)
def test_bad_configs_fail_at_load_naming_key_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="must look like key=value"):
        parse_overrides(["optimizer.lr"])
    with pytest.raises(ConfigError, match="empty key"):
        parse_overrides(["optimizer..lr=1"])
    assert parse_overrides(["a.b=1", "a.c=[1, 2]", "d=x"]) == {"a": {"b": 1, "c": [1, 2]}, "d": "x"}


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_shipped_configs_load():
    from pathlib import Path

    paths = sorted(Path(__file__).resolve().parents[2].joinpath("configs").glob("*.yaml"))
    assert paths
    for path in paths:
        load_config(path).model_config()


def test_the_model_section_is_typed_once_and_loads_back():
    from incontext.models import CGTConfig, CGTLossConfig, TransformerConfig
    from incontext.train.config import config_from_dict

    config = load_config(None, ["task.name=linear_regression", "task.d_in=3", "model.n_layer=2"])
    assert isinstance(config.model, TransformerConfig) and config.model.d_input == config.build_task().model_io()["d_input"] and config.loss is None
    assert config_from_dict(config.to_dict()) == config
    cgt = load_config(None, ["model.kind=cgt", "model.n_layer=2", "model.split_layer=1", "loss.eta=0.5"])
    assert isinstance(cgt.model, CGTConfig) and cgt.loss == CGTLossConfig(eta=0.5) and cgt.model_kind == "cgt"
    assert config_from_dict(cgt.to_dict()) == cgt


def test_a_run_saved_with_the_model_section_as_given_resumes():
    from incontext.train.trainer import _check_resumable

    args = ["task.name=linear_regression", "task.d_in=3", "model.n_layer=2", "model.d_model=16", "model.n_head=2"]
    config = load_config(None, args)
    older = {**config.to_dict(), "model": {"n_layer": 2, "d_model": 16, "n_head": 2}}  # as runs saved it before
    _check_resumable(older, config, "ckpt", force=False)
    with pytest.raises(ConfigError, match=r"model.d_model: 16 -> 32"):
        _check_resumable(older, load_config(None, args + ["model.d_model=32"]), "ckpt", force=False)
