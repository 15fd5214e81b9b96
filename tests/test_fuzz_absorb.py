"""Bad inputs to the absorb side of the command line: `absorb`, `generate`, `compare` and `demo`.

Each case must end in one line on stderr with exit status 2, leave every file that existed before it (the models,
the absorb folders, a user's folders) byte for byte as it was, and write nothing of its own (nothing non-finite
above all). The cases are grouped as the guarantees are: typed method options, no non-finite or exploded weights,
output folders owned by their marker, a harness that does not crash on a model it cannot serve, damaged inputs.
Tiny models (a random 2-layer Llama with a BPE tokenizer, a 2-step CGT run), so the file takes about a minute.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from test_cli_absorb import PROMPT, tiny_llama  # noqa: E402
from test_fuzz_cli import assert_one_line_error, run_cli, snapshot  # noqa: E402

from incontext.absorb import absorb_methods, get_absorb_method  # noqa: E402
from incontext.absorb.protocol import method_options  # noqa: E402
from incontext.outputs import EXPERIMENT_MARKER  # noqa: E402
from incontext.train import load_config, train  # noqa: E402

CGT_TINY = ["model.kind=cgt", "model.n_layer=2", "model.split_layer=1", "model.d_x=16", "model.n_head_x=2", "model.d_y=8",
            "model.n_head_y=1", "model.rank=2", "model.n_templates=2", "task.name=arithmetic", "task.n_tasks=2",
            "task.n_ex=4", "task.digits=2", "schedule.total_steps=2", "schedule.warmup_steps=1", "run.batch_size=4",
            "run.eval_every=0", "run.eval_sequences=8", "run.checkpoint_every=2", "run.tensorboard=false"]
QUICK = ["progress=false", "study.n_questions=0", "study.n_continuations=0"]  # distill-lora / kv-prefix in a second


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """LLAMA (a Hugging Face folder), OTHER (the same config, other weights), CGT (a CGT run on arithmetic), KEEP and
    LORA (absorb folders of LLAMA)."""
    from incontext.cli.commands import main

    root = tmp_path_factory.mktemp("world")
    tiny_llama(root / "LLAMA", seed=0)
    tiny_llama(root / "OTHER", seed=1)
    train(load_config(None, CGT_TINY + [f"run.out_dir={root / 'CGT'}"]), progress=False)
    for name, method, options in (("KEEP", "keep-prompt", []), ("LORA", "distill-lora", ["steps=1", *QUICK])):
        argv = ["absorb", "--model", str(root / "LLAMA"), "--method", method, "--prompt", PROMPT, "--out", str(root / name)]
        assert main(argv + [x for o in options for x in ("--set", o)]) == 0
    return root


def resolve(args: list, world: Path, tmp: Path) -> list[str]:
    """LLAMA, OTHER, CGT: the shared models; KEEP, LORA: copies of the absorb folders in tmp; OUT: tmp/out; X: tmp/X
    (also after path=, a task's file)."""
    out = []
    for arg in args:
        arg = str(arg)
        if arg.startswith("path="):  # a task's file option (--set path=FILE): its value resolved as an argument
            out.append("path=" + resolve([arg.removeprefix("path=")], world, tmp)[0])
            continue
        head, _, rest = arg.partition("/")
        if head in ("LLAMA", "OTHER", "CGT"):
            arg = str(world / arg)
        elif head in ("KEEP", "LORA"):
            if not (tmp / head).exists():
                shutil.copytree(world / head, tmp / head)
            arg = str(tmp / arg)
        elif head in ("OUT", "FILE", "DIR", "FOREIGN", "RESULTS", "PROMPTS", "COMPARE", "DEMO", "LEGACY"):
            arg = str(tmp / arg)
        out.append(arg)
    return out


def refused(capsys, world: Path, tmp: Path, args: list, *fragments: str) -> str:
    """The command exits 2 with one line naming `fragments`, touches no file of the world or of tmp, and writes
    no output folder."""
    argv = resolve(args, world, tmp)
    before, world_before = snapshot(tmp), snapshot(world)
    code, err = run_cli(capsys, argv)
    assert_one_line_error(code, err, *fragments)
    assert code == 2, err
    assert snapshot(tmp) == before, "files changed"
    assert snapshot(world) == world_before, "the shared models or absorb folders changed"
    assert not (tmp / "OUT").exists()
    return err


def absorb_args(method: str, *options: str, out: str = "OUT") -> list[str]:
    return ["absorb", "--model", "LLAMA", "--method", method, "--prompt", PROMPT, "--out", out,
            *[x for option in options for x in ("--set", option)]]


def compare_args(*extra: str, model: str = "LLAMA", task: str = "facts", out: str = "OUT") -> list[str]:
    return ["compare", "--model", model, "--task", task, "--episodes", "1", "--out", out, *extra]


# ----------------------------------------------------------------------------- 1. typed method options

OPTION_CASES = [
    ("kv-press", ["press=kvzap"], "press=kvzap needs trained weights"),
    ("kv-press", ["press=knorm", "weights=somewhere"], "weights are read only by press=kvzap"),
    ("kv-press", ["press=knorm", "select=kvpress"], "select is read only by press=kvzap"),
    ("kv-press", ["press=kvzap", "select=best"], "select must be one of global, kvpress"),
    ("keep-prompt", ["colour=red"], "keep-prompt: unknown option 'colour'; options: (none)"),
    ("drop-prompt", ["steps=1"], "drop-prompt: unknown option 'steps'"),
    ("dynamic-eval", ["steps=3"], "unknown option 'steps'; options: learning_rate, n_steps"),
    ("dynamic-eval", ["n_steps=1.5"], "n_steps must be an integer >= 1, got 1.5"),
    ("dynamic-eval", ["n_steps=0"], "n_steps must be an integer >= 1, got 0"),
    ("dynamic-eval", ["n_steps=true"], "n_steps must be an integer >= 1, got True"),
    ("dynamic-eval", ["n_steps=three"], "n_steps must be an integer"),
    ("dynamic-eval", ["learning_rate=inf"], "learning_rate must be a finite number > 0, got 'inf'"),
    ("dynamic-eval", ["learning_rate=nan"], "learning_rate must be a finite number > 0, got 'nan'"),
    ("dynamic-eval", ["learning_rate=.inf"], "learning_rate must be a finite number > 0, got inf"),
    ("dynamic-eval", ["learning_rate=-1e-3"], "learning_rate must be a finite number > 0, got -0.001"),
    ("dynamic-eval", ["learning_rate=0"], "learning_rate must be a finite number > 0, got 0"),
    ("dynamic-eval", ["learning_rate=fast"], "learning_rate must be a finite number > 0, got 'fast'"),
    ("dynamic-eval", ["learning_rate=[1e-3]"], "learning_rate must be a finite number > 0"),
    ("dynamic-eval", ["keep_prompt=maybe"], "keep_prompt must be true or false, got 'maybe'"),
    ("dynamic-eval", ["keep_prompt=1"], "keep_prompt must be true or false, got 1"),
    ("dynamic-eval", ["reduction=max"], "reduction must be one of sum, mean, got 'max'"),
    ("dynamic-eval", ["optimizer=adam"], "optimizer must be one of sgd, adamw, got 'adam'"),
    ("dynamic-eval", ["separator=x"], "separator must be a list of integers (or null), got 'x'"),
    ("dynamic-eval", ["separator=[1.5]"], "separator must be a list of integers"),
    ("dynamic-eval", ["lora_rank=0"], "lora_rank must be an integer >= 1 (or null), got 0"),
    ("dynamic-eval", ["lora_alpha=nan"], "lora_alpha must be a finite number > 0 (or null)"),
    ("dynamic-eval", ["seed=-1"], "seed must be an integer >= 0, got -1"),
    ("dynamic-eval", ["n_top_layers=0"], "n_top_layers must be an integer >= 1 (or null), got 0"),
    ("dynamic-eval", ["params=nosuch"], "nosuch"),
    ("distill-lora", ["learning_rate=inf"], "distill-lora: learning_rate must be a finite number > 0"),
    ("distill-lora", ["rank=2.5"], "rank must be an integer >= 1, got 2.5"),
    ("distill-lora", ["steps=-1"], "steps must be an integer >= 0, got -1"),
    ("distill-lora", ["min_improvement=-0.5"], "min_improvement must be a finite number >= 0 and <= 1, got -0.5"),
    ("kv-prefix", ["min_improvement=1.5"], "min_improvement must be a finite number >= 0 and <= 1, got 1.5"),
    ("distill-lora", ["study.top_k=0"], "top_k must be an integer >= 1 (or null), got 0"),
    ("distill-lora", ["merge=maybe"], "merge must be true or false"),
    ("distill-lora", ["target_modules=[1, 2]"], "target_modules must be a list of strings or a string"),
    ("distill-lora", ["target_modules=attn.q"], "target_modules must be a non-empty subset"),
    ("distill-lora", ["study.cache=3"], "cache must be a string, got 3"),
    ("distill-lora", ["study.window_tokens=0"], "window_tokens must be an integer >= 1, got 0"),
    ("kv-prefix", ["prefix_tokens=-1"], "prefix_tokens must be an integer >= 1 (or null), got -1"),
    ("kv-prefix", ["batch_size=0"], "batch_size must be an integer >= 1, got 0"),
    ("kv-prefix", ["study.temperature=inf"], "temperature must be a finite number > 0"),
    ("kv-prefix", ["tail=2"], "tail must be true or false, got 2"),
    ("kv-prefix", ["study.window_tokens=0"], "kv-prefix.study: window_tokens must be an integer >= 1, got 0"),
    ("kv-prefix", ["window_tokens=8"], "kv-prefix: window_tokens is an option of study: give study.window_tokens=VALUE"),
    ("distill-lora", ["study=3"], "distill-lora: study holds options: give study.OPTION=VALUE"),
    ("iclca-approx", ["exact_sinks=-1"], "exact_sinks must be an integer >= 0, got -1"),
    ("iclca-approx", ["n_features=0"], "n_features must be an integer >= 1, got 0"),
    ("iclca-approx", ["orthogonal=2"], "orthogonal must be true or false, got 2"),
    ("iclca-approx", ["features=[1]"], "features must be a string, got [1]"),
    ("tint", ["learning_rate=nan"], "tint: learning_rate must be a finite number > 0"),
    ("tint", ["shards=0"], "shards must be an integer >= 1, got 0"),
    ("tint", ["n_simulation_layers=1.5"], "n_simulation_layers must be an integer >= 1 (or null), got 1.5"),
    ("tint", ["ln_eps=-1"], "ln_eps must be a finite number > 0, got -1"),
    ("tint", ["n_steps=0"], "tint: n_steps must be an integer >= 1, got 0"),
    ("dynamic-eval", ["learning_rate=1e300"],
     "dynamic-eval: learning_rate must be a finite number > 0 and <= 3.40282e+38 (the largest finite float32"),
    ("dynamic-eval", ["learning_rate=1" + "0" * 400], "learning_rate must be a finite number > 0, got 1000"),
    ("distill-lora", ["alpha=1e39", *QUICK], "distill-lora: alpha must be a finite number > 0 and <= 3.40282e+38"),
    ("kv-prefix", ["study.temperature=-1e39"], "kv-prefix.study: temperature must be a finite number > 0, got -1e+39"),
    ("kv-prefix", ["argmax_weight=3.5e38"], "kv-prefix: argmax_weight must be a finite number >= 0 and <= 3.40282e+38"),
    ("tint", ["learning_rate=1e39"], "tint: learning_rate must be a finite number > 0 and <= 3.40282e+38"),
    ("cgt-fold", ["adapter=3"], "adapter must be a string, got 3"),
]


@pytest.mark.parametrize("method, options, fragment", OPTION_CASES, ids=[f"{m}-{o[0]}" for m, o, _ in OPTION_CASES])
def test_absorb_refuses_bad_method_options(capsys, world, tmp_path, method, options, fragment):
    refused(capsys, world, tmp_path, absorb_args(method, *options), fragment)


@pytest.mark.parametrize("extra, fragment", [
    (["--set", "dynamic-eval.n_steps=1.5"], "dynamic-eval: n_steps must be an integer >= 1, got 1.5"),
    (["--set", "distill-lora.learning_rate=inf"], "distill-lora: learning_rate must be a finite number > 0"),
    (["--set", "kv-prefix.init=zeros"], "init must be one of auto, document, document-spread, press, press-rerotated, got 'zeros'"),
    (["--set", "iclca-approx.exact_sinks=-1"], "exact_sinks must be an integer >= 0"),
    (["--set", "kv-prefix.chunk_tokens=-1"], "kv-prefix: chunk_tokens is an option of study: give study.chunk_tokens=VALUE"),
    (["--set", "distill-lora.study.chunk_tokens=x"], "distill-lora.study: chunk_tokens must be an integer >= 0"),
    (["--set", "distill-lora.argmax_weight=nan"], "distill-lora: argmax_weight must be a finite number >= 0"),
    (["--set", "kv-prefix.objective=next-token"], "kv-prefix: unknown option 'objective'"),
    (["--tune", "dynamic-eval.learning_rate=1e-3,abc"], "learning_rate must be a finite number > 0, got 'abc'"),
    (["--tune", "dynamic-eval.learning_rate=[1"], "is not a valid YAML scalar"),
    (["--tune", "dynamic-eval.speed=1,2"], "dynamic-eval: unknown option 'speed'"),
    (["--tune", "dynamic-eval.n_steps=1,2.5"], "n_steps must be an integer >= 1, got 2.5"),
    (["--tune", "dynamic-eval.learning_rate=1e-3", "--validation-episodes", "0"], "--validation-episodes must be >= 1, got 0"),
    (["--tune", "dynamic-eval.learning_rate=1e-3", "--validation-episodes", "-3"], "--validation-episodes must be >= 1, got -3"),
    (["--methods", "iclca", "--tune", "dynamic-eval.learning_rate=1e-3"], "'dynamic-eval' is not among the compared methods"),
])
def test_compare_refuses_bad_method_options_and_tuning(capsys, world, tmp_path, extra, fragment):
    refused(capsys, world, tmp_path, compare_args(*extra), fragment)


WRONG_VALUES = st.one_of(st.text(max_size=6), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3),
                         st.booleans(), st.none(), st.lists(st.integers(-2, 2), max_size=2),
                         st.lists(st.floats(allow_nan=True), min_size=1, max_size=2),
                         st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@given(data=st.data())
def test_random_option_values_are_taken_typed_or_refused_in_one_line(data):
    """Any value for any option of any registered method (and any unknown option): the method is built with values
    of the declared types, or the refusal is one ValueError (OSError for a features folder that does not exist)."""
    name = data.draw(st.sampled_from(absorb_methods()))
    option = data.draw(st.sampled_from(method_options(name) + ["no_such_option"]))
    value = data.draw(WRONG_VALUES)
    try:
        get_absorb_method(name, **{option: value})
    except (ValueError, OSError) as error:
        assert "\n" not in str(error) and str(error).strip(), error
        return
    assert option in method_options(name)
    if isinstance(value, float):
        assert value == value and abs(value) != float("inf"), (name, option, value)  # NaN, inf never accepted
    if isinstance(value, dict):
        raise AssertionError(f"{name}.{option} took a mapping {value!r}")


@pytest.mark.parametrize("name", sorted(absorb_methods()))
def test_no_option_takes_nan_or_a_mapping(name):
    import dataclasses

    from incontext.absorb.protocol import METHODS

    groups = {f.name: f.default_factory for f in dataclasses.fields(METHODS.get(name).Options)
              if dataclasses.is_dataclass(f.default_factory)}
    options = [(f"{name}", o) for o in method_options(name) if not o.endswith(".*")]
    options += [(f"{name}.{g}", f"{g}.{f.name}") for g, sub in groups.items() for f in dataclasses.fields(sub)]
    for where, option in options:
        for value in (float("nan"), float("-inf"), {"a": 1}):
            with pytest.raises(ValueError, match=f"{where}: {option.split('.')[-1]} must be|{where}: unknown option 'a'") as error:
                get_absorb_method(name, **{option: value})
            assert "\n" not in str(error.value)


def float_options() -> list[tuple[str, str]]:
    """(method, option) for every float option of every method whose range reaches past float32's largest number."""
    import dataclasses
    import typing

    from incontext.absorb.protocol import METHODS

    cases = []
    for name in absorb_methods():
        hints = typing.get_type_hints(METHODS.get(name).Options)
        for field in dataclasses.fields(METHODS.get(name).Options):
            if float in (hints[field.name], *typing.get_args(hints[field.name])) and not (
                    {"max", "lt"} & set(field.metadata)):
                cases.append((name, field.name))
    return cases


@pytest.mark.parametrize("name, option", float_options(), ids=[f"{m}-{o}" for m, o in float_options()])
def test_every_float_option_is_checked_against_the_models_dtype(name, option):
    """A float option is taken up to the largest finite number of the model's dtype and refused in one line past it,
    before any work (absorb's first check; `incontext absorb` runs the same check when the model has loaded)."""
    from incontext import Transformer, TransformerConfig

    model = Transformer(TransformerConfig(n_layer=1, d_model=8, n_head=2, vocab_size=11, max_seq_len=8)).eval()
    for dtype, name_of_dtype, largest in ((torch.float32, "float32", torch.finfo(torch.float32).max),
                                          (torch.bfloat16, "bfloat16", torch.finfo(torch.bfloat16).max),
                                          (torch.float16, "float16", 65504.0)):
        model = model.to(dtype)
        get_absorb_method(name, **{option: largest}).check_options_fit(model)  # at the limit: taken
        for beyond in (largest * 1.0001, -largest * 1.0001):
            try:
                method = get_absorb_method(name, **{option: beyond})
            except ValueError as error:  # a range that refuses it already (> 0, >= 0)
                assert beyond < 0 and "\n" not in str(error), error
                continue
            with pytest.raises(ValueError, match=f"^{name}: {option} must be a finite number ") as error:
                method.absorb(model, torch.tensor([1, 2, 3]))
            assert f"<= {largest:g} (the largest finite {name_of_dtype}: the model's dtype), got {beyond!r}" in str(error.value)
            assert "\n" not in str(error.value)
    get_absorb_method(name, **{option: 1e39}).check_options_fit(model.double())  # float64 holds it


def test_typed_options_keep_their_types():
    method = get_absorb_method("dynamic-eval", learning_rate=1, n_steps=2, keep_prompt=True, lora_targets=["attn.qkv"])
    options = method.options
    assert isinstance(options.learning_rate, float) and options.n_steps == 2 and options.keep_prompt is True
    assert get_absorb_method("tint", n_steps=2).config.n_steps == 2


def test_every_method_declares_its_options_with_the_constructors_defaults():
    """method_options reads the Options dataclass; the constructor keeps the same keyword names and defaults."""
    import dataclasses
    import inspect

    from incontext.absorb.protocol import METHODS

    for name in absorb_methods():
        cls = METHODS.get(name)
        parameters = inspect.signature(cls.__init__).parameters
        for field in dataclasses.fields(cls.Options):
            if field.name in parameters:
                assert parameters[field.name].default == field.default, (name, field.name)
            else:
                assert any(p.kind == p.VAR_KEYWORD for p in parameters.values()), (name, field.name)


# ----------------------------------------------------------------------------- 2. nothing non-finite or exploded


@pytest.mark.parametrize("method, options, fragment", [
    ("dynamic-eval", ["learning_rate=1e30"], "dynamic-eval: the update exploded"),
    ("dynamic-eval", ["learning_rate=1e30", "optimizer=adamw"], "dynamic-eval: the update exploded"),
    ("dynamic-eval", ["learning_rate=3e38", "n_steps=2"], "dynamic evaluation diverged"),
    ("distill-lora", ["learning_rate=1e30", "steps=2", *QUICK], "distill-lora: "),
    ("kv-prefix", ["learning_rate=1e30", "steps=1", "passes=0", "prefix_tokens=2", *QUICK], "kv-prefix: the update exploded"),
    ("dynamic-eval", ["learning_rate=1e30", "lora_rank=2"], "dynamic-eval"),
])
def test_an_update_that_explodes_writes_nothing(capsys, world, tmp_path, method, options, fragment):
    refused(capsys, world, tmp_path, absorb_args(method, *options), fragment)


def test_saving_refuses_non_finite_tensors_and_metadata(tmp_path):
    from incontext import Transformer, TransformerConfig
    from incontext.absorb.protocol import check_tensors

    model = Transformer(TransformerConfig(n_layer=1, d_model=8, n_head=2, vocab_size=11, max_seq_len=8)).eval()
    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3).absorb(model, torch.tensor([1, 2, 3]))
    with torch.no_grad():
        adapted.base.blocks[0].attn.qkv.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="base.blocks.0.attn.qkv.weight holds non-finite values"):
        adapted.save(tmp_path / "a")
    assert not (tmp_path / "a").exists()
    adapted = get_absorb_method("dynamic-eval", learning_rate=1e-3).absorb(model, torch.tensor([1, 2, 3]))
    adapted.offset = float("inf")
    with pytest.raises(ValueError, match="description holds a non-finite number"):
        adapted.save(tmp_path / "b")
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="the update exploded: w reaches"):
        check_tensors([("w", torch.full((2,), 2e4))], "x", 1.0)
    check_tensors([("w", torch.full((2,), 9e3)), ("ids", torch.tensor([10**9]))], "x", 1.0)  # within 1e4x; ints skipped


