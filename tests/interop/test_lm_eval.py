"""lm-evaluation-harness on absorb folders, offline: a tiny random Llama (a tokenizer with a chat template) absorbs
tests/data/lm_eval/document.txt as its system turn (distill-lora: a PEFT adapter; kv-prefix: a K/V prefix;
keep-prompt: the document's K/V cache), and lm-eval scores the folders on the local tasks of tests/data/lm_eval,
through its own `hf` model with `peft=` (distill-lora) and through the `incontext` model of incontext.cli.lm_eval
(any folder). Every score is checked against one computed by hand from transformers' model (with the PEFT adapter),
the prompted base model or the loaded adapted model."""

import functools
import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import tiny_bpe_tokenizer

pytest.importorskip("lm_eval")  # a dev dependency (pyproject's dev extra; scripts/env.sh installs it)
pytest.importorskip("transformers")
pytest.importorskip("peft")

from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

from incontext.cli import commands as cli  # noqa: E402
from incontext.absorb import AdaptedModel  # noqa: E402
from incontext.cli.lm_eval import IncontextLM  # noqa: E402  (registers the `incontext` model)
from incontext.interop.models import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "data" / "lm_eval"
DOCUMENT = TASKS / "document.txt"
ROWS = [json.loads(line) for line in (TASKS / "facts_tiny.jsonl").read_text().splitlines() if line.strip()]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
OPTIONS = ["steps=3", "learning_rate=0.05", "study.n_continuations=1", "study.continuation_tokens=4", "progress=false"]
METHODS = {"distill-lora": OPTIONS, "kv-prefix": OPTIONS + ["prefix_tokens=4", "init=document"], "keep-prompt": []}


def question(row) -> str:
    return f"Q: {row['question']}\nA:"  # the task's doc_to_text


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random 2-layer Llama with a byte-level BPE tokenizer trained on the document and the questions."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("llama")
    sentences = [DOCUMENT.read_text()] + [f"{question(r)} {c}" for r in ROWS for c in r["choices"]]
    tokenizer = tiny_bpe_tokenizer(sentences, 320, CHAT_TEMPLATE)
    tokenizer.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.3,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(llama, tmp_path_factory):
    """method -> its absorb folder of the document (`incontext absorb`, the default placement: the system turn)."""
    made = {}
    for method, options in METHODS.items():
        out = tmp_path_factory.mktemp("absorbed") / method
        argv = ["absorb", "--model", str(llama), "--method", method, "--prompt-file", str(DOCUMENT), "--out", str(out)]
        assert cli.main(argv + [x for option in options for x in ("--set", option)]) == 0
        assert json.loads((out / "absorb.json").read_text())["placement"] == "system"
        made[method] = out
    return made


@pytest.fixture(autouse=True)
def _generators_kept():
    """simple_evaluate seeds random, numpy and torch; the tests after these find the generators as they left them."""
    import random

    import numpy

    states = random.getstate(), numpy.random.get_state(), torch.random.get_rng_state()
    yield
    random.setstate(states[0])
    numpy.random.set_state(states[1])
    torch.random.set_rng_state(states[2])


@pytest.fixture(scope="module")
def tasks():
    return TaskManager(include_path=str(TASKS), include_defaults=False)  # not lm-eval's ~13,000 shipped task files


def evaluate(tasks, model, model_args, task="incontext_facts_tiny", **options):
    """lm-eval's simple_evaluate on one local task: (its results, its samples in document order)."""
    out = simple_evaluate(model=model, model_args=model_args, tasks=[task], task_manager=tasks, log_samples=True,
                          device="cpu", batch_size=1, **options)
    return out["results"][task], sorted(out["samples"][task], key=lambda s: s["doc_id"])


def logged_loglikelihoods(samples) -> list[float]:
    """The log-likelihood lm-eval logged for every choice of every question, in order."""
    return [resp[0][0] for sample in samples for resp in sample["resps"]]


def by_hand(logits_of, tokenizer, context_of=question, delimiter=" ") -> list[list[float]]:
    """log p(delimiter + choice | context) of every choice of every question, from `logits_of(ids)` ((1, T, V)
    logits of ids), with lm-eval's split of a request into tokens (the whole text encoded, the context's tokens
    first, the context's trailing whitespace scored with the continuation)."""
    scores = []
    for row in ROWS:
        context = context_of(row)
        row_scores = []
        for choice in row["choices"]:
            context_ids = tokenizer.encode(context.rstrip(), add_special_tokens=False)
            ids = tokenizer.encode(context + delimiter + choice, add_special_tokens=False)
            with torch.no_grad():
                logits = logits_of(ids)[0, len(context_ids) - 1:-1].double()
            target = torch.tensor(ids[len(context_ids):])
            row_scores.append(float(torch.log_softmax(logits, -1).gather(-1, target[:, None]).sum()))
        scores.append(row_scores)
    return scores


def flat(scores: list[list[float]]) -> list[float]:
    return [x for row in scores for x in row]


def accuracy(scores) -> float:
    return sum(max(range(len(s)), key=s.__getitem__) == row["answer"] for s, row in zip(scores, ROWS)) / len(ROWS)


