"""`incontext chat` driven through stdin, and `incontext generate --prompts-file`, on tiny random Hugging Face Llamas
with a real tokenizer (with and without a chat template): the answers are the model's own greedy continuations of
the conversation, commands work, bad lines are one-line notes and the session goes on."""

import io
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
from incontext.absorb.decode import stream_tokens  # noqa: E402
from incontext.absorb.decode import END_OF_TURN
from incontext.absorb.folder import composed_folders  # noqa: E402
from incontext.interop.models import load_model  # noqa: E402

SENTENCES = ["Ada Lovelace was born in London.", "Q: Where was Ada born?\nA: London", "Alan Turing works as a "
             "mathematician.", "The cat sat on the mat and the dog ran in the park.", "What is the name of the pet?"]
PROMPT = "Ada Lovelace was born in London.\nAlan Turing has a pet cat named Mat.\n"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
QUESTIONS = ["Where was Ada born?", "And Alan?", "What is the pet?"]


def tiny_llama(folder, seed, template=CHAT_TEMPLATE):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tiny_bpe_tokenizer(SENTENCES, 320, template)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=160, initializer_range=0.3,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("llama"), seed=0)


@pytest.fixture(scope="module")
def base_llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("base-llama"), seed=2, template=None)  # no chat template


@pytest.fixture(scope="module")
def loaded(llama):
    return load_model(llama)


@pytest.fixture(scope="module")
def absorbed(llama, tmp_path_factory):
    """keep-prompt absorb folders of `llama` and of another model of the same architecture."""
    folders = {}
    for name, model in (("mine", llama), ("other", tiny_llama(tmp_path_factory.mktemp("other"), seed=1))):
        out = tmp_path_factory.mktemp("absorbed") / name
        assert cli.main(["absorb", "--model", model, "--method", "keep-prompt", "--prompt", PROMPT, "--out", str(out)]) == 0
        folders[name] = str(out)
    return folders


def chat(capsys, monkeypatch, lines, *argv):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(line + "\n" for line in lines)))
    code = cli.main(["chat", *argv])
    captured = capsys.readouterr()
    return code, lines_of(captured.out), captured.err.splitlines()


def lines_of(text):
    """Output lines split at \n alone (a random model's answer may hold a form feed, which splitlines splits at)."""
    return text[:-1].split("\n") if text else []


def greedy(runner, codec, text, n, stop):
    ids = codec.encode(text)
    return codec.decode(list(stream_tokens(runner, ids, n, stop_ids=stop)))


def turn_stops(codec):
    vocab = codec.tokenizer.get_vocab()
    return {codec.eos_token_id} | {vocab[t] for t in END_OF_TURN if t in vocab}


def expected_template_turns(loaded, runner, questions, n, document=None):
    """Each answer of one conversation: greedy after the template's rendering of the turns so far (with `document`:
    the model alone reading the conversation whose system turn is the document, as keep-prompt absorbed it)."""
    codec, messages, answers = loaded.tokenizer, [], []
    system = [] if document is None else [{"role": "system", "content": document}]
    runner = runner if document is None else loaded.model
    for question in questions:
        messages.append({"role": "user", "content": question})
        answer = greedy(runner, codec, codec.chat(system + messages, add_generation_prompt=True), n, turn_stops(codec))
        messages.append({"role": "assistant", "content": answer})
        answers.append(answer.replace("\r", "\\r").replace("\n", "\\n"))
    return answers


def test_a_conversation_through_the_template_with_reset_and_exit(llama, loaded, capsys, monkeypatch):
    code, out, err = chat(capsys, monkeypatch, [QUESTIONS[0], "", QUESTIONS[1], "/reset", QUESTIONS[1], "/exit",
                                                QUESTIONS[2]], "--model", llama, "--max-new-tokens", "6")
    assert code == 0, err
    first_two = expected_template_turns(loaded, loaded.model, QUESTIONS[:2], 6)
    fresh = expected_template_turns(loaded, loaded.model, QUESTIONS[1:2], 6)
    assert out == first_two + fresh  # the blank line is skipped, nothing after /exit is read
    assert err == ["incontext: (the conversation starts over)"]