# ----------------------------------------------------------------------------- 3. output folders and their markers


def prepare_folders(tmp: Path) -> None:
    (tmp / "FILE").write_text("a user's file")
    (tmp / "FOREIGN").mkdir()
    (tmp / "FOREIGN" / "notes.txt").write_text("keep me")
    (tmp / "RESULTS").mkdir()  # another command's result folder, like the shipped results/hf-parity
    (tmp / "RESULTS" / "results.json").write_text('{"theirs": true}\n')
    (tmp / "RESULTS" / "table.md").write_text("| theirs |\n")
    (tmp / "LEGACY").mkdir()  # an absorb folder without a marker
    (tmp / "LEGACY" / "absorb.json").write_text("{}\n")
    for name, owner in (("COMPARE", "compare"), ("DEMO", "demo")):
        (tmp / name).mkdir()
        (tmp / name / EXPERIMENT_MARKER).write_text(json.dumps({"experiment": owner}) + "\n")
        (tmp / name / "results.json").write_text("{}\n")
    (tmp / "PROMPTS").mkdir()
    (tmp / "PROMPTS" / "a.txt").write_text(PROMPT)


FOLDER_CASES = [
    (compare_args(out="RESULTS"), "no marker of 'compare'"),
    (compare_args(out="FOREIGN"), "holds files this command did not write (notes.txt)"),
    (compare_args(out="KEEP"), "holds the output of experiment 'absorb', not 'compare'"),
    (compare_args(out="DEMO"), "holds the output of experiment 'demo', not 'compare'"),
    (compare_args(out="FILE"), "is a file"),
    (compare_args(out="FILE/sub"), "cannot be created"),
    (["demo", "--out", "COMPARE"], "holds the output of experiment 'compare', not 'demo'"),
    (["demo", "--out", "RESULTS"], "no marker of 'demo'"),
    (["demo", "--out", "FILE/sub"], "cannot be created"),
    (absorb_args("keep-prompt", out="COMPARE"), "holds the output of experiment 'compare', not 'absorb'"),
    (absorb_args("keep-prompt", out="FOREIGN"), "no marker of 'absorb'"),
    (absorb_args("keep-prompt", out="LEGACY"), "no marker of 'absorb'"),
    (absorb_args("keep-prompt", out="RESULTS"), "no marker of 'absorb'"),
    (absorb_args("keep-prompt", out="FILE"), "is a file"),
    (absorb_args("keep-prompt", out="FILE/sub/deeper"), "cannot be created"),
    (["absorb", "--model", "LLAMA", "--method", "keep-prompt", "--prompts", "PROMPTS", "--out", "KEEP"],
     "holds the output of experiment 'absorb', not 'absorb-many'"),
    (["absorb", "--model", "LLAMA", "--method", "keep-prompt", "--prompts", "PROMPTS", "--out", "FOREIGN"],
     "no marker of 'absorb-many'"),
    (["run", "regression-demo", "--set", "steps=2", "--out", "COMPARE"], "not 'regression-demo'"),
    (["run", "regression-demo", "--set", "steps=2", "--out", "RESULTS"], "no marker of 'regression-demo'"),
]