def peft_model(llama, folder):
    """transformers' Llama with the absorb folder's PEFT adapter (PeftModel.from_pretrained), and the adapter's
    query position (absorb.json)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama), folder / "peft_adapter").eval()
    return model, json.loads((folder / "absorb.json").read_text())["peft_adapter"]["query_position"]


def test_hf_model_with_peft_scores_a_distill_lora_folder(llama, folders, tasks):
    from transformers import AutoTokenizer

    folder = folders["distill-lora"]
    results, samples = evaluate(tasks, "hf", f"pretrained={llama},peft={folder / 'peft_adapter'}")
    model, _ = peft_model(llama, folder)
    hand = by_hand(lambda ids: model(torch.tensor([ids])).logits, AutoTokenizer.from_pretrained(llama))
    assert logged_loglikelihoods(samples) == pytest.approx(flat(hand), abs=1e-4)
    assert results["acc,none"] == pytest.approx(accuracy(hand))
    _, base_samples = evaluate(tasks, "hf", f"pretrained={llama}")
    base, adapted = logged_loglikelihoods(base_samples), logged_loglikelihoods(samples)
    assert max(abs(a - b) for a, b in zip(adapted, base)) > 1e-2  # the adapter was applied


@pytest.mark.parametrize("method", sorted(METHODS))
def test_incontext_model_scores_any_absorb_folder(method, llama, folders, tasks):
    folder = folders[method]
    loaded = load_model(str(llama))
    tokenizer = loaded.tokenizer.tokenizer
    if method == "distill-lora":  # transformers' own model with the adapter, queries after the document's positions
        model, offset = peft_model(llama, folder)
        def logits_of(ids):
            return model(torch.tensor([ids]), position_ids=torch.arange(offset, offset + len(ids))[None]).logits

        hand = by_hand(logits_of, tokenizer)
    elif method == "keep-prompt":  # the base reading the placed document (its system turn), then the question
        from incontext.tasks.placement import placed_document

        document = loaded.tokenizer.encode(placed_document(loaded.tokenizer, DOCUMENT.read_text(), "system"))
        hand = by_hand(lambda ids: loaded.model(torch.tensor([document + ids]))[:, len(document):], tokenizer)
    else:  # the K/V prefix on the base: the adapted model as `incontext generate --adapted` runs it
        adapted = AdaptedModel.load(folder, base=loaded.model).eval()
        hand = by_hand(lambda ids: adapted(torch.tensor([ids])), tokenizer)
    results, samples = evaluate(tasks, "incontext", f"absorbed={folder}")
    assert logged_loglikelihoods(samples) == pytest.approx(flat(hand), abs=1e-4)
    assert results["acc,none"] == pytest.approx(accuracy(hand))
    base = by_hand(lambda ids: loaded.model(torch.tensor([ids])), tokenizer)
    assert max(abs(a - b) for a, b in zip(flat(hand), flat(base))) > 1e-2  # the document was absorbed
    if method == "kv-prefix":  # the base alone through the same model
        _, base_samples = evaluate(tasks, "incontext", f"model={llama}")
        assert logged_loglikelihoods(base_samples) == pytest.approx(flat(base), abs=1e-4)


def test_chat_template_puts_the_question_after_the_absorbed_system_turn(llama, folders, tasks):
    """--apply_chat_template on a keep-prompt folder: the question follows the document's system turn as the user's
    turn, the answer the assistant's (lm-eval puts no delimiter before a choice there), and the scores are the
    prompted model's on the whole conversation as the template renders it."""
    loaded = load_model(str(llama))
    tokenizer = loaded.tokenizer.tokenizer

    def conversation(row):
        return tokenizer.apply_chat_template([{"role": "system", "content": DOCUMENT.read_text()},
                                              {"role": "user", "content": question(row)}],
                                             tokenize=False, add_generation_prompt=True)

    results, samples = evaluate(tasks, "incontext", f"absorbed={folders['keep-prompt']}", apply_chat_template=True)
    requests = [[tuple(request) for request in sample["arguments"]] for sample in samples]  # (context, continuation)
    assert requests == [[(f"{question(row)}<|im_end|>\n<|im_start|>assistant\n", c) for c in row["choices"]] for row in ROWS]
    hand = by_hand(lambda ids: loaded.model(torch.tensor([ids])), tokenizer, context_of=conversation, delimiter="")
    assert logged_loglikelihoods(samples) == pytest.approx(flat(hand), abs=1e-4)
    assert results["acc,none"] == pytest.approx(accuracy(hand))