def test_the_first_turn_is_what_generate_chat_prints(llama, capsys, monkeypatch):
    code, out, _ = chat(capsys, monkeypatch, [QUESTIONS[0]], "--model", llama, "--max-new-tokens", "6")
    assert code == 0
    assert cli.main(["generate", "--model", llama, "--chat", "--max-new-tokens", "6", QUESTIONS[0]]) == 0
    assert out == [capsys.readouterr().out.rstrip("\n").replace("\r", "\\r").replace("\n", "\\n")]


def test_an_adapted_folder_answers_and_bad_lines_are_one_line_notes(llama, loaded, absorbed, capsys, monkeypatch):
    lines = [QUESTIONS[0], "/frobnicate", f"/adapted {absorbed['other']}", "/adapted", "/adapted /no/such/folder",
             QUESTIONS[1], "/base", QUESTIONS[0]]
    code, out, err = chat(capsys, monkeypatch, lines, "--model", llama, "--adapted", absorbed["mine"],
                          "--max-new-tokens", "6")
    assert code == 0, err
    adapted = composed_folders([Path(absorbed["mine"])], loaded.model, llama)
    # the document absorbed as the template's system turn (absorb's placement for a model with a template): keep-prompt
    # answers as the model reading the whole conversation; the bad lines changed nothing
    assert out[:2] == expected_template_turns(loaded, adapted, QUESTIONS[:2], 6, document=PROMPT)
    assert out[2:] == expected_template_turns(loaded, loaded.model, QUESTIONS[:1], 6)  # /base: the model alone
    assert len(err) == 5 and all(line.startswith("incontext: ") for line in err)
    assert err[0].startswith("incontext: unknown command /frobnicate: /reset")
    assert err[1].startswith(f"incontext: /adapted {absorbed['other']} was absorbed into ")
    assert err[1].endswith("still answering as before")
    assert "needs one or more absorb folders" in err[2] and "no such folder" in err[3]
    assert err[4].endswith("alone; the conversation starts over)")
    keep = composed_folders([Path(absorbed["mine"])], loaded.model, llama)
    assert greedy(keep, loaded.tokenizer, "Q: Where", 4, set()) != greedy(loaded.model, loaded.tokenizer, "Q: Where", 4, set())


def test_adapted_mid_session_switches_and_starts_over(llama, loaded, absorbed, capsys, monkeypatch):
    code, out, err = chat(capsys, monkeypatch, [QUESTIONS[0], f"/adapted {absorbed['mine']}", QUESTIONS[1]],
                          "--model", llama, "--max-new-tokens", "6")
    assert code == 0, err
    adapted = composed_folders([Path(absorbed["mine"])], loaded.model, llama)
    assert out == (expected_template_turns(loaded, loaded.model, QUESTIONS[:1], 6)
                   + expected_template_turns(loaded, adapted, QUESTIONS[1:2], 6, document=PROMPT))
    assert err == [f"incontext: (answering from {absorbed['mine']}; the conversation starts over)"]


def test_a_base_model_without_a_template_talks_in_plain_qa_turns(base_llama, capsys, monkeypatch):
    base = load_model(base_llama)
    code, out, err = chat(capsys, monkeypatch, QUESTIONS[:2], "--model", base_llama, "--max-new-tokens", "8")
    assert code == 0, err
    codec, stop, history, expected = base.tokenizer, {base.tokenizer.eos_token_id}, "", []
    for question in QUESTIONS[:2]:
        text = greedy(base.model, codec, history + f"Q: {question}\nA:", 8, stop).lstrip().split("\n", 1)[0]
        expected.append(text)
        history += f"Q: {question}\nA: {text.strip()}\n"
    assert out == expected


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--temperature", "0.5"], "--temperature and --top-k only apply with --sample"),
    (["--adapted", "/no/such/folder"], "no such folder"),
])
def test_bad_options_are_one_line_errors(llama, capsys, monkeypatch, argv, message):
    code, out, err = chat(capsys, monkeypatch, [QUESTIONS[0]], "--model", llama, *argv)
    assert code == 2 and out == [] and len(err) == 1 and message in err[0]


