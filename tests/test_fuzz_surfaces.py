"""Bad input on the newer surfaces: chat over stdin (bytes that are not UTF-8, unknown and malformed commands,
/adapted with bad folders, input that ends mid-turn), generate --prompts-file, the jsonl task, the lm-eval model's
arguments and the kv-press options (press name, ratio) of absorb and compare. No traceback: one line on stderr for
each bad input, a non-zero exit, and no file outside the command's own output touched."""

from __future__ import annotations

import io
import sys

import pytest

pytest.importorskip("transformers")

from incontext.cli import commands as cli  # noqa: E402
from test_cli_chat import QUESTIONS, tiny_llama  # noqa: E402
from test_fuzz_cli import assert_one_line_error, run_cli, sets, snapshot  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"), seed=0)


def chat_bytes(capsys, monkeypatch, data: bytes, *argv):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    code = cli.main(["chat", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_chat_skips_a_line_that_is_not_utf8_and_goes_on(llama, tmp_path, capsys, monkeypatch):
    not_absorb = tmp_path / "plain"
    not_absorb.mkdir()
    (not_absorb / "notes.txt").write_text("mine")
    a_file = tmp_path / "file.txt"
    a_file.write_text("mine")
    before = snapshot(tmp_path)
    script = b"\n".join([b"\xff\xfe", QUESTIONS[0].encode(), b"/", b"/adapted  ", b"/adapted " + str(not_absorb).encode(),
                         b"/adapted " + str(a_file).encode(), b"/reset extra words", b"\xc3(", b"/nope",
                         QUESTIONS[1].encode()])  # the last turn ends without a newline: input ends mid-turn
    code, out, err = chat_bytes(capsys, monkeypatch, script, "--model", llama, "--max-new-tokens", "4")
    assert code == 2, err  # bad input was seen, each line said so, and the good lines were answered
    assert "Traceback" not in err and all(line.startswith("incontext: ") for line in err.splitlines()), err
    assert err.count("not UTF-8 text was skipped") == 2
    assert len(out.rstrip("\n").split("\n")) == 2  # both questions answered
    assert snapshot(tmp_path) == before


def test_chat_with_good_input_exits_0(llama, capsys, monkeypatch):
    code, out, err = chat_bytes(capsys, monkeypatch, (QUESTIONS[0] + "\n/exit\n").encode(), "--model", llama,
                                "--max-new-tokens", "3")
    assert code == 0 and err == "" and out.count("\n") == 1


@pytest.mark.parametrize("content, fragment", [(b"\xff\xfe\x00bad", "UTF-8"), (b"", "holds no prompts"),
                                               (b"\x00\x01\x02\n", "")])
def test_prompts_file_bad_bytes(llama, tmp_path, capsys, content, fragment):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(content)
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, ["generate", "--model", llama, "--prompts-file", prompts, "--max-new-tokens", "2"])
    if code == 0:  # control characters are text: answered, nothing else
        assert err == ""
    else:
        assert_one_line_error(code, err, fragment)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("content, fragment", [
    (b"", "no records"), (b"\xff\xfe\x00", "UTF-8"), (b'{"document": "", "questions": [{"q": "a?", "a": "b"}]}\n', "document"),
    (b'{"document": "Ada was born in London.", "questions": [{"question": "Where?", "answer": ""}]}\n', "answer"),
    (b"[1, 2]\n", "line 1"),
])
def test_jsonl_task_bad_files(llama, tmp_path, capsys, content, fragment):
    data = tmp_path / "task.jsonl"
    data.write_bytes(content)
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, ["compare", "--model", llama, "--task", "jsonl", "--set", f"path={data}", "--episodes",
                                 "1", "--methods", "keep-prompt", "--out", tmp_path / "out"])
    assert_one_line_error(code, err)
    assert fragment.lower() in err.lower(), err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("options, fragment", [
    (["press=nope"], "unknown press 'nope'"), (["ratio=0"], "ratio"), (["ratio=1.5"], "ratio"), (["ratio=nan"], "ratio"),
    (["ratio=abc"], "ratio"), (["document_start=-1"], "document_start"), (["press=3"], "press"),
])
def test_kv_press_options_are_one_line_errors(llama, tmp_path, capsys, options, fragment):
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, ["absorb", "--model", llama, "--method", "kv-press", "--prompt", "Ada was born in London.",
                                 "--out", tmp_path / "out", *sets(*options)])
    assert_one_line_error(code, err, fragment)
    code, err = run_cli(capsys, ["compare", "--model", llama, "--task", "facts", "--episodes", "1", "--methods", "kv-press",
                                 *sets(*(f"kv-press.{o}" for o in options)), "--out", tmp_path / "compare"])
    assert_one_line_error(code, err, fragment)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("ratio", ["0", "1.5", "nan"])
