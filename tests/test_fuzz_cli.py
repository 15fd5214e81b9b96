"""Bad inputs across the command line, configs, checkpoints and the Python API.

Every case must end in a one-line error (no traceback) with a non-zero exit status, and leave every file that
existed before it byte-for-byte as it was. The command line runs in-process (`incontext.cli.commands`), on a tiny
model, so the whole file takes seconds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from incontext.cli.commands import main
from incontext.config import ConfigError
from incontext.train import load_config, train
from incontext.train.checkpoint import save_checkpoint

TINY = [
    "model.n_layer=1", "model.d_model=8", "model.n_head=2",
    "task.name=linear_regression", "task.d_in=2", "task.n_points=4",
    "schedule.total_steps=4", "schedule.warmup_steps=1",
    "run.batch_size=4", "run.eval_every=0", "run.eval_sequences=8", "run.eval_batch_size=8",
    "run.checkpoint_every=2", "run.log_every=1", "run.tensorboard=false", "run.threads=1",
]
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")


def sets(*items: str) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def tiny(*extra: str) -> list[str]:
    return sets(*TINY, *extra)


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def run_cli(capsys, args: list[str]) -> tuple[int, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code not in (0, None), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("incontext"), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def check_refused(capsys, root: Path, args: list[str], *fragments: str) -> str:
    """The command fails with a one-line error and changes nothing under root."""
    before = snapshot(root)
    code, err = run_cli(capsys, args)
    assert_one_line_error(code, err, *fragments)
    assert snapshot(root) == before, "files changed"
    return err


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny run with checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("trained")
    train(load_config(None, TINY + [f"run.out_dir={root / 'run'}"]), progress=False)
    return root / "run"


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


@pytest.fixture
def task_yaml(tmp_path) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text("task: {name: linear_regression}\n")
    return path


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    return path


def flip_bit(path: Path, offset_from_end: int = 9) -> None:
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0x10
    path.write_bytes(bytes(data))


def drop_digests(checkpoint: Path) -> None:
    """Make a checkpoint look like one written before digests existed (tests the reader's own checks)."""
    state = json.loads((checkpoint / "state.json").read_text())
    state.pop("sha256")
    (checkpoint / "state.json").write_text(json.dumps(state))


# ----------------------------------------------------------------------------- the command line itself

USAGE_ERRORS = [
    ([], "required"),
    (["frobnicate"], "invalid choice"),
    (["train"], "config"),
    (["train", "x.yaml", "--bogus"], "unrecognized"),
    (["eval"], "checkpoint"),
    (["run"], "experiment"),
    (["run", "no-such-experiment", "--help"], "unknown experiment"),
    (["list", "extra"], "unrecognized"),
]


@pytest.mark.parametrize("args, fragment", USAGE_ERRORS)
def test_usage_errors_are_one_line(capsys, tmp_path, args, fragment):
    check_refused(capsys, tmp_path, args, fragment)


@pytest.mark.parametrize("device, fragment", [
    ("foo", "is not cpu, cuda"),
    ("cuda:x", "is not cpu, cuda"),
    ("cpu:0", "is not cpu, cuda"),
    pytest.param("cuda", "no CUDA device", marks=NO_CUDA),
])
def test_eval_device_is_checked(capsys, run_copy, tmp_path, device, fragment):
    check_refused(capsys, tmp_path, ["eval", run_copy, "--device", device], fragment)


# ----------------------------------------------------------------------------- --device / --dtype on every command


def runtime_commands(run_dir: Path, out: Path) -> dict[str, list[str]]:
    """Each command that takes --device/--dtype, with arguments that would otherwise start real work."""
    return {
        "demo": ["demo", "--out", out / "demo"],
        "compare": ["compare", "--model", run_dir, "--task", "linear_regression", "--episodes", "1", "--out", out / "compare"],
        "absorb": ["absorb", "--model", run_dir, "--method", "keep-prompt", "--prompt", "x", "--out", out / "absorb"],
        "generate": ["generate", "--model", run_dir, "hello"],
        "run": ["run", "regression-demo", *sets(*DEMO_TINY), "--out", out / "run"],
        "eval": ["eval", run_dir],
    }


RUNTIME_CASES = [
    (["--device", "gpu"], "is not cpu, cuda"),
    (["--device", "cuda:x"], "is not cpu, cuda"),
    (["--device", "cpu:1"], "is not cpu, cuda"),
    pytest.param(["--device", "cuda"], "no CUDA device", marks=NO_CUDA),
    pytest.param(["--device", "cuda:3"], "no CUDA device", marks=NO_CUDA),
    (["--dtype", "float8"], "invalid choice"),
    (["--dtype", "int64"], "invalid choice"),
]


@pytest.mark.parametrize("command", ["demo", "compare", "absorb", "generate", "run", "eval"])
@pytest.mark.parametrize("extra, fragment", RUNTIME_CASES)
def test_every_command_checks_device_and_dtype_first(capsys, run_copy, tmp_path, command, extra, fragment):
    args = runtime_commands(run_copy, tmp_path / "out")[command] + extra
    check_refused(capsys, tmp_path, args, fragment)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["demo", "compare", "absorb", "generate", "run", "eval"])
