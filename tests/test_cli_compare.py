"""`incontext compare` end to end on a tiny run of ours, and its one-line errors."""

import json
from pathlib import Path

import pytest

from incontext.cli import commands as cli
from incontext.train import load_config, train

INDUCTION = [
    "model.n_layer=1", "model.d_model=16", "model.n_head=2", "model.attention=linear", "model.positions=rope",
    "task.name=induction", "task.seq_len=32", "task.trigger_prob=0.3",
    "schedule.total_steps=2", "schedule.warmup_steps=1", "run.batch_size=4", "run.eval_every=2",
    "run.eval_sequences=8", "run.checkpoint_every=2", "run.tensorboard=false", "run.threads=1",
]


@pytest.fixture(scope="module")
def induction_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("induction-run")
    train(load_config(None, INDUCTION + [f"run.out_dir={out}"]), progress=False)
    return out


def test_compare_on_a_linear_induction_run(induction_run, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert cli.main(["compare", "--model", str(induction_run), "--task", "induction", "--episodes", "4",
                     "--methods", "iclca,iclca-approx,dynamic-eval,tint", "--set", "dynamic-eval.learning_rate=1e-3",
                     "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = {r["method"]: r for r in results["rows"]}
    assert list(rows)[:2] == ["keep-prompt", "drop-prompt"]
    assert rows["iclca"]["score"] == rows["keep-prompt"]["score"]
    assert rows["iclca"]["agreement"]["relative_logits_error"] < 1e-5
    assert rows["iclca-approx"]["status"] == "n/a" and rows["tint"]["status"] == "n/a"
    assert rows["dynamic-eval"]["status"] == "ok"
    assert (out / "compare.png").stat().st_size > 0
    assert results["machine"]["cpu"] and results["machine"]["torch"]  # what the costs were measured on
    printed = capsys.readouterr().out
    assert "| iclca |" in printed and "n/a: needs softmax attention" in printed
    # a second run may overwrite its own files
    assert cli.main(["compare", "--model", str(induction_run), "--task", "induction", "--episodes", "2",
                     "--methods", "iclca", "--out", str(out)]) == 0


@pytest.mark.parametrize("argv, message", [
    (["--model", "no-such-model", "--task", "facts"], "unknown model 'no-such-model': give smollm2"),
    (["--model", "smollm2", "--task", "no-such-task"], "tasks with episodes: arithmetic, continuation, documents, facts"),
    (["--model", "smollm2", "--task", "facts", "--methods", "iclca,magic"], "unknown method 'magic'; methods:"),
    (["--model", "smollm2", "--task", "facts", "--set", "people=-1"], "people must be a positive integer"),
    (["--model", "smollm2", "--task", "facts", "--set", "questions=paraphrases:7"], "paraphrases:7: the task has 6 wordings"),
    (["--model", "smollm2", "--task", "facts", "--set", "questions=two"], "give one of none | cloze | paraphrases:N"),
    (["--model", "smollm2", "--task", "facts", "--split", "train"], "unknown split 'train'; splits: dev, validation, test"),
    (["--model", "smollm2", "--task", "facts", "--set", "colour=red"], "task 'facts': FactsConfig: unknown key(s) ['colour']; allowed keys: ['people', 'format', 'documents', 'questions', 'placement']"),
    (["--model", "smollm2", "--task", "facts", "--set", "dynamic-eval.speed=2"], "dynamic-eval: unknown option 'speed'"),
    (["--model", "smollm2", "--task", "facts", "--set", "iclca-approx.layers=3-1"], "layers must be 'all' or a list"),
    (["--model", "smollm2", "--task", "facts", "--tune", "dynamic-eval=1,2"], "must look like METHOD.OPTION=v1,v2"),
    (["--model", "smollm2", "--task", "facts", "--episodes", "0"], "--episodes must be >= 1"),
    (["--model", "smollm2", "--task", "jsonl"], "task 'jsonl': JsonlConfig: needs the file: option path=FILE"),
    (["--model", "smollm2", "--task", "jsonl", "--set", "path=no/such.jsonl"], "path=no/such.jsonl: cannot read the file"),
    (["--model", "smollm2", "--task", "jsonl", "--set", f"path={__file__}"], "test_cli_compare.py, line 1: not JSON"),
])
def test_bad_compare_input_is_one_line(argv, message, capsys, tmp_path):
    assert cli.main(["compare", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_compare_on_your_own_documents_and_questions(tmp_path, capsys):
    """--task jsonl --set path=FILE on a tiny random Llama: every row scored by its generated answers."""
    pytest.importorskip("transformers")
    from test_cli_absorb import tiny_llama

    llama, out = tiny_llama(tmp_path / "llama", seed=0), tmp_path / "cmp"
    path = Path(__file__).parent / "data" / "qa_small.jsonl"
    assert cli.main(["compare", "--model", str(llama), "--task", "jsonl", "--set", f"path={path}", "--episodes", "3",
                     "--methods", "keep-prompt,drop-prompt,dynamic-eval", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["metric"] == "generated" and results["queries"] == 4 and results["task_options"]["path"] == str(path)
    assert [r["method"] for r in results["rows"]] == ["keep-prompt", "drop-prompt", "dynamic-eval"]
    for row in results["rows"]:
        assert row["status"] == "ok" and 0 <= row["score"]["mean"] <= 1 and 0 <= row["f1"]["mean"] <= 1, row
    assert results["rows"][0]["agreement"]["kl"] < 1e-9
    assert "| method | contains % [95% CI] | token F1 % |" in (out / "table.md").read_text()
    assert "| dynamic-eval |" in capsys.readouterr().out
    # a file with fewer records than episodes: one line, before the model loads
    assert cli.main(["compare", "--model", str(llama), "--task", "jsonl", "--set", f"path={path}", "--episodes", "4",
                     "--out", str(tmp_path / "more")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds 3 records, fewer than the 4 episodes asked" in err and len(err.splitlines()) == 1


def test_compare_refuses_a_foreign_out_folder(induction_run, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert cli.main(["compare", "--model", str(induction_run), "--task", "induction", "--episodes", "1",
                     "--methods", "iclca", "--out", str(out)]) == 2
    assert "holds files this command did not write (notes.txt)" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_demo_refuses_a_foreign_out_folder_before_loading_anything(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert cli.main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds files this command did not write (notes.txt)" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


def test_names_of_nearly_coinciding_points_are_stacked_not_drawn_over_each_other():
    from incontext.harness.report import _labels
    from incontext.outputs import pyplot

    fig, ax = pyplot().subplots()
    _labels(ax, [(1755.0, 42.9, "kv-prefix"), (2520.0, 42.9, "distill-lora"), (7155.0, 31.4, "keep-prompt"),
                 (0.01, 0.0, "drop-prompt"), (19516.0, 0.0, "iclca-approx")])
    offsets = {a.get_text(): a.xyann for a in ax.texts}
    assert offsets["kv-prefix"] == (3, 3) and offsets["distill-lora"] == (3, -7)  # the second one goes below
    assert offsets["keep-prompt"] == offsets["drop-prompt"] == offsets["iclca-approx"] == (3, 3)
    pyplot().close(fig)


def test_the_demo_is_squad_on_the_chosen_model():
    """`incontext demo` runs SQuAD paragraphs of the test articles with every method at its defaults; --model picks the
    shipped model (its default output folder named by it)."""
    args = cli.build_parser().parse_args(["demo"])
    spec = cli.demo_spec(args)
    assert (spec.model, spec.task, spec.split, spec.episodes, spec.task_options) == ("smollm2", "squad", "test", 5, {})
    assert "kv-press" in spec.methods and "kv-prefix" in spec.methods and not spec.method_options
    assert cli.demo_spec(cli.build_parser().parse_args(["demo", "--model", "qwen2.5-coder-0.5b"])).model == "qwen2.5-coder-0.5b"