def test_compare_ratio_is_checked(llama, tmp_path, capsys, ratio):
    code, err = run_cli(capsys, ["compare", "--model", llama, "--task", "facts", "--episodes", "1", "--methods",
                                 "kv-press", "--ratio", ratio, "--out", tmp_path / "out"])
    assert_one_line_error(code, err, "ratio")
    assert not (tmp_path / "out").exists()


def test_kv_prefix_press_start_options(llama, tmp_path, capsys):
    code, err = run_cli(capsys, ["absorb", "--model", llama, "--method", "kv-prefix", "--prompt", "Ada was born in London.",
                                 "--out", tmp_path / "out", *sets("init=press", "press=nope")])
    assert_one_line_error(code, err, "unknown press 'nope'")


@pytest.mark.parametrize("model_args, fragment", [("absorbed={tmp}/plain", "no absorb.json"),
                                                   ("absorbed={tmp}/missing", "absorb.json"),
                                                   ("model={llama},frobnicate=1", "frobnicate"),
                                                   ("dtype=float32", "absorbed=DIR")])
def test_lm_eval_model_arguments_are_one_line_errors(llama, tmp_path, model_args, fragment):
    """As a user runs it (a process of its own: lm-eval's logging keeps the stderr it started with)."""
    pytest.importorskip("lm_eval")
    import subprocess

    (tmp_path / "plain").mkdir()
    args = model_args.format(tmp=tmp_path, llama=llama)
    run = subprocess.run([sys.executable, "-m", "incontext.cli.lm_eval", "--model", "incontext", "--model_args", args,
                          "--tasks", "lambada_openai", "--limit", "1"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    ours = [line for line in run.stderr.splitlines() if line.startswith("incontext: error:")]
    assert len(ours) == 1 and fragment in ours[0] and "Traceback" not in run.stderr, run.stderr


def test_export_model_writes_a_transformers_folder_and_refuses_a_used_one(llama, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    used = tmp_path / "used"
    used.mkdir()
    (used / "mine.txt").write_text("keep me")
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, ["export-model", "--model", llama, "--out", used])
    assert_one_line_error(code, err, "not a new or empty folder")
    assert snapshot(tmp_path) == before
    code, err = run_cli(capsys, ["export-model", "--model", llama, "--out", tmp_path / "base"])
    assert code == 0, err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    assert AutoTokenizer.from_pretrained(tmp_path / "base").chat_template
    assert not list((tmp_path / "base").glob(".incontext*"))  # a plain transformers folder
    original = AutoModelForCausalLM.from_pretrained(llama)
    assert all((a == b).all() for a, b in zip(model.state_dict().values(), original.state_dict().values()))


def test_catalog_module_refuses_an_argument_and_writes_nothing():
    """`python -m incontext.cli.catalog` takes no argument: an unknown one is argparse's usage error (exit 2) and the
    catalog file stays as it is (the module used to regenerate it whatever it was given)."""
    import subprocess
    from pathlib import Path

    import incontext.cli

    catalog = Path(incontext.cli.__file__).with_name("catalog.json")
    before = catalog.read_bytes(), catalog.stat().st_mtime_ns
    out = subprocess.run([sys.executable, "-m", "incontext.cli.catalog", "--nosuch"], capture_output=True, text=True)
    assert out.returncode == 2 and "unrecognized arguments: --nosuch" in out.stderr and not out.stdout
    assert (catalog.read_bytes(), catalog.stat().st_mtime_ns) == before