def test_a_dtype_the_device_cannot_compute_in_is_refused(capsys, run_copy, tmp_path, monkeypatch, command):
    """float16 where the CPU build cannot run it (older torch builds): one line, nothing written."""
    import incontext.runtime as runtime

    monkeypatch.setattr(runtime, "_supported", lambda device, dtype: None if dtype != torch.float16 else
                        '"addmm_impl_cpu_" not implemented for \'Half\'')
    args = runtime_commands(run_copy, tmp_path / "out")[command] + ["--dtype", "float16"]
    check_refused(capsys, tmp_path, args, "dtype float16 is not supported on cpu")


@pytest.mark.parametrize("extra, fragment", [
    (["--device", "gpu"], "is not cpu, cuda"),
    pytest.param(["--device", "cuda"], "no CUDA device", marks=NO_CUDA),
    (["--device", "cpu:0"], "is not cpu, cuda"),
    (["--dtype", "float16"], "train keeps float32 weights"),
    (["--dtype", "float64"], "train keeps float32 weights"),
    (["--dtype", "int8"], "invalid choice"),
])
def test_train_checks_device_and_dtype(capsys, tmp_path, task_yaml, extra, fragment):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--out", tmp_path / "run", *extra], fragment)
    assert not (tmp_path / "run").exists()


def test_train_takes_device_and_dtype(capsys, tmp_path, task_yaml):
    assert main(["train", str(task_yaml), *tiny(), "--out", str(tmp_path / "run"), "--no-progress",
                 "--device", "cpu", "--dtype", "bfloat16"]) == 0
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "autocast: bf16" in saved and "device: cpu" in saved


def test_run_refuses_a_device_for_an_experiment_without_one(capsys, tmp_path):
    check_refused(capsys, tmp_path, ["run", "regression-demo", "--dtype", "float64", "--out", tmp_path / "o"],
                  "has no dtype setting")


# ----------------------------------------------------------------------------- experiments (run / demo)

DEMO_TINY = ["steps=2", "n_layer=1", "d_model=8", "n_head=2", "n_points=4", "d_in=2", "eval_sequences=8", "warmup=1"]


