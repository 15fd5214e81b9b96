"""`incontext absorb` and `incontext generate` end to end on a tiny random Hugging Face Llama with a real tokenizer
(byte-level BPE), and their one-line errors."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_bpe_tokenizer

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from incontext.cli import commands as cli  # noqa: E402
from incontext.absorb import AdaptedModel  # noqa: E402
from incontext.absorb.protocol import METHODS  # noqa: E402
from incontext.absorb.decode import stream_tokens  # noqa: E402
from incontext.interop.models import load_model  # noqa: E402

SENTENCES = ["Ada Lovelace was born in London.", "Q: Where was Ada born?\nA: London", "Alan Turing works as a "
             "mathematician.", "The cat sat on the mat and the dog ran in the park.", "What is the name of the pet?"]
PROMPT = "Ada Lovelace was born in London.\nAlan Turing has a pet cat named Mat.\n"
QUESTION = "Q: Where was Ada born?\nA:"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_llama(folder, seed):
    """A random 2-layer Llama with a byte-level BPE tokenizer trained on SENTENCES and a chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_bpe_tokenizer(SENTENCES, 320, CHAT_TEMPLATE)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96, initializer_range=0.3,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("llama"), seed=0))


@pytest.fixture(scope="module")
def other_llama(tmp_path_factory):
    return str(tiny_llama(tmp_path_factory.mktemp("other-llama"), seed=1))  # same architecture, other weights


@pytest.fixture(scope="module")
def loaded(llama):
    return load_model(llama)


def greedy_chain(adapted, ids, n, stop=()):
    """The adapted model's own greedy continuation: re-run on the whole growing sequence, argmax of the last logits."""
    chain = []
    with torch.no_grad():
        for _ in range(n):
            token = int(adapted(torch.tensor([ids + chain]))[0, -1].argmax())
            if token in stop:
                break
            chain.append(token)
    return chain


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def absorb(capsys, llama, out, method, *options, placement="raw"):
    """absorb PROMPT into the tiny Llama; placement raw unless asked (the text as it is, as these tests compare)."""
    code, printed, err = run(capsys, "absorb", "--model", llama, "--method", method, "--prompt", PROMPT,
                             "--placement", placement, "--out", str(out), *[x for option in options for x in ("--set", option)])
    assert code == 0, err
    return json.loads((out / "absorb.json").read_text())


def generate(capsys, llama, *argv):
    code, printed, err = run(capsys, "generate", "--model", llama, *argv)
    assert code == 0, err
    return printed


# ----------------------------------------------------------------------------- the method table


def test_list_and_help_import_no_torch():
    script = ("import sys\nfrom incontext.cli import main\n"
              "for args in (['absorb', '--list'], ['absorb', '--help'], ['generate', '--help']):\n"
              "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
              "sys.stderr.write('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stderr.endswith("no torch"), result.stderr[-2000:]
    for name, method in METHODS.items():
        assert f"  {name}" in result.stdout and f"needs {method.needs}:" in result.stdout


# ----------------------------------------------------------------------------- absorb, then generate


def test_keep_prompt_generates_what_the_prompted_model_generates(llama, loaded, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "keep"
    record = absorb(capsys, llama, out, "keep-prompt")
    prompt_ids, query = loaded.tokenizer.encode(PROMPT), loaded.tokenizer.encode(QUESTION)
    assert record["method"] == "keep-prompt" and record["options"] == {} and record["model"] == llama
    assert record["prompt_sha256"] == hashlib.sha256(PROMPT.encode()).hexdigest()
    assert record["prompt_tokens"] == len(prompt_ids) and record["absorb_seconds"] >= 0
    assert sorted(record["files"]) == sorted(p.name for p in out.iterdir())
    printed = generate(capsys, llama, "--adapted", str(out), "--max-new-tokens", "12", QUESTION)
    # transformers' own model reading prompt + question: an independent reference for positions and cache
    hf = AutoModelForCausalLM.from_pretrained(llama).eval()
    reference = hf.generate(torch.tensor([prompt_ids + query]), max_new_tokens=12, do_sample=False,
                            eos_token_id=None, pad_token_id=0)[0, len(prompt_ids) + len(query):].tolist()
    assert printed == loaded.tokenizer.decode(reference) + "\n"
    # without the prompt the model says something else
    assert generate(capsys, llama, "--max-new-tokens", "12", QUESTION) != printed


class PeftReference:
    """transformers' own Llama with the absorb folder's PEFT adapter (PeftModel.from_pretrained), reading queries at
    the positions after the prompt as the distilled student does: an independent reference for `generate`."""

    def __init__(self, llama, out):
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        self.model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama), out / "peft_adapter").eval()
        self.offset = json.loads((out / "absorb.json").read_text())["prompt_tokens"]

    def __call__(self, ids):
        return self.model(ids, position_ids=torch.arange(self.offset, self.offset + ids.shape[1])[None]).logits