@pytest.mark.parametrize("args, fragment", FOLDER_CASES, ids=[f"{a[0]}-{a[a.index('--out') + 1]}" for a, _ in FOLDER_CASES])
def test_a_folder_is_a_commands_own_only_by_its_marker(capsys, world, tmp_path, args, fragment):
    prepare_folders(tmp_path)
    refused(capsys, world, tmp_path, args, fragment)


def test_a_failing_compare_removes_the_folder_it_claimed(capsys, world, tmp_path):
    """The claim comes before the work; a command that then fails leaves no folder of its own behind."""
    refused(capsys, world, tmp_path, compare_args("--methods", "no-such-method", out="OUT/deeper"), "unknown method")
    assert not (tmp_path / "OUT").exists()


# ----------------------------------------------------------------------------- 4. the harness on models it cannot serve

HARNESS_CASES = [
    (compare_args(task="arithmetic"), "needs a model trained on the 'arithmetic' task"),
    (compare_args(model="CGT", task="facts"), "needs a tokenizer"),
    (compare_args(model="CGT", task="linear_regression"), "needs a model trained on 'linear_regression'"),
    (compare_args(task="no-such-task"), "no-such-task"),
    (compare_args("--methods", "no-such-method"), "unknown method 'no-such-method'"),
    (compare_args("--set", "dynamic-eval=3"), "needs an option"),
    (compare_args("--methods", "iclca", "--set", "dynamic-eval.n_steps=2"), "not among the compared methods"),
    (["compare", "--model", "LLAMA", "--task", "facts", "--episodes", "0", "--out", "OUT"], "--episodes must be >= 1"),
    (["compare", "--model", "LLAMA", "--task", "facts", "--set", "people=10001", "--out", "OUT"], "at most 10000 people"),
    (["compare", "--model", "LLAMA", "--task", "continuation", "--set", "prompt_tokens=10000000", "--out", "OUT"],
     "no held-out passage holds prompt_tokens + query_tokens"),
    (compare_args("--methods", "kv-prefix", "--set", "kv-prefix.study.wording_ensemble=true", task="continuation"),
     "kv-prefix: study.wording_ensemble=true groups the training queries by question, and task 'continuation' gives no groups"),
    (compare_args("--set", "path=FILE/missing.jsonl", task="jsonl"), "missing.jsonl: cannot read the file"),
    (compare_args("--set", "path=LLAMA/config.json", task="jsonl"), "config.json, line 1: not JSON"),
    (absorb_args("iclca"), "iclca does not apply to model"),
    (absorb_args("kv-prefix") + ["--train-queries", "FILE/missing.txt"], "--train-queries"),
    (absorb_args("keep-prompt") + ["--train-queries", "LLAMA/config.json"], "keep-prompt does not learn from training"),
    (absorb_args("kv-prefix", "study.wording_ensemble=true"), "groups training questions by question, and there are none"),
    (["absorb", "--model", "LLAMA", "--method", "kv-prefix", "--prompts", "PROMPTS", "--train-queries",
      "LLAMA/config.json", "--out", "OUT"], "--train-queries goes with one prompt"),
    (["absorb", "--model", "CGT", "--method", "keep-prompt", "--prompt", "1+1", "--out", "OUT"], "has no tokenizer"),
    (absorb_args("distill-lora", "steps=0", *QUICK), "distill-lora: steps=0 trains nothing: the adapter's B factors "
                                                     "stay zero"),
    (["absorb", "--model", "LLAMA", "--method", "distill-lora", "--set", "steps=0", "--prompts", "PROMPTS", "--out",
      "OUT"], "distill-lora: steps=0 trains nothing"),
    (["generate", "--model", "CGT", "hello"], "has no tokenizer"),
    ([*absorb_args("keep-prompt"), "--writer", "LLAMA"], "keep-prompt writes no questions, so it takes no writer model"),
    ([*absorb_args("kv-prefix", *QUICK), "--writer", "no-such-model"], "unknown model 'no-such-model'"),
    ([*compare_args("--methods", "kv-prefix"), "--writer", "no-such-model"], "unknown model 'no-such-model'"),
    ([*absorb_args("kv-prefix", "speed=fast", *QUICK)], "kv-prefix: unknown option 'speed'"),
]