@pytest.mark.parametrize("args, fragment", [
    (["run", "no-such-experiment"], "unknown experiment"),
    (["run", "regression-demo", *sets("nosuch=1")], "unknown key"),
    (["run", "regression-demo", *sets("steps=abc")], "steps"),
    (["run", "regression-demo", *sets("eval_sequences=0")], "eval_sequences must be >= 1"),
    (["run", "regression-demo", *sets("noise=nan")], "not a finite number"),
    (["run", "regression-demo", *sets("lr=-1")], "lr > 0"),
    (["run", "regression-demo", *sets("steps")], "key=value"),
    (["run", "regression-demo", *sets("=3")], "empty key"),
    (["run", "regression-demo", *sets("lr=inf")], "not a finite number"),
    (["run", "iclca-table1", *sets("pairs=[1")], "not valid YAML"),
    (["run", "cgt-pretrained", *sets("steps=0")], "steps must be >= 1"),
    (["run", "cgt-pretrained", *sets("nosuch=1")], "unknown key"),
    (["run", "linearize-smollm2", *sets("n_features=0")], "n_features must be >= 1"),
    (["run", "linearize-smollm2", *sets("map_lr=-1")], "map_lr > 0"),
    (["run", "linearize-smollm2", *sets("recovery_windows=0")], "recovery_windows must be >= 1"),
    (["run", "linearize-smollm2", *sets("map_data=facts")], "map_data"),
    (["run", "linearize-smollm2", *sets("facts_split=prompt")], "facts_split=prompt needs map_data=plays+facts"),
    (["run", "linearize-smollm2", *sets("conversion_steps=-1")], "conversion_steps must be an integer >= 0"),
    (["run", "linearize-smollm2", *sets("conversion_lr=0")], "conversion_lr > 0"),
    (["run", "linearize-smollm2", *sets("conversion_windows=0")], "conversion_windows must be >= 1"),
    (["run", "linearize-smollm2", *sets("conversion_prompt=256")], "conversion_prompt (256) must be shorter than window_tokens"),
    (["run", "cgt-text", *sets("split_layer=abc")], "split_layer"),
])
def test_bad_experiment_settings(capsys, tmp_path, args, fragment):
    check_refused(capsys, tmp_path, [*args, "--out", tmp_path / "out"], fragment)


def test_experiment_refuses_a_foreign_output_folder(capsys, tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("my own notes")
    check_refused(capsys, tmp_path, ["run", "regression-demo", *sets(*DEMO_TINY), "--out", user], "not empty")


def test_demo_out_runs_does_not_wipe_a_training_run(capsys, tmp_path, trained):
    """The issue's case: `incontext demo --out runs` must not remove runs/train (an `incontext train` run)."""
    runs = tmp_path / "runs"
    shutil.copytree(trained, runs / "train")
    check_refused(capsys, tmp_path, ["run", "regression-demo", *sets(*DEMO_TINY), "--out", runs], "not empty")


def test_experiment_refuses_a_file_as_output_and_another_experiments_folder(capsys, tmp_path):
    write(tmp_path, "file", "x")
    check_refused(capsys, tmp_path, ["run", "regression-demo", *sets(*DEMO_TINY), "--out", tmp_path / "file"], "is a file")
    other = tmp_path / "other"
    other.mkdir()
    (other / ".incontext-experiment").write_text('{"experiment": "amicl"}\n')
    check_refused(capsys, tmp_path, ["run", "regression-demo", *sets(*DEMO_TINY), "--out", other], "'amicl'")


def test_experiment_train_folder_it_did_not_write_is_kept(tmp_path):
    from incontext.train.fresh import train_fresh

    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "data.csv").write_text("1,2\n")
    before = snapshot(tmp_path)
    with pytest.raises(FileExistsError, match="data.csv"):
        train_fresh(tmp_path, {"task": {"name": "linear_regression"}})
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- the config file