DISTILL = ["steps=3", "learning_rate=0.05", "study.n_continuations=1", "study.continuation_tokens=4", "progress=false"]


@pytest.mark.parametrize("method, options", [("dynamic-eval", ["learning_rate=0.05", "n_steps=2"]),
                                             ("distill-lora", DISTILL), ("distill-lora", DISTILL + ["merge=false"]),
                                             ("kv-prefix", DISTILL + ["prefix_tokens=4"])])
def test_generate_from_an_absorb_folder_follows_the_adapted_models_argmax(method, options, llama, loaded, tmp_path, capsys):
    out = tmp_path / method
    record = absorb(capsys, llama, out, method, *options)
    assert record["options"]["learning_rate"] == 0.05
    if method == "distill-lora":  # the adapter alone is written: a few MB, not the whole base
        assert sorted(record["files"]) == [".incontext-experiment", "absorb.json", "peft_adapter/README.md", "peft_adapter/adapter_config.json",
                                           "peft_adapter/adapter_model.safetensors"]
        adapted = PeftReference(llama, out)
    else:
        adapted = AdaptedModel.load(out, base=loaded.model)
    assert sorted(record["files"]) == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    query = loaded.tokenizer.encode(QUESTION)
    printed = generate(capsys, llama, "--adapted", str(out), "--max-new-tokens", "10", QUESTION)
    chain = greedy_chain(adapted, query, 10, stop={loaded.tokenizer.eos_token_id})
    assert printed == loaded.tokenizer.decode(chain) + "\n"
    base = greedy_chain(loaded.model, query, 10, stop={loaded.tokenizer.eos_token_id})
    assert chain != base  # the absorbed prompt changed the answer (else the check above proves little)
    # sampling: seeded, repeatable
    sampled = [generate(capsys, llama, "--adapted", str(out), "--sample", "--temperature", "0.7", "--top-k", "20",
                        "--seed", "3", "--max-new-tokens", "8", QUESTION) for _ in range(2)]
    assert sampled[0] == sampled[1]


@pytest.mark.parametrize("rollbacks", [0, 2])
def test_absorb_says_when_training_rolled_back(rollbacks, llama, tmp_path, capsys, monkeypatch):
    from incontext.absorb.distill import Rollback

    monkeypatch.setattr(Rollback, "record", lambda self: {"rollbacks": rollbacks, "best_window_loss": 0.5})
    code, printed, err = run(capsys, "absorb", "--model", llama, "--method", "kv-prefix", "--prompt", PROMPT, "--out",
                             str(tmp_path / "a"), *[x for o in DISTILL + ["prefix_tokens=4"] for x in ("--set", o)])
    assert code == 0, err
    assert json.loads((tmp_path / "a" / "absorb.json").read_text())["history"]["rollbacks"] == rollbacks
    assert ("training diverged 2 time(s)" in printed) == (rollbacks == 2)


