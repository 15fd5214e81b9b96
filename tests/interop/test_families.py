"""Every family of the families table, as a tiny random model built from its transformers config and saved as a
Hugging Face folder (no download): the Hugging Face backend's cache, the exact conversion where the family
converts, and the commands (`compare`, `absorb`, `generate`) end to end, with the distilled adapter loaded by
peft on the family's own transformers class."""

import json

import pytest
import torch
from conftest import randomize64, tiny_bpe_tokenizer, without_float32_steps

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from incontext.cli import commands as cli  # noqa: E402
from incontext.interop.hf import CONVERSIONS, wrap_hf  # noqa: E402
from incontext.interop.models import load_model  # noqa: E402
from incontext.models.families import FAMILIES  # noqa: E402
from incontext.models.hf_backend import HFCausalLM  # noqa: E402
from incontext.models.lm import copy_cache  # noqa: E402

SENTENCES = ["Ada Lovelace was born in London.", "Q: Where was Ada born?\nA: London", "Alan Turing works as a "
             "mathematician and has a pet cat named Mat.", "What is the name of the pet? Born in the year 1815."]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPT = "Ada Lovelace was born in London.\nAlan Turing has a pet cat named Mat.\n"
QUESTION = "Q: Where was Ada born?\nA:"


def tokenizer():
    return tiny_bpe_tokenizer(SENTENCES, 300, CHAT_TEMPLATE)


def config(model_type: str, vocab: int, ids: dict):
    """A tiny config of the family: 2 layers, width 32, grouped-query attention where the family has it, a
    sliding window shorter than the test sequences where it has one (so the window is exercised)."""
    T = transformers
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, **ids)
    return {
        "llama": lambda: T.LlamaConfig(**common),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: T.Qwen2Config(**common),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=8),
        "gemma2": lambda: T.Gemma2Config(**common, head_dim=8, sliding_window=24),
        "gemma3_text": lambda: T.Gemma3TextConfig(**common, head_dim=8, sliding_window=24),
        "phi3": lambda: T.Phi3Config(**{**common, "pad_token_id": ids["eos_token_id"]}),
        "gpt2": lambda: T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=1024, **ids),
    }[model_type]()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tok = tokenizer()
    tok.save_pretrained(folder)
    ids = {"eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    torch.manual_seed(0)
    # a vocabulary a little larger than the tokenizer, as real checkpoints pad theirs: a family's own tokenizer class
    # (Qwen2's adds <|endoftext|>) may hold a token more than the one saved
    model = transformers.AutoModelForCausalLM.from_config(config(request.param, len(tok) + 8, ids))
    with torch.no_grad():  # larger weights than the default init: logits that differ between inputs
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return request.param, str(folder)


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_table_names_every_family_of_the_issue():
    assert set(FAMILIES) == {"llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "gpt2"}
    assert all(len(f.lora) == 4 for f in FAMILIES.values())  # each family names a module for every LoRA role


def test_the_families_that_convert_are_the_ones_interop_converts():
    """The architecture table (models/families.py) says which families convert; interop/hf.py holds the conversions."""
    assert {name for name, f in FAMILIES.items() if f.converts} == set(CONVERSIONS)


def test_a_backend_without_its_conversion_says_how_to_get_it():
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64)).eval()
    with pytest.raises(ValueError, match="given no conversion.*wrap_hf"):
        HFCausalLM(hf).as_transformer()
    assert wrap_hf(hf).as_transformer().config.n_layer == 1


def test_the_backend_cache_continues_exactly(family_folder):
    """prefill + query == the whole sequence at once, float64, also past a sliding window; the prompt's state is
    not changed by a query that continues it."""
    model_type, folder = family_folder
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    lm = HFCausalLM(randomize64(hf, 1)).eval()
    ids = torch.randint(0, lm.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = lm(ids)
        cache = lm.prefill(ids[:, :30])
        first = lm(ids[:, 30:], cache=copy_cache(cache))
        again = lm(ids[:, 30:], cache=copy_cache(cache))
        step = copy_cache(cache)
        pieces = [lm(ids[:, t : t + 1], cache=step) for t in range(30, 40)]  # token by token
        offset = lm(ids[:, :5], position_offset=7)
        shifted = lm(torch.cat([ids[:, :7], ids[:, :5]], 1))
    assert (first - full[:, 30:]).abs().max() < 1e-10 and torch.equal(first, again)
    assert (torch.cat(pieces, 1) - full[:, 30:]).abs().max() < 1e-10
    if model_type != "gpt2":  # RoPE: positions shift the keys of a prompt-free query exactly like a real prefix would
        assert offset.shape == (1, 5, lm.config.vocab_size) and (offset - shifted[:, 7:]).abs().max() > 0


def test_converted_families_match_transformers_logits(family_folder):
    model_type, folder = family_folder
    ids = torch.randint(0, 300, (2, 33), generator=torch.Generator().manual_seed(3))
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    lm = wrap_hf(hf32)
    if not FAMILIES.get(model_type).converts:
        with pytest.raises(ValueError, match="does not convert"):
            lm.as_transformer()
        return
    ours = lm.as_transformer()
    with torch.no_grad():
        reference = hf32(ids).logits
        assert (ours(ids) - reference).abs().max() <= 1e-5 * max(1.0, float(reference.abs().max()))
    hf64 = randomize64(transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64), 4).eval()
    ours64 = wrap_hf(hf64).as_transformer()
    if ours64.config.positions == "rope":
        without_float32_steps(hf64, ours64.config.rope_theta, ours64.config.dim_head)
    with torch.no_grad():
        assert (ours64(ids) - hf64(ids).logits).abs().max() <= 1e-10