BAD_CONFIGS = [
    ("empty.yaml", "", "is empty"),
    ("comments.yaml", "# nothing here\n", "is empty"),
    ("braces.yaml", "{}\n", "is empty"),
    ("unclosed.yaml", "task: {name: linear_regression\nrun: {}\n", ":2:4: not valid YAML"),
    ("tabs.yaml", "task:\n\tname: x\n", ":2:1: not valid YAML"),
    ("list.yaml", "- task\n- run\n", "top level must be a mapping"),
    ("scalar.yaml", "42\n", "top level must be a mapping"),
    ("duplicate.yaml", "task: {name: linear_regression}\nrun: {}\nrun: {seed: 1}\n", ":3:1: not valid YAML: duplicate key 'run'"),
    ("binary.yaml", b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a text (UTF-8) file"),
    ("section.yaml", "task: {name: linear_regression}\nmodels: {}\n", "unknown key(s) ['models']"),
    ("key.yaml", "task: {name: linear_regression}\noptimizer: {learning_rate: 1}\n", "learning_rate"),
    ("notmap.yaml", "task: {name: linear_regression}\noptimizer: 3\n", "TrainConfig.optimizer: 3"),
    ("nan.yaml", "task: {name: linear_regression}\noptimizer: {lr: .nan}\n", "not a finite number"),
    ("inf.yaml", "task: {name: linear_regression}\nschedule: {min_lr_ratio: .inf}\n", "not a finite number"),
    ("noname.yaml", "task: {d_in: 3}\n", "task.name must name"),
]


@pytest.mark.parametrize("name, content, fragment", BAD_CONFIGS, ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_files(capsys, tmp_path, name, content, fragment):
    path = write(tmp_path, name, content)
    check_refused(capsys, tmp_path, ["train", path, "--out", tmp_path / "out"], fragment)


def test_config_that_is_missing_or_a_folder(capsys, tmp_path):
    check_refused(capsys, tmp_path, ["train", tmp_path / "nope.yaml"], "does not exist")
    (tmp_path / "folder.yaml").mkdir()
    check_refused(capsys, tmp_path, ["train", tmp_path / "folder.yaml"], "is a folder, not a YAML file")


BAD_OVERRIDES = [
    ("optimizer.grad_clip=nan", "optimizer.grad_clip: 'nan' is not a finite number"),
    ("optimizer.weight_decay=nan", "weight_decay: 'nan' is not a finite number"),
    ("optimizer.weight_decay=.nan", "not a finite number"),
    ("optimizer.lr=inf", "optimizer.lr: 'inf' is not a finite number"),
    ("optimizer.lr=-1e-3", "lr must be > 0"),
    ("optimizer.betas=[0.9, nan]", "not a finite number"),
    ("optimizer.eps=0", "eps > 0"),
    ("optimizer.name=adam", "optimizer.name"),
    ("schedule.min_lr_ratio=nan", "not a finite number"),
    ("schedule.total_steps=0", "total_steps must be >= 1"),
    ("task.dtype=float64", "task.dtype='float64'"),
    ("task.noise=nan", "task.noise: 'nan' is not a finite number"),
    ("task.name=nosuch", "unknown task 'nosuch'"),
    ("task.d_in=abc", "task.d_in: 'abc' is not int"),
    ("task.colour=red", "unknown key(s) ['colour']"),
    ("model.dropout=nan", "not a finite number"),
    ("model.d_model=15", "not divisible by n_head"),
    ("model.kind=rnn", "model.kind='rnn'"),
    ("model.vocab_size=10", "contradicts the task"),
    ("run.batch_size=0", "batch_size must be >= 1"),
    ("run.batch_size=1.5", "run.batch_size: 1.5 is not int"),
    ("run.device=tpu", "run.device"),
    ("run.eval_sequences=0", "eval_sequences must be >= 1"),
    ("run.checkpoint_every=-1", "checkpoint_every must be >= 0"),
    ("run=[1", "not valid YAML"),
    ("loss.eta=0.5", "model.kind=cgt only"),
    pytest.param("run.device=cuda", "no CUDA device", marks=NO_CUDA),
]


@pytest.mark.parametrize("override, fragment", BAD_OVERRIDES)
def test_bad_overrides(capsys, tmp_path, task_yaml, override, fragment):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(override), "--out", tmp_path / "out"], fragment)


def test_batch_not_divisible_by_accumulation(capsys, tmp_path, task_yaml):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny("run.batch_size=6", "run.grad_accum=4"),
                                     "--out", tmp_path / "out"], "must be divisible")