@pytest.mark.parametrize("args, fragment", HARNESS_CASES)
def test_the_harness_refuses_what_does_not_fit_in_one_line(capsys, world, tmp_path, args, fragment):
    if "PROMPTS" in args:
        (tmp_path / "PROMPTS").mkdir()
        (tmp_path / "PROMPTS" / "a.txt").write_text(PROMPT)
    refused(capsys, world, tmp_path, args, fragment)


def test_an_untrained_kv_prefix_is_written_and_says_so(capsys, world, tmp_path):
    """steps=0 keeps kv-prefix's initial prefix, the document's own K/V (a result: keep-prompt's at full length);
    the command says in one line that nothing was trained. distill-lora's steps=0 is refused (HARNESS_CASES)."""
    from incontext.cli.commands import main

    code = main(resolve(absorb_args("kv-prefix", "steps=0", *QUICK), world, tmp_path))
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "nothing was trained (0 steps): the adapted model is kv-prefix's starting point" in printed.out.splitlines()
    assert json.loads((tmp_path / "OUT" / "absorb.json").read_text())["history"]["steps"] == 0


@pytest.mark.parametrize("command", ["generate", "absorb", "compare"])
def test_a_tokenizer_past_the_models_vocabulary(capsys, world, tmp_path, command):
    """A Hugging Face folder whose tokenizer holds more tokens than the model's embedding has rows: refused when
    the model loads, naming both sizes, before an id past the vocabulary ends in an IndexError."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model = Path(shutil.copytree(world / "LLAMA", tmp_path / "DIR"))
    config = LlamaConfig.from_pretrained(model)
    tokens = config.vocab_size
    config.vocab_size = tokens - 40
    LlamaForCausalLM(config).save_pretrained(model)
    capsys.readouterr()  # save_pretrained's progress bar
    args = {"generate": ["generate", "--model", "DIR", "hi"], "compare": compare_args(model="DIR"),
            "absorb": ["absorb", "--model", "DIR", "--method", "keep-prompt", "--prompt", "x", "--out", "OUT"]}[command]
    refused(capsys, world, tmp_path, args, f"its tokenizer has {tokens} tokens but the model's vocabulary holds "
                                           f"{tokens - 40}")


def test_compare_on_a_cgt_run_prints_cgt_fold_and_keep_prompt_rows(capsys, world, tmp_path):
    code, err = run_cli(capsys, resolve(compare_args("--methods", "cgt-fold,iclca", model="CGT", task="arithmetic"),
                                        world, tmp_path))
    assert code == 0, err
    rows = {row["method"]: row for row in json.loads((tmp_path / "OUT" / "results.json").read_text())["rows"]}
    assert rows["keep-prompt"]["status"] == rows["cgt-fold"]["status"] == rows["drop-prompt"]["status"] == "ok"
    # measured against the CGT's own prompted pass (the context in its input), which folding drops: a real difference
    assert 0 < rows["cgt-fold"]["agreement"]["relative_logits_error"] < 2
    assert rows["iclca"]["status"] == "n/a" and "linear attention" in rows["iclca"]["reason"]
    table = (tmp_path / "OUT" / "table.md").read_text()
    assert "| cgt-fold |" in table and "| keep-prompt |" in table


# ----------------------------------------------------------------------------- 5. damaged inputs


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def truncate(path: Path, keep: int = 50) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def damage(tmp: Path, how: str) -> None:
    keep, peft = tmp / "KEEP", tmp / "LORA" / "peft_adapter"
    actions = {
        "adapted dtype unknown": lambda: edit_json(keep / "adapted.json", lambda d: d.update(dtype="float7")),
        "adapted dtype a number": lambda: edit_json(keep / "adapted.json", lambda d: d.update(dtype=5)),
        "adapted extra a list": lambda: edit_json(keep / "adapted.json", lambda d: d.update(extra=[])),
        "adapted extra missing": lambda: edit_json(keep / "adapted.json", lambda d: d.pop("extra")),
        "adapted shape a string": lambda: edit_json(keep / "adapted.json", lambda d: d["extra"].update(prompt_shape="x")),
        "adapted shape wrong": lambda: edit_json(keep / "adapted.json", lambda d: d["extra"].update(prompt_shape=[1, 2])),
        "adapted backend unknown": lambda: edit_json(keep / "adapted.json", lambda d: d.update(backend="tpu")),
        "adapted backend a number": lambda: edit_json(keep / "adapted.json", lambda d: d.update(backend=3)),
        "adapted method unknown": lambda: edit_json(keep / "adapted.json", lambda d: d.update(method="magic")),
        "adapted no checksum": lambda: edit_json(keep / "adapted.json", lambda d: d.pop("sha256")),
        "adapted no checksum, truncated": lambda: (edit_json(keep / "adapted.json", lambda d: d.pop("sha256")),
                                                   truncate(keep / "adapted.safetensors")),
        "adapted truncated": lambda: truncate(keep / "adapted.safetensors"),
        "adapted weights missing": lambda: (keep / "adapted.safetensors").unlink(),
        "adapted.json a list": lambda: (keep / "adapted.json").write_text("[]"),
        "adapted.json binary": lambda: (keep / "adapted.json").write_bytes(b"\xff\xfe\x00"),
        "absorb.json missing": lambda: (keep / "absorb.json").unlink(),
        "peft absorb.json missing": lambda: (tmp / "LORA" / "absorb.json").unlink(),
        "absorb.json a list": lambda: (keep / "absorb.json").write_text("[1]"),
        "absorb.json binary": lambda: (keep / "absorb.json").write_bytes(b"\xff\xfe"),
        "absorb.json fingerprint a number": lambda: edit_json(keep / "absorb.json", lambda d: d.update(model_fingerprint=3)),
        "peft truncated": lambda: truncate(peft / "adapter_model.safetensors"),
        "peft truncated, no checksum": lambda: (edit_json(tmp / "LORA" / "absorb.json",
                                                          lambda d: d["peft_adapter"].pop("sha256")),
                                                truncate(peft / "adapter_model.safetensors")),
        "peft config not JSON": lambda: (peft / "adapter_config.json").write_text("{bad"),
        "peft config a list": lambda: (peft / "adapter_config.json").write_text("[1]"),
        "peft note a string": lambda: edit_json(tmp / "LORA" / "absorb.json", lambda d: d.update(peft_adapter="x")),
        "peft query_position a string": lambda: edit_json(tmp / "LORA" / "absorb.json",
                                                          lambda d: d["peft_adapter"].update(query_position="x")),
        "peft weights missing": lambda: (peft / "adapter_model.safetensors").unlink(),
    }
    actions[how]()


DAMAGED = [
    ("adapted dtype unknown", "KEEP", "adapted.json is corrupt: unknown dtype 'float7'"),
    ("adapted dtype a number", "KEEP", "adapted.json is corrupt: dtype is not a str"),
    ("adapted extra a list", "KEEP", "adapted.json is corrupt: extra is not a dict"),
    ("adapted extra missing", "KEEP", "adapted.json is corrupt: extra is missing"),
    ("adapted shape a string", "KEEP", "adapted.json and adapted.safetensors do not make an adapted model"),
    ("adapted shape wrong", "KEEP", "adapted.json and adapted.safetensors do not make an adapted model"),
    ("adapted backend unknown", "KEEP", "backend 'tpu' is neither"),
    ("adapted backend a number", "KEEP", "backend is not a str"),
    ("adapted method unknown", "KEEP", "unknown absorb method 'magic'"),
    ("adapted no checksum", "KEEP", "sha256 is missing (no checksum of adapted.safetensors)"),
    ("adapted no checksum, truncated", "KEEP", "sha256 is missing"),
    ("adapted truncated", "KEEP", "adapted.safetensors is corrupt: its sha256 differs"),
    ("adapted weights missing", "KEEP", "adapted.safetensors is missing"),
    ("adapted.json a list", "KEEP", "adapted.json is corrupt"),
    ("adapted.json binary", "KEEP", "adapted.json is corrupt"),
    ("absorb.json missing", "KEEP", "is damaged or unfinished: absorb.json is missing"),
    ("peft absorb.json missing", "LORA", "is damaged or unfinished: absorb.json is missing"),
    ("absorb.json a list", "KEEP", "absorb.json is corrupt"),
    ("absorb.json binary", "KEEP", "absorb.json is corrupt"),
    ("absorb.json fingerprint a number", "KEEP", "absorb.json is corrupt (model_fingerprint has the wrong type)"),
    ("peft truncated", "LORA", "adapter_model.safetensors is corrupt (its sha256 differs"),
    ("peft truncated, no checksum", "LORA", "adapter_model.safetensors is corrupt"),
    ("peft config not JSON", "LORA", "adapter_config.json is corrupt"),
    ("peft config a list", "LORA", "adapter_config.json is corrupt"),
    ("peft note a string", "LORA", "absorb.json is corrupt (peft_adapter has the wrong type)"),
    ("peft query_position a string", "LORA", "records no query_position"),
    ("peft weights missing", "LORA", "adapter_model.safetensors is missing"),
]


@pytest.mark.parametrize("how, folder, fragment", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_generate_from_a_damaged_absorb_folder(capsys, world, tmp_path, how, folder, fragment):
    resolve([folder], world, tmp_path)  # the copy to damage
    damage(tmp_path, how)
    refused(capsys, world, tmp_path, ["generate", "--model", "LLAMA", "--adapted", folder, "--max-new-tokens", "2", "hi"],
            fragment)


@pytest.mark.parametrize("folder", ["KEEP", "LORA"])
def test_an_absorb_folder_without_its_record_is_not_trusted_by_config(capsys, world, tmp_path, folder):
    """Absorbed into LLAMA, absorb.json lost, asked for with OTHER (the same config, other weights): without the
    record's fingerprint nothing tells the two apart, so the folder is refused as damaged, not run on LLAMA's weights
    under OTHER's name."""
    resolve([folder], world, tmp_path)
    (tmp_path / folder / "absorb.json").unlink()
    refused(capsys, world, tmp_path, ["generate", "--model", "OTHER", "--adapted", folder, "--max-new-tokens", "2", "hi"],
            f"absorb folder {tmp_path / folder} is damaged or unfinished: absorb.json is missing")