def test_compare_runs_every_method_and_says_why_not(family_folder, tmp_path, capsys):
    model_type, folder = family_folder
    out = tmp_path / "compare"
    code, _, err = run(capsys, "compare", "--model", folder, "--task", "facts", "--episodes", "1", "--set", "people=1",
                       "--methods", "keep-prompt,drop-prompt,dynamic-eval,distill-lora,iclca-approx,iclca,tint",
                       "--set", "distill-lora.steps=2", "--set", "distill-lora.study.n_continuations=1",
                       "--set", "distill-lora.progress=false", "--out", str(out))
    assert code == 0, err
    results = json.loads((out / "results.json").read_text())
    rows = {row["method"]: row for row in results["rows"]}
    assert results["backend"] == "hf"
    for name in ("keep-prompt", "drop-prompt", "dynamic-eval", "distill-lora"):
        assert rows[name]["status"] == "ok", (name, rows[name])
    assert rows["keep-prompt"]["agreement"]["kl"] < 1e-9  # the reference against itself
    assert rows["iclca"]["status"] == "n/a"  # softmax attention does not convert exactly
    if FAMILIES.get(model_type).converts:
        assert rows["iclca-approx"]["status"] == "ok", rows["iclca-approx"]
    else:
        assert rows["iclca-approx"]["status"] == "n/a" and "does not convert" in rows["iclca-approx"]["reason"]
        assert "does not convert" in rows["tint"]["reason"]


def test_absorb_generate_and_the_adapter_in_peft(family_folder, tmp_path, capsys):
    """distill-lora's adapter loads with PeftModel.from_pretrained on the family's own class and gives the
    logits of the adapted model that `generate --adapted` runs."""
    from peft import PeftModel

    from incontext.absorb.folder import load_adapted

    model_type, folder = family_folder
    out = tmp_path / "lora"
    code, _, err = run(capsys, "absorb", "--model", folder, "--method", "distill-lora", "--prompt", PROMPT,
                       "--set", "steps=3", "--set", "learning_rate=0.05", "--set", "study.n_continuations=1",
                       "--set", "progress=false", "--out", str(out))
    assert code == 0, err
    record = json.loads((out / "absorb.json").read_text())
    assert record["peft_adapter"]["written"] and record["peft_adapter"]["family"] == model_type
    loaded = load_model(folder)
    adapted = load_adapted(out, loaded.model, folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    theirs_model = PeftModel.from_pretrained(hf, out / "peft_adapter").eval()
    assert type(theirs_model.base_model.model).__name__ == type(loaded.model.hf).__name__
    query = torch.tensor([loaded.tokenizer.encode(QUESTION)])
    offset = record["peft_adapter"]["query_position"]
    with torch.no_grad():
        ours = adapted(query)
        theirs = theirs_model(query, position_ids=torch.arange(offset, offset + query.shape[1])[None]).logits
        base = loaded.model(query, position_offset=offset)
    assert (ours - theirs).abs().max() <= 1e-4 * max(1.0, float(theirs.abs().max()))
    assert (ours - base).abs().max() > 1e-4  # the adapter changed the model
    code, printed, err = run(capsys, "generate", "--model", folder, "--adapted", str(out), "--max-new-tokens", "5", QUESTION)
    assert code == 0 and printed.strip() != "", err
    code, _, err = run(capsys, "absorb", "--model", folder, "--method", "keep-prompt", "--prompt", PROMPT,
                       "--out", str(tmp_path / "keep"))
    assert code == 0, err
    code, printed, err = run(capsys, "generate", "--model", folder, "--adapted", str(tmp_path / "keep"),
                             "--max-new-tokens", "5", QUESTION)
    assert code == 0, err


def test_a_model_that_reads_bos_first_gets_it_before_every_sequence(family_folder):
    """Gemma (and Llama 3) need their BOS: the backend puts it at position 0 before the prompt, or before a
    prompt-free query whose positions go on from the absorbed prompt's; the caller sees only its tokens' logits."""
    model_type, folder = family_folder
    if model_type != "gemma3_text":
        pytest.skip("one family is enough")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    lm = HFCausalLM(randomize64(hf, 7)).read_bos_first(1).eval()
    ids = torch.randint(2, lm.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(8))
    with_bos = torch.cat([torch.ones(1, 1, dtype=torch.long), ids], 1)
    with torch.no_grad():
        assert (lm(ids) - hf(with_bos).logits[:, 1:]).abs().max() < 1e-10
        cache = lm.prefill(ids[:, :20])
        assert cache.position == 20 and (lm(ids[:, 20:], cache=copy_cache(cache)) - lm(ids)[:, 20:]).abs().max() < 1e-10
        shifted = lm(ids[:, :5], position_offset=20)
        positions = torch.tensor([[0] + list(range(21, 26))])
        mask = torch.ones(1, 6, dtype=torch.long)  # without it transformers reads the jump 0 -> 21 as two sequences
        reference = hf(with_bos[:, :6], position_ids=positions, attention_mask=mask).logits[:, 1:]
        assert (shifted - reference).abs().max() < 1e-10
    assert lm.config.max_seq_len == hf.config.max_position_embeddings - 1