def test_force_without_resume(capsys, tmp_path, task_yaml):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--force", "--out", tmp_path / "out"],
                  "--force only applies with --resume")


# ----------------------------------------------------------------------------- run folders and resuming


def test_fresh_run_refuses_a_foreign_folder_and_a_file(capsys, tmp_path, task_yaml):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "results.json").write_text('{"mine": true}')
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--out", user], "not empty")
    write(tmp_path, "afile", "x")
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--out", tmp_path / "afile"], "is a file")


def test_fresh_run_over_checkpoints_is_refused(capsys, tmp_path, run_copy, task_yaml):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--out", run_copy], "--resume")


def test_fresh_run_over_a_dangling_latest_is_refused(capsys, tmp_path, run_copy, task_yaml):
    """`latest` names a folder without state.json: the older intact checkpoint still counts."""
    (run_copy / "checkpoints" / "step_00000004" / "state.json").unlink()
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--out", run_copy], "already holds checkpoints")


def test_resume_without_a_checkpoint(capsys, tmp_path, task_yaml):
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(), "--resume", "--out", tmp_path / "none"], "no checkpoint")


@pytest.mark.parametrize("change, fragment", [
    ("run.batch_size=8", "run.batch_size: 4 -> 8"),
    ("run.seed=1", "run.seed: 0 -> 1"),
    ("model.d_model=16", "model.d_model: 8 -> 16"),
    ("task.noise=0.5", "task.noise"),
    ("optimizer.lr=0.1", "optimizer.lr"),
])
def test_resume_with_a_changed_config_is_refused(capsys, tmp_path, run_copy, task_yaml, change, fragment):
    (run_copy / "checkpoints" / "latest").write_text("step_00000002\n")
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny(change), "--resume", "--out", run_copy],
                  fragment, "--force")


def test_training_that_diverges_writes_no_weights(capsys, tmp_path, task_yaml):
    """The issue's case (lr=inf is now refused at load; 3e38 without clipping overflows in the first update)."""
    out = tmp_path / "out"
    diverge = ["optimizer.name=sgd", "optimizer.lr=3e38", "optimizer.grad_clip=null", "run.checkpoint_every=1"]
    code, err = run_cli(capsys, ["train", task_yaml, *tiny(*diverge),
                                 "--no-progress", "--out", out])
    assert_one_line_error(code, err, "after the update of step 1", "no finite checkpoint")
    assert code == 3
    assert not list((out / "checkpoints").glob("step_*")) and not (out / "results.json").exists()


# ----------------------------------------------------------------------------- damaged checkpoints


def model_file(run: Path, step: int = 4) -> Path:
    return run / "checkpoints" / f"step_{step:08d}" / "model.safetensors"


def optimizer_file(run: Path, step: int = 4) -> Path:
    return run / "checkpoints" / f"step_{step:08d}" / "optimizer.safetensors"


def state_file(run: Path, step: int = 4) -> Path:
    return run / "checkpoints" / f"step_{step:08d}" / "state.json"