def test_the_python_line_of_absorb_json_runs_as_written(llama, loaded, tmp_path, capsys):
    """absorb.json's `python` line (the public import, incontext.absorb.load_adapted) runs as a user pastes it, with
    FOLDER and query_ids filled in, and gives load_adapted's logits."""
    from incontext.absorb import load_adapted

    out = tmp_path / "prefix"
    record = absorb(capsys, llama, out, "kv-prefix", *DISTILL, "prefix_tokens=4")
    assert "from incontext.absorb import load_adapted" in record["python"]
    query = torch.tensor([loaded.tokenizer.encode(QUESTION)])
    scope = {"FOLDER": str(out), "query_ids": query}
    with torch.no_grad():
        exec(record["python"], scope)
        expected = load_adapted(out, loaded.model, llama)(query)
    torch.testing.assert_close(scope["logits"], expected)


def test_a_distilled_adapter_reloads_with_the_logits_of_the_absorbed_model(llama, loaded, tmp_path, capsys):
    from incontext.absorb import get_absorb_method
    from incontext.absorb.folder import load_adapted

    out = tmp_path / "lora"
    record = absorb(capsys, llama, out, "distill-lora", *DISTILL, "merge=false")
    assert record["peft_adapter"]["written"] and record["peft_adapter"]["query_position"] == record["prompt_tokens"]
    # the same absorb in this process (seeded, deterministic on CPU): the model the folder should give back
    method = get_absorb_method("distill-lora", **{k: v for k, v in record["options"].items()})
    absorbed = method.absorb(loaded.model, torch.tensor(loaded.tokenizer.encode(PROMPT)), codec=loaded.tokenizer)
    reloaded = load_adapted(out, loaded.model, llama)
    query = torch.tensor([loaded.tokenizer.encode(QUESTION)])
    with torch.no_grad():
        ours, reference, theirs = reloaded(query), absorbed(query), PeftReference(llama, out)(query)
        base = loaded.model(query, position_offset=record["prompt_tokens"])
    assert (ours - reference).abs().max() < 1e-5 * reference.abs().max()
    assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()
    assert (ours - base).abs().max() > 1e-3 * ours.abs().max()  # the adapter is not a no-op