def test_an_absorb_folder_of_another_model_at_start_is_a_one_line_error(llama, absorbed, capsys, monkeypatch):
    code, out, err = chat(capsys, monkeypatch, [QUESTIONS[0]], "--model", llama, "--adapted", absorbed["other"])
    assert code == 2 and out == [] and len(err) == 1 and "was absorbed into" in err[0]


def test_chat_help_imports_no_torch():
    script = ("import sys\nfrom incontext.cli import main\n"
              "try:\n    main(['chat', '--help'])\nexcept SystemExit:\n    pass\n"
              "sys.stderr.write('torch imported' if 'torch' in sys.modules else 'no torch')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.stderr.endswith("no torch") and "/reset" in result.stdout


# ----------------------------------------------------------------------------- generate --prompts-file


def test_prompts_file_answers_each_line_as_generate_does(llama, absorbed, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Q: Where was Ada born?\\nA:\n\nThe cat sat\nWhat is the name of the pet?\n")
    base = ["generate", "--model", llama, "--adapted", absorbed["mine"], "--max-new-tokens", "5"]
    assert cli.main([*base, "--prompts-file", str(prompts)]) == 0
    lines = lines_of(capsys.readouterr().out)
    singles = []
    for text in ("Q: Where was Ada born?\nA:", "The cat sat", "What is the name of the pet?"):
        assert cli.main([*base, text]) == 0
        singles.append(capsys.readouterr().out[:-1].replace("\r", "\\r").replace("\n", "\\n"))
    assert lines == singles
    assert cli.main([*base, "--chat", "--jsonl", "--prompts-file", str(prompts)]) == 0
    records = [json.loads(line) for line in lines_of(capsys.readouterr().out)]
    assert [r["line"] for r in records] == [1, 3, 4] and records[1]["prompt"] == "The cat sat"
    assert cli.main([*base, "--chat", "The cat sat"]) == 0
    assert records[1]["output"] == capsys.readouterr().out[:-1] and records[1]["tokens"] <= 5


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"), ("empty", "holds no prompts"), ("both", "exactly one of TEXT and --prompts-file"),
    ("jsonl alone", "--jsonl goes with --prompts-file"), ("too long", "line 2: the prompt has"),
])
def test_prompts_file_errors_are_one_line_and_print_no_answer(llama, tmp_path, capsys, case, message):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text({"empty": "\n  \n", "too long": "fine\n" + "the cat sat on the mat " * 60 + "\n"}.get(case, "a\n"))
    argv = ["generate", "--model", llama, "--prompts-file", str(prompts if case != "missing" else tmp_path / "nope")]
    if case == "both":
        argv.append("some text")
    if case == "jsonl alone":
        argv = ["generate", "--model", llama, "--jsonl", "some text"]
    code = cli.main(argv)
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and len(captured.err.splitlines()) == 1 and message in captured.err


def test_ctrl_c_stops_the_answer_and_the_conversation_goes_on(llama, capsys, monkeypatch):
    """Ctrl-C while chat answers: that answer stops (one line on stderr), the next question is answered, exit 0."""
    import incontext.cli.chat as chat_module

    real, calls = chat_module.stream_answer, []

    def interrupted_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(chat_module, "stream_answer", interrupted_once)
    code, out, err = chat(capsys, monkeypatch, ["Hello?", "Where was Ada born?"], "--model", llama, "--max-new-tokens", "3")
    assert code == 0 and len(calls) == 2
    assert [line for line in err if "interrupted" in line] == ["incontext: (interrupted: the answer stopped; ask again, or /exit)"]
    assert not any("Traceback" in line for line in err)


def test_ctrl_c_in_a_command_is_one_line_and_exit_130(llama, capsys, monkeypatch):
    import incontext.cli.generate as generate_module

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_module, "stream_tokens", interrupt)
    code = cli.main(["generate", "--model", llama, "--max-new-tokens", "3", "Hi"])
    err = capsys.readouterr().err
    assert code == 130 and err.strip() == "incontext: interrupted"


def test_chat_exits_non_zero_when_every_question_was_refused_for_room(llama, capsys, monkeypatch):
    code, out, err = chat(capsys, monkeypatch, ["word " * 200], "--model", llama, "--max-new-tokens", "3")
    assert code == 2 and any("no room is left" in line for line in err)