def damage(run: Path, how: str) -> str:
    """Damage the newest checkpoint of `run`; returns a fragment the error must contain."""
    if how == "flipped bit in weights":
        flip_bit(model_file(run))
        return "model.safetensors is corrupt: its sha256"
    if how == "flipped bit in optimizer":
        flip_bit(optimizer_file(run))
        return "optimizer.safetensors is corrupt: its sha256"
    if how == "truncated weights":
        model_file(run).write_bytes(model_file(run).read_bytes()[:100])
        return "model.safetensors is corrupt"
    if how == "weights header":
        data = model_file(run).read_bytes()
        model_file(run).write_bytes(b"\xff" * 8 + data[8:])
        return "model.safetensors is corrupt"
    if how == "truncated weights, no digests":
        drop_digests(model_file(run).parent)
        model_file(run).write_bytes(model_file(run).read_bytes()[:100])
        return "model.safetensors is corrupt: Error while deserializing header"
    if how == "weights header, no digests":
        drop_digests(model_file(run).parent)
        data = model_file(run).read_bytes()
        model_file(run).write_bytes(b"\xff" * 8 + data[8:])
        return "model.safetensors is corrupt: Error while deserializing header"
    if how == "empty weights file":
        model_file(run).write_bytes(b"")
        return "model.safetensors is corrupt"
    if how == "missing weights":
        model_file(run).unlink()
        return "model.safetensors is missing"
    if how == "state.json not JSON":
        state_file(run).write_text('{"step": 4,\n "config": }\n')
        return "state.json:2:12: corrupt, not valid JSON"
    if how == "state.json without step":
        state = json.loads(state_file(run).read_text())
        del state["step"]
        state_file(run).write_text(json.dumps(state))
        return "needs an integer `step`"
    if how == "state.json binary":
        state_file(run).write_bytes(b"\xff\xfe\x00garbage")
        return "state.json is corrupt: not UTF-8"
    if how == "state.json bad config":
        state = json.loads(state_file(run).read_text())
        state["config"]["optimizer"]["lr"] = -1
        state_file(run).write_text(json.dumps(state))
        return "lr must be > 0"
    raise AssertionError(how)


DAMAGE = ["flipped bit in weights", "truncated weights", "weights header", "truncated weights, no digests",
          "weights header, no digests", "empty weights file", "missing weights", "state.json not JSON",
          "state.json without step", "state.json binary", "state.json bad config"]


@pytest.mark.parametrize("how", DAMAGE)
def test_eval_of_a_damaged_checkpoint(capsys, tmp_path, run_copy, how):
    fragment = damage(run_copy, how)
    check_refused(capsys, tmp_path, ["eval", run_copy / "checkpoints" / "step_00000004"], fragment)


@pytest.mark.parametrize("how", ["flipped bit in weights", "flipped bit in optimizer", "truncated weights",
                                 "state.json not JSON"])
def test_resume_from_a_damaged_checkpoint(capsys, tmp_path, run_copy, task_yaml, how):
    (run_copy / "checkpoints" / "latest").write_text("step_00000004\n")
    fragment = damage(run_copy, how)
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny("schedule.total_steps=6"), "--resume", "--out", run_copy],
                  fragment)


def test_resume_from_non_finite_weights_is_refused(capsys, tmp_path, run_copy, task_yaml):
    """A checkpoint written before non-finite weights were caught (no digests, NaN inside)."""
    from safetensors.torch import load_file, save_file

    path = model_file(run_copy)
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(path))
    drop_digests(path.parent)
    check_refused(capsys, tmp_path, ["train", task_yaml, *tiny("schedule.total_steps=6"), "--resume", "--out", run_copy],
                  "holds non-finite values")
    check_refused(capsys, tmp_path, ["eval", run_copy], "holds non-finite values")


@pytest.mark.parametrize("target", ["missing", "run-without-checkpoints", "a-file"])
def test_eval_of_something_that_is_no_checkpoint(capsys, tmp_path, target):
    path = tmp_path / target
    if target == "run-without-checkpoints":
        path.mkdir()
        (path / "metrics.jsonl").write_text("")
    elif target == "a-file":
        path.write_text("hello")
    check_refused(capsys, tmp_path, ["eval", path], "no checkpoint at")


# ----------------------------------------------------------------------------- the Python API


def api_error(call) -> str:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def models():
    from incontext import Transformer, TransformerConfig

    torch.manual_seed(0)
    vectors = Transformer(TransformerConfig(n_layer=2, d_model=8, n_head=2, d_input=3, d_output=1, max_seq_len=8))
    tokens = Transformer(TransformerConfig(n_layer=2, d_model=8, n_head=2, vocab_size=11, max_seq_len=8))
    return vectors.eval(), tokens.eval()


def test_api_float64_inputs_to_a_float32_model(models):
    vectors, _ = models
    assert "inputs are torch.float64 but the model is torch.float32" in api_error(
        lambda: vectors(torch.randn(2, 4, 3, dtype=torch.float64)))