def test_incontext_model_generates_as_the_adapted_model(llama, folders, tasks):
    folder = folders["kv-prefix"]
    loaded = load_model(str(llama))
    adapted = AdaptedModel.load(folder, base=loaded.model).eval()
    codec, expected = loaded.tokenizer, []
    for row in ROWS:  # greedy, re-reading the whole sequence, until a line break or EOS, at most 16 tokens
        ids = codec.encode(question(row))
        produced = []
        with torch.no_grad():
            for _ in range(16):
                token = int(adapted(torch.tensor([ids + produced]))[0, -1].argmax())
                if token == codec.eos_token_id:
                    break
                produced.append(token)
                if "\n" in codec.decode(produced):
                    break
        expected.append(codec.decode(produced).split("\n")[0])
    results, samples = evaluate(tasks, "incontext", f"absorbed={folder}", task="incontext_facts_tiny_gen")
    assert [s["resps"][0][0] for s in samples] == expected
    gold = [row["choices"][row["answer"]] for row in ROWS]
    assert results["exact_match,none"] == pytest.approx(sum(e.strip() == g for e, g in zip(expected, gold)) / len(ROWS))
    assert results["contains,none"] == pytest.approx(sum(g.lower() in e.lower() for e, g in zip(expected, gold)) / len(ROWS))


def test_incontext_model_rolling_loglikelihood_and_its_errors(llama, folders):
    folder = folders["kv-prefix"]
    lm = IncontextLM(absorbed=str(folder))
    text = DOCUMENT.read_text()
    ids = lm.tok_encode(text)
    adapted = AdaptedModel.load(folder, base=load_model(str(llama)).model).eval()
    with torch.no_grad():  # every token of the text after the BOS prefix, in one window (it fits the model's room)
        logits = adapted(torch.tensor([[lm.prefix_token_id] + ids[:-1]]))[0].double()
    hand = float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).sum())
    request = Instance(request_type="loglikelihood_rolling", doc={}, arguments=(text,), idx=0)
    assert lm.loglikelihood_rolling([request])[0] == pytest.approx(hand, abs=1e-6)
    assert len(ids) < lm.max_length == 256 - 4  # the context less the 4 prefix tokens
    with pytest.raises(ValueError, match="unknown to the incontext model"):
        IncontextLM(absorbed=str(folder), pretrained="x")
    with pytest.raises(ValueError, match="give model_args absorbed=DIR"):
        IncontextLM()
    with pytest.raises(ValueError, match="no absorb.json"):  # (a ModelArgsError: main prints it as one line)
        IncontextLM(absorbed=str(llama))
    with pytest.raises(ValueError, match="cannot follow it"):  # the document is the system turn already
        lm.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])


def test_the_documented_command_line(folders, tasks, tmp_path, monkeypatch, capsys):
    """lm-eval's command line with the incontext model registered (`python -m incontext.cli.lm_eval ...`, run here
    in this process: its main), as the docs give it, from the repository root; its results file holds the score
    simple_evaluate gives."""
    import lm_eval.tasks

    from incontext.cli import lm_eval as cli_lm_eval

    folder = folders["distill-lora"]
    monkeypatch.chdir(ROOT)
    # the command line indexes lm-eval's ~13,000 shipped task files first (seconds): here only the local ones
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(TaskManager, include_defaults=False))
    monkeypatch.setattr(sys, "argv", ["python -m incontext.cli.lm_eval"])
    cli_lm_eval.main(["--model", "incontext", "--model_args", f"absorbed={folder}", "--include_path", "tests/data/lm_eval",
                      "--tasks", "incontext_facts_tiny", "--device", "cpu", "--output_path", str(tmp_path / "results")])
    printed = capsys.readouterr().out
    assert "incontext_facts_tiny" in printed and "acc" in printed
    [written] = list((tmp_path / "results").rglob("results_*.json"))
    acc = json.loads(written.read_text())["results"]["incontext_facts_tiny"]["acc,none"]
    expected, _ = evaluate(tasks, "incontext", f"absorbed={folder}")
    assert acc == pytest.approx(expected["acc,none"])


def test_a_system_instruction_after_a_system_turn_document_is_one_line(folders):
    """--system_instruction with --apply_chat_template on a document absorbed as the system turn: lm-eval's command
    line, run as a user runs it (its own process), ends in one line and exit status 2, not a traceback."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "incontext.cli.lm_eval", "--model", "incontext", "--model_args",
                           f"absorbed={folders['keep-prompt']}", "--include_path", "tests/data/lm_eval", "--tasks",
                           "incontext_facts_tiny", "--device", "cpu", "--apply_chat_template", "--system_instruction",
                           "Answer briefly."], cwd=ROOT, capture_output=True, text=True, timeout=600)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and err[-1].startswith("incontext: error: --apply_chat_template: the absorbed document")
    assert "Traceback" not in done.stderr


def test_a_folder_that_leaves_no_room_is_refused_when_the_model_is_made(folders, monkeypatch):
    """An absorbed document that leaves one token of the context (absorb accepts it; generate refuses each question):
    the incontext model refuses at once in one line, before lm-eval sends a request."""
    from incontext.cli import lm_eval as cli_lm_eval

    monkeypatch.setattr(cli_lm_eval, "context_room", lambda runner, n: 1 - n)
    with pytest.raises(cli_lm_eval.ModelArgsError, match=r"leaves 1 token\(s\) of the model's context") as error:
        cli_lm_eval.IncontextLM(absorbed=folders["keep-prompt"], device="cpu")
    assert "\n" not in str(error.value)