def test_chat_wraps_the_text_in_the_template_and_stops_at_end_of_turn(llama, loaded, tmp_path, capsys):
    text = loaded.tokenizer.chat([{"role": "user", "content": "Where was Ada born?"}], add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    ids = loaded.tokenizer.encode(text)
    printed = generate(capsys, llama, "--chat", "--max-new-tokens", "10", "Where was Ada born?")
    end = loaded.tokenizer.eos_token_id
    assert printed == loaded.tokenizer.decode(greedy_chain(loaded.model, ids, 10, stop={end})) + "\n"


def test_a_system_placed_document_then_generate_chat_is_the_conversation(llama, loaded, tmp_path, capsys):
    """absorb --placement system (auto's choice for a tokenizer with a chat template) absorbs the document as the
    template's system turn; generate --chat then continues that conversation: keep-prompt generates exactly what the
    model generates from the whole conversation rendered at once (the document in its system turn)."""
    out = tmp_path / "keep-system"
    record = absorb(capsys, llama, out, "keep-prompt", placement="auto")
    codec = loaded.tokenizer
    assert record["placement"] == "system"
    conversation = codec.chat([{"role": "system", "content": PROMPT}, {"role": "user", "content": "Where was Ada born?"}],
                              add_generation_prompt=True)
    head = codec.chat([{"role": "system", "content": PROMPT}, {"role": "user", "content": "X"}], add_generation_prompt=True)
    assert record["prompt_tokens"] == len(codec.encode(head[: head.rindex("X")]))
    printed = generate(capsys, llama, "--adapted", str(out), "--chat", "--max-new-tokens", "6", "Where was Ada born?")
    stop = {codec.tokenizer.convert_tokens_to_ids("<|im_end|>"), codec.eos_token_id}
    expected = greedy_chain(loaded.model, codec.encode(conversation), 6, stop)
    assert printed == codec.decode(expected) + "\n"
    raw = tmp_path / "keep-raw"
    absorb(capsys, llama, raw, "keep-prompt")
    with pytest.raises(AssertionError, match="differently"):  # two placements do not compose
        generate(capsys, llama, "--adapted", str(out), "--adapted", str(raw), "--chat", "Hi?")


def test_stream_tokens_stops_before_a_stop_token(loaded):
    ids = loaded.tokenizer.encode(QUESTION)
    chain = list(stream_tokens(loaded.model, ids, 12))
    assert chain == greedy_chain(loaded.model, ids, 12)
    cut = next(i for i in range(1, len(chain)) if chain[i] not in chain[:i])
    assert list(stream_tokens(loaded.model, ids, 12, stop_ids={chain[cut]})) == chain[:cut]


def test_absorb_may_rewrite_its_own_folder(llama, tmp_path, capsys):
    out = tmp_path / "again"
    absorb(capsys, llama, out, "distill-lora", "steps=1", "study.n_continuations=0", "progress=false")
    assert (out / "peft_adapter").is_dir()
    absorb(capsys, llama, out, "keep-prompt")  # the earlier adapter is not this model's: removed
    assert sorted(p.name for p in out.iterdir()) == [".incontext-experiment", "absorb.json", "adapted.json", "adapted.safetensors"]
    absorb(capsys, llama, out, "distill-lora", "steps=1", "study.n_continuations=0", "progress=false")
    assert sorted(p.name for p in out.iterdir()) == [".incontext-experiment", "absorb.json", "peft_adapter"]  # keep-prompt's model removed


def test_a_kill_while_absorbing_leaves_no_absorb_folder(llama, tmp_path):
    """SIGKILL in the middle of training: the files are written only after the method returns, into a hidden
    staging folder that then takes the folder's place, so nothing (no folder, no half-written file) is left."""
    import os
    import signal
    import time

    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    child = subprocess.Popen([sys.executable, "-m", "incontext.cli", "absorb", "--model", llama, "--method", "kv-prefix",
                              "--prompt", PROMPT, "--out", str(out), "--set", "steps=100000", "--set", "patience=100000",
                              "--set", "progress=true"], stderr=subprocess.PIPE, env=env, text=True)
    try:
        seen = ""
        while "kv-prefix:" not in seen:  # the training bar: the data stage is done, training runs
            char = child.stderr.read(1)
            assert char, f"absorb ended before training: {seen[-300:]}"
            seen += char
        time.sleep(0.5)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_crash_while_writing_keeps_the_earlier_absorb_folder(llama, tmp_path, capsys, monkeypatch):
    """A failure half-way through writing (here: after the adapted model's tensors are written) leaves the earlier
    absorb folder as it was and no staging folder; the next absorb replaces the folder whole."""
    out = tmp_path / "again"
    absorb(capsys, llama, out, "keep-prompt")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def crash(self, folder):
        (Path(folder) / "adapted.safetensors").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(AdaptedModel, "save", crash)
    code, _, err = run(capsys, "absorb", "--model", llama, "--method", "keep-prompt", "--prompt", PROMPT + "More.",
                       "--out", str(out))
    assert code != 0 and "disk full" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]
    monkeypatch.undo()
    record = absorb(capsys, llama, out, "distill-lora", "steps=1", "study.n_continuations=0", "progress=false")
    assert sorted(p.name for p in out.iterdir()) == [".incontext-experiment", "absorb.json", "peft_adapter"]
    assert record["method"] == "distill-lora" and sorted(p.name for p in tmp_path.iterdir()) == ["again"]


