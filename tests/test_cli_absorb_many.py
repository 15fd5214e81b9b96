"""`incontext absorb --prompts DIR`: one adapted model per prompt file, and the same under torchrun with two CPU
processes (each a shard of the files): the files written are those one process writes."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_cli_absorb import QUESTION, run, tiny_llama  # noqa: E402

PROMPTS = {"ada": "Ada Lovelace was born in London.\n", "alan": "Alan Turing has a pet cat named Mat.\n",
           "both": "Ada Lovelace was born in London.\nAlan Turing has a pet cat named Mat.\n"}
DISTILL = ["--set", "steps=2", "--set", "study.n_continuations=1", "--set", "study.continuation_tokens=4", "--set", "progress=false"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("llama"), seed=0))


@pytest.fixture
def prompts(tmp_path):
    folder = tmp_path / "prompts"
    folder.mkdir()
    for name, text in PROMPTS.items():
        (folder / f"{name}.txt").write_text(text)
    (folder / "notes.md").write_text("not a prompt")  # only .txt files are prompts
    return folder


def contents(folder):
    """Every file's sha256, absorb.json without its timing and the summary without the process count."""
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.name == "absorb.json":
            record = json.loads(data)
            record.pop("absorb_seconds")
            record.get("history", {}).pop("teacher_seconds", None)
            record.get("history", {}).pop("train_seconds", None)
            data = json.dumps(record, sort_keys=True).encode()
        if path.name == "absorb-many.json":
            record = json.loads(data)
            record.pop("processes")
            for entry in record["adapted"].values():
                entry.pop("absorb_seconds")
            data = json.dumps(record, sort_keys=True).encode()
        out[str(path.relative_to(folder))] = hashlib.sha256(data).hexdigest()
    return out


@pytest.mark.parametrize("method, options", [("keep-prompt", []), ("distill-lora", DISTILL)])
def test_one_adapted_model_per_prompt_file(llama, prompts, tmp_path, capsys, method, options):
    out = tmp_path / "many"
    code, printed, err = run(capsys, "absorb", "--model", llama, "--method", method, "--prompts", str(prompts),
                             "--out", str(out), *options)
    assert code == 0, err
    summary = json.loads((out / "absorb-many.json").read_text())
    assert sorted(summary["adapted"]) == sorted(PROMPTS) and summary["processes"] == 1
    for name, text in PROMPTS.items():
        record = json.loads((out / name / "absorb.json").read_text())
        assert record["prompt_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    code, answer, err = run(capsys, "generate", "--model", llama, "--adapted", str(out / "ada"), "--max-new-tokens", "4",
                            QUESTION)
    assert code == 0, err
    # again into the same folder: its own earlier output, allowed; a foreign folder is refused
    assert run(capsys, "absorb", "--model", llama, "--method", method, "--prompts", str(prompts), "--out", str(out),
               *options)[0] == 0
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    code, _, err = run(capsys, "absorb", "--model", llama, "--method", method, "--prompts", str(prompts),
                       "--out", str(foreign), *options)
    assert code == 2 and "no marker of 'absorb-many'" in err and (foreign / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "nowhere"], "no such folder"),
    (["--prompts", "EMPTY"], "holds no .txt files"),
    (["--prompts", "PROMPTS", "--prompt", "x"], "exactly one of"),
])
def test_bad_prompt_folders_are_one_line(llama, prompts, tmp_path, capsys, argv, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [{"EMPTY": str(empty), "PROMPTS": str(prompts)}.get(a, a) for a in argv]
    code, _, err = run(capsys, "absorb", "--model", llama, "--method", "keep-prompt", *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_torchrun_shards_the_prompts_and_writes_what_one_process_writes(llama, prompts, tmp_path, capsys):
    single = tmp_path / "single"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread each: the same summation order in every process
    result = subprocess.run([sys.executable, "-m", "incontext.cli", "absorb", "--model", llama, "--method", "distill-lora",
                             "--prompts", str(prompts), "--out", str(single), *DISTILL],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "incontext.cli",
         "absorb", "--model", llama, "--method", "distill-lora", "--prompts", str(prompts), "--out", str(tmp_path / "two"),
         *DISTILL], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "absorb-many.json").read_text())["processes"] == 2
    assert contents(tmp_path / "two") == contents(single)