@pytest.mark.parametrize("how, fragment", [
    ("truncated weights", "transformers cannot load this model"),
    ("weights not safetensors", "transformers cannot load this model"),
    ("config a string", "config.json is not a JSON object"),
    ("config a number", "config.json is not a JSON object"),
])
@pytest.mark.parametrize("command", ["generate", "absorb"])
def test_a_damaged_model_folder(capsys, world, tmp_path, how, fragment, command):
    model = Path(shutil.copytree(world / "LLAMA", tmp_path / "DIR"))
    if how == "truncated weights":
        truncate(model / "model.safetensors", 200)
    elif how == "weights not safetensors":
        (model / "model.safetensors").write_bytes(b"\x00" * 64)
    else:
        (model / "config.json").write_text('"x"' if how == "config a string" else "3")
    args = (["generate", "--model", "DIR", "hi"] if command == "generate"
            else ["absorb", "--model", "DIR", "--method", "keep-prompt", "--prompt", "x", "--out", "OUT"])
    refused(capsys, world, tmp_path, args, fragment)


@pytest.mark.parametrize("extra, fragment", [
    (["--sample", "--temperature", "1e-45"], "--temperature 1e-45 underflows float32"),
    (["--sample", "--temperature", "1e-300"], "underflows float32"),
    (["--sample", "--temperature", "1e-39", "--dtype", "bfloat16"], "underflows bfloat16"),
    (["--sample", "--temperature", "1e-7", "--dtype", "float16"], "underflows float16"),
    (["--sample", "--temperature", "inf"], "--temperature must be a finite number > 0, got inf"),
    (["--sample", "--temperature", "nan"], "--temperature must be a finite number > 0, got nan"),
    (["--sample", "--temperature", "-1"], "--temperature must be a finite number > 0"),
    (["--adapted", "FILE"], "no such folder"),
    (["--adapted", "DIR"], "no such folder"),
    (["--adapted", "KEEP", "--adapted", "LORA"], "absorbed by different methods (distill-lora, keep-prompt)"),
    (["--adapted", "KEEP", "--adapted", "KEEP"], "keep-prompt does not compose"),
    (["--adapted", "LORA", "--adapted", "DIR"], "no such folder"),
])
def test_generate_refuses_bad_sampling_and_adapted_folders(capsys, world, tmp_path, extra, fragment):
    (tmp_path / "FILE").write_text("x")
    refused(capsys, world, tmp_path, ["generate", "--model", "LLAMA", *extra, "hi"], fragment)


def test_sampling_refuses_logits_over_a_temperature_that_overflow():
    from incontext.models.transformer import pick_next_token

    with pytest.raises(ValueError, match="temperature 1e-37 is too small for torch.float32"):
        pick_next_token(torch.tensor([[0.0, 40.0]]), greedy=False, temperature=1e-37)