# ----------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("argv, message", [
    (["--method", "iclca", "--prompt", PROMPT], "iclca does not apply to model"),
    (["--method", "cgt-fold", "--prompt", PROMPT], ": needs a CGT model"),
    (["--method", "keep-prompt", "--prompt", "word " * 120], "reads at most 96 (and the question needs room"),
    (["--method", "keep-prompt", "--prompt", ""], "--prompt is empty"),
    (["--method", "keep-prompt", "--prompt", " \n"], "--prompt is empty"),
    (["--method", "keep-prompt", "--prompt-file", "EMPTY"], "is empty: there is nothing to absorb"),
    (["--method", "keep-prompt", "--prompt-file", "MISSING"], "no such file"),
    (["--method", "keep-prompt", "--prompt", PROMPT, "--prompt-file", "EMPTY"], "exactly one of --prompt"),
    (["--method", "keep-prompt"], "exactly one of --prompt"),
    (["--method", "keep-prompt", "--prompt", PROMPT, "--set", "colour=red"], "keep-prompt: unknown option 'colour'"),
    (["--method", "dynamic-eval", "--prompt", PROMPT, "--set", "speed=2"], "options: learning_rate, n_steps"),
    (["--method", "dynamic-eval", "--prompt", PROMPT, "--set", "speed"], "must look like OPTION=VALUE"),
    (["--method", "magic", "--prompt", PROMPT], "unknown absorb method 'magic'"),
    (["--method", "iclca-approx", "--prompt", PROMPT, "--set", "layers=x"], "layers must be 'all' or a list"),
    (["--method", "iclca-approx", "--prompt", PROMPT, "--set", "layers=50-60"], "layers must name at least one of the model's layers"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "prefix_tokens=0"], "prefix_tokens must be an integer >= 1"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "prefix_tokens=500"], "exceeds the document's"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "learning_rate=nan"], "learning_rate must be a finite number"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "study.top_k=0"], "top_k must be an integer >= 1"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "init=zeros"], "init must be one of"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "study.seed_prompts=poems"], "seed_prompts must be"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "autocast=int4"], "autocast must be one of none, bfloat16"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "tf32=maybe"], "tf32"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--set", "study.wording_ensemble=true"], "groups training questions by question, and there are none"),
    (["--method", "distill-lora", "--prompt", PROMPT, "--set", "study.wording_ensemble=true"], "groups training questions by question, and there are none"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--train-queries", "MISSING"], "--train-queries"),
    (["--method", "kv-prefix", "--prompt", PROMPT, "--train-queries", "EMPTY"], "holds no questions"),
])
def test_bad_absorb_input_is_one_line_and_writes_nothing(argv, message, llama, tmp_path, capsys):
    (tmp_path / "EMPTY").write_text("")
    argv = [str(tmp_path / a) if a in ("EMPTY", "MISSING") else a for a in argv]
    code, _, err = run(capsys, "absorb", "--model", llama, *argv, "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


TRAIN_QUERIES = "Ada Lovelace was born in\nWhere was Ada born?\n\n\nWhat pet does Alan have?\n"


@pytest.mark.parametrize("placement", ["raw", "system"])
@pytest.mark.parametrize("method, options", [("distill-lora", DISTILL), ("kv-prefix", DISTILL + ["prefix_tokens=4"])])
def test_train_queries_reach_the_method_as_from_python(method, options, placement, llama, loaded, tmp_path, capsys):
    """--train-queries FILE: each line asked as 'Q: LINE\nA:' after the prompt (placement raw; system: the document as
    the chat template's system turn and each question the user's turn after it, as generate --chat asks), the lines
    of a block one question (train_groups); the folder holds what the method's own absorb gives from Python with
    those queries and groups."""
    from incontext.absorb import get_absorb_method
    from incontext.config import parse_overrides
    from incontext.tasks.placement import chat_turn, placed_document

    file = tmp_path / "questions.txt"
    file.write_text(TRAIN_QUERIES)
    out = tmp_path / method
    options = options + ["study.wording_ensemble=true"]
    code, printed, err = run(capsys, "absorb", "--model", llama, "--method", method, "--prompt", PROMPT, "--train-queries",
                             str(file), "--placement", placement, "--out", str(out),
                             *[x for option in options for x in ("--set", option)])
    assert code == 0, err
    record = json.loads((out / "absorb.json").read_text())
    held = record["history"]["heldout_kl"]  # the true KL on fresh continuations, in absorb.json and printed
    assert f"held-out KL(teacher || student): {held['before']:.4f} -> {held['after']:.4f}" in printed
    text = "Ada Lovelace was born in\nWhere was Ada born?\n\nWhat pet does Alan have?"
    assert record["train_queries"] == {"questions": 2, "wordings": 3, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    assert record["history"]["pool"]["train_queries"] == 3 and record["placement"] == placement
    codec = loaded.tokenizer
    asked = (lambda q: f"Q: {q}\nA:") if placement == "raw" else (lambda q: chat_turn(codec, q, "system"))
    queries = [torch.tensor(codec.encode(q)) for q in ("Ada Lovelace was born in", asked("Where was Ada born?"),
                                                        asked("What pet does Alan have?"))]
    document = torch.tensor(codec.encode(placed_document(codec, PROMPT, placement)))
    assert record["prompt_tokens"] == len(document)
    mine = get_absorb_method(method, **parse_overrides(options, flat=True)).absorb(
        loaded.model, document, codec=codec, train_queries=queries, train_groups=[0, 0, 1])
    theirs = PeftReference(llama, out) if method == "distill-lora" else AdaptedModel.load(out, base=loaded.model)
    ids = torch.tensor([codec.encode(QUESTION if placement == "raw" else asked("Where was Ada born?"))])
    with torch.no_grad():
        assert torch.allclose(theirs(ids), mine(ids), atol=1e-4, rtol=1e-4)
        assert not torch.allclose(mine(ids), get_absorb_method(method, **parse_overrides(options[:-1], flat=True)).absorb(
            loaded.model, document, codec=codec)(ids), atol=1e-3)  # the queries mattered


@pytest.mark.parametrize("argv, message", [
    (["--method", "keep-prompt", "--prompt", PROMPT], "keep-prompt does not learn from training questions"),
    (["--method", "kv-prefix", "--prompts", "FOLDER"], "--train-queries goes with one prompt"),
])
def test_train_queries_where_they_do_not_apply_are_one_line_errors(argv, message, llama, tmp_path, capsys):
    (tmp_path / "FOLDER").mkdir()
    (tmp_path / "FOLDER" / "a.txt").write_text(PROMPT)
    (tmp_path / "q.txt").write_text(TRAIN_QUERIES)
    argv = [str(tmp_path / a) if a == "FOLDER" else a for a in argv]
    code, _, err = run(capsys, "absorb", "--model", llama, *argv, "--train-queries", str(tmp_path / "q.txt"),
                       "--out", str(tmp_path / "o"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_train_query_lines_are_asked_as_questions_or_read_as_statements(loaded):
    """A line ending in ?, . or ! is asked as 'Q: LINE\\nA:'; one without is the start of a statement, read as it is;
    on a new line when the prompt does not end in one."""
    from incontext.absorb.protocol import max_context
    from incontext.tasks.queries import train_query_ids, train_query_text

    assert train_query_text("Where was Ada born?") == "Q: Where was Ada born?\nA:"
    assert train_query_text("Name the town where Ada was born.") == "Q: Name the town where Ada was born.\nA:"
    assert train_query_text("Ada Lovelace was born in") == "Ada Lovelace was born in"
    codec = loaded.tokenizer
    groups = [["Ada Lovelace was born in", "Where was Ada born?"], ["What pet does Alan have?"]]
    ids, questions = train_query_ids(groups, codec, max_context(loaded.model), PROMPT, 20)
    assert ids[0] == codec.encode("Ada Lovelace was born in") and questions == [0, 0, 1]
    ids, _ = train_query_ids(groups, codec, max_context(loaded.model), PROMPT.rstrip(), 20)
    assert ids[1] == codec.encode("\nQ: Where was Ada born?\nA:")


def test_a_train_queries_file_is_read_in_blocks(tmp_path):
    from incontext.tasks.queries import read_train_queries

    file = tmp_path / "q.txt"
    file.write_bytes("\ufeffWhere was Ada born?  \r\nIn which town was Ada born?\r\n\r\n \r\nAda works as a\r\n".encode())
    assert read_train_queries(file) == [["Where was Ada born?", "In which town was Ada born?"], ["Ada works as a"]]


def test_a_train_query_too_long_for_the_context_is_named(llama, tmp_path, capsys):
    (tmp_path / "q.txt").write_text("Where " * 200 + "?\n")
    code, _, err = run(capsys, "absorb", "--model", llama, "--method", "kv-prefix", "--prompt", PROMPT,
                       "--train-queries", str(tmp_path / "q.txt"), "--out", str(tmp_path / "o"))
    assert code == 2 and "training question 'Where Where" in err and "reads at most 96" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


def test_absorb_refuses_a_foreign_out_folder(llama, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, _, err = run(capsys, "absorb", "--model", llama, "--method", "keep-prompt", "--prompt", PROMPT, "--out", str(out))
    assert code == 2 and "holds files this command did not write (notes.txt)" in err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


def test_several_adapted_folders_are_composed(llama, loaded, tmp_path, capsys):
    """generate --adapted A --adapted B: the folders composed by their method (kv-prefix: prefixes concatenated,
    as compose_prefixes), in the order given; mixed methods, or a method that does not compose: one-line errors."""
    from incontext.absorb.methods.kv_prefix import compose_prefixes

    first, second, keep = tmp_path / "first", tmp_path / "second", tmp_path / "keep"
    absorb(capsys, llama, first, "kv-prefix", *DISTILL, "prefix_tokens=4")
    absorb(capsys, llama, second, "kv-prefix", *DISTILL, "prefix_tokens=6", "seed=1")
    absorb(capsys, llama, keep, "keep-prompt")
    a, b = (AdaptedModel.load(folder, base=loaded.model) for folder in (first, second))
    query = loaded.tokenizer.encode(QUESTION)
    for order in ((a, b, first, second), (b, a, second, first)):
        printed = generate(capsys, llama, "--adapted", str(order[2]), "--adapted", str(order[3]), "--max-new-tokens", "10",
                           QUESTION)
        chain = greedy_chain(compose_prefixes(order[0], order[1]), query, 10, stop={loaded.tokenizer.eos_token_id})
        assert printed == loaded.tokenizer.decode(chain) + "\n"
    for folders, message in (((first, keep), "absorbed by different methods (keep-prompt, kv-prefix)"),
                             ((keep, keep), "keep-prompt does not compose")):
        code, printed, err = run(capsys, "generate", "--model", llama, *[x for f in folders for x in ("--adapted", str(f))],
                                 QUESTION)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not printed, err


def test_bad_adapted_folders_are_one_line_errors(llama, other_llama, tmp_path, capsys):
    out = tmp_path / "keep"
    absorb(capsys, llama, out, "keep-prompt")
    cases = [([llama, "--adapted", str(tmp_path / "nowhere")], "no such folder"),
             ([llama, "--adapted", str(tmp_path)], "adapted.json is missing"),
             ([other_llama, "--adapted", str(out)], f"was absorbed into {llama!r}, not into {other_llama!r}"),
             ([llama, "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
             ([llama, "--temperature", "0.5"], "only apply with --sample")]
    for argv, message in cases:
        code, printed, err = run(capsys, "generate", "--model", *argv, QUESTION)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not printed, (argv, err)
    weights = out / "adapted.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    code, _, err = run(capsys, "generate", "--model", llama, "--adapted", str(out), QUESTION)
    assert code == 2 and "is corrupt" in err and len(err.strip().splitlines()) == 1


def test_bad_peft_adapter_folders_are_one_line_errors(llama, other_llama, tmp_path, capsys):
    out = tmp_path / "lora"
    absorb(capsys, llama, out, "distill-lora", "steps=1", "study.n_continuations=0", "progress=false")

    def refused(model, message):
        code, printed, err = run(capsys, "generate", "--model", model, "--adapted", str(out), QUESTION)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not printed, err

    refused(other_llama, f"was absorbed into {llama!r}, not into {other_llama!r}")
    record = json.loads((out / "absorb.json").read_text())
    weights = out / "peft_adapter" / "adapter_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # one bit of one factor: still loads, sha256 differs
    refused(llama, "adapter_model.safetensors is corrupt (its sha256 differs")
    weights.write_bytes(good[:50])
    del record["peft_adapter"]["sha256"]
    (out / "absorb.json").write_text(json.dumps(record))
    refused(llama, "adapter_model.safetensors is corrupt")
    weights.unlink()
    refused(llama, "peft_adapter/adapter_model.safetensors is missing")
    weights.write_bytes(good)
    del record["model_fingerprint"]  # a record without a fingerprint is still read (the adapter's shapes are checked)
    (out / "absorb.json").write_text(json.dumps(record))
    assert run(capsys, "generate", "--model", llama, "--adapted", str(out), QUESTION)[0] == 0
    (out / "absorb.json").write_text("{broken")
    refused(llama, "absorb.json is corrupt")


@pytest.mark.parametrize("method, options", [("distill-lora", DISTILL), ("keep-prompt", [])])
def test_an_adapted_folder_generates_in_another_dtype_of_the_same_model(method, options, llama, other_llama, tmp_path,
                                                                       capsys):
    """Absorbed in float32, talked to in bfloat16 or float64: the same model (its bf16-rounded fingerprint);
    another model in bfloat16 is still refused."""
    out = tmp_path / method
    absorb(capsys, llama, out, method, *options)
    for dtype in ("bfloat16", "float64"):
        code, printed, err = run(capsys, "generate", "--model", llama, "--adapted", str(out), "--dtype", dtype,
                                 "--max-new-tokens", "3", QUESTION)
        assert code == 0 and printed.strip(), err
    code, _, err = run(capsys, "generate", "--model", other_llama, "--adapted", str(out), "--dtype", "bfloat16", QUESTION)
    assert code == 2 and "was absorbed into" in err


def test_each_command_resolves_its_device_once(llama, tmp_path, capsys, monkeypatch):
    """The CLI builds one Runtime from --device / --dtype and passes it down: the model's load does not resolve the
    device again (absorb, generate, generate --prompts-file, chat, compare)."""
    import io

    from incontext import runtime

    calls = []
    parse_device = runtime.parse_device
    monkeypatch.setattr(runtime, "parse_device", lambda name: calls.append(name) or parse_device(name))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(QUESTION.replace("\n", "\\n") + "\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Where was Ada born?\n"))
    commands = {"absorb": ["absorb", "--model", llama, "--method", "keep-prompt", "--prompt", PROMPT,
                           "--out", str(tmp_path / "absorbed")],
                "generate": ["generate", "--model", llama, "--max-new-tokens", "2", QUESTION],
                "generate --prompts-file": ["generate", "--model", llama, "--max-new-tokens", "2",
                                            "--prompts-file", str(prompts)],
                "chat": ["chat", "--model", llama, "--max-new-tokens", "2"],
                "compare": ["compare", "--model", llama, "--task", "continuation", "--episodes", "1",
                            "--set", "prompt_tokens=32", "--set", "query_tokens=8",
                            "--methods", "keep-prompt,drop-prompt", "--out", str(tmp_path / "compare")]}
    for name, argv in commands.items():
        calls.clear()
        code, _, err = run(capsys, *argv)
        assert code == 0, (name, err)
        assert calls == ["cpu"], name


def test_kvzip_absorbs_into_a_hugging_face_folder_and_generate_reads_it(llama, loaded, tmp_path, capsys):
    """kv-press's default press (KVzip: a different count of pairs per head) on a user's own Hugging Face model: the
    folder is written, generate continues it with the per-head mask and gives the adapted model's own greedy chain."""
    out = tmp_path / "kvzip"
    absorb(capsys, llama, out, "kv-press", "press=kvzip", "ratio=0.3")
    adapted = AdaptedModel.load(out, base=loaded.model)
    assert any(getattr(layer, "keep", None) is not None for layer in adapted.state().layers)
    code, printed, err = run(capsys, "generate", "--model", llama, "--adapted", str(out), "--max-new-tokens", "5",
                             QUESTION)
    assert code == 0, err
    ids = loaded.tokenizer.encode(QUESTION)
    assert printed == loaded.tokenizer.decode(list(stream_tokens(adapted, ids, 5, stop_ids={loaded.tokenizer.eos_token_id}))) + "\n"