def test_api_cache_of_the_wrong_size_and_bad_sizes(models):
    from incontext import Cache

    _, tokens = models
    ids = torch.randint(0, 11, (1, 3))
    assert "the cache has 3 layers but the model has 2" in api_error(lambda: tokens(ids, cache=Cache.empty(3)))
    assert "the cache has 1 layers" in api_error(lambda: tokens.generate(ids, 2, cache=Cache.empty(1)))
    assert "n_layer >= 1" in api_error(lambda: Cache.empty(0))
    assert "n_layer >= 1" in api_error(lambda: Cache.empty(-2))
    assert "position >= 0" in api_error(lambda: Cache.empty(2, position=-1))


def test_api_generate_arguments(models):
    _, tokens = models
    ids = torch.randint(0, 11, (1, 3))
    assert "max_new_tokens must be an integer >= 0" in api_error(lambda: tokens.generate(ids, -1))
    assert "max_new_tokens must be an integer >= 0" in api_error(lambda: tokens.generate(ids, 1.5))
    assert "top_k must be >= 1" in api_error(lambda: tokens.generate(ids, 2, greedy=False, top_k=0))
    assert "temperature > 0" in api_error(lambda: tokens.generate(ids, 2, greedy=False, temperature=0.0))
    assert "token ids must lie in" in api_error(lambda: tokens.generate(torch.tensor([[11]]), 2))
    assert torch.equal(tokens.generate(ids, 0), ids)  # zero new tokens is allowed: the prompt comes back


def test_api_config_values(tmp_path):
    for overrides, fragment in [(["optimizer.lr=nan"], "not a finite number"),
                                (["task.name=linear_regression", "task.dtype=float64"], "task.dtype"),
                                (["optimizer.lr=1e39"], "float32 range"),
                                (["optimizer.grad_clip=-inf"], "not a finite number")]:
        with pytest.raises(ConfigError, match=fragment) as info:
            load_config(None, overrides)
        assert "\n" not in str(info.value)


def test_api_adapted_model_with_a_flipped_bit(models, tmp_path):
    from incontext.absorb import get_absorb_method
    from incontext.absorb.protocol import AdaptedModel

    _, tokens = models
    folder = get_absorb_method("keep-prompt").absorb(tokens, torch.randint(0, 11, (1, 4))).save(tmp_path / "adapted")
    assert json.loads((folder / "adapted.json").read_text())["sha256"]
    AdaptedModel.load(folder)  # intact: loads
    flip_bit(folder / "adapted.safetensors", offset_from_end=3)
    assert "adapted.safetensors is corrupt" in api_error(lambda: AdaptedModel.load(folder))


def test_api_checkpoint_loading(tmp_path, models):
    from incontext.train.checkpoint import load_weights

    _, tokens = models
    path = save_checkpoint(tmp_path, 1, tokens, None, {})
    flip_bit(path / "model.safetensors")
    assert "model.safetensors is corrupt" in api_error(lambda: load_weights(path, tokens))


@pytest.mark.parametrize("config, fragment", [
    ("[1, 2]", "is not a JSON object"),
    ("{bad", "is not valid JSON"),
    ('{"model_type": "llama"}', "transformers cannot load this model"),
    ('{"model_type": "no-such-family"}', "transformers cannot load this model"),
])
@pytest.mark.parametrize("command", ["generate", "absorb", "compare"])
def test_a_damaged_hugging_face_folder_is_one_line(capsys, tmp_path, config, fragment, command):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config)
    args = {"generate": ["generate", "--model", folder, "hi"],
            "absorb": ["absorb", "--model", folder, "--method", "keep-prompt", "--prompt", "x", "--out", tmp_path / "o"],
            "compare": ["compare", "--model", folder, "--task", "facts", "--episodes", "1", "--out", tmp_path / "c"]}[command]
    check_refused(capsys, tmp_path, args, fragment)
