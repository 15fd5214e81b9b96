"""kv-prefix's prefix as a PEFT CARTRIDGE adapter (absorb/methods/kv_prefix/export.py), on a tiny random model of every family of
the families table: written by peft, loaded by `PeftModel.from_pretrained` on a fresh copy of the transformers model,
it gives the logits and the greedy tokens of our path (TrainedPrefix, stream_tokens; `incontext generate --adapted`),
also past a sliding window and on a model that reads its BOS first; peft's compose_cartridge_adapters on two folders
equals compose_prefixes; read back, it is the same TrainedPrefix."""

import copy
import inspect
import json

import pytest
import torch
from conftest import tiny_bpe_tokenizer

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
if not hasattr(peft, "CartridgeConfig"):
    pytest.skip("this peft has no CARTRIDGE adapters", allow_module_level=True)

from peft import PeftModel  # noqa: E402
from peft.tuners.cartridge.utils import compose_cartridge_adapters  # noqa: E402

from incontext.cli import commands as cli  # noqa: E402
from incontext.absorb import AdaptedModel, get_absorb_method  # noqa: E402
from incontext.absorb.decode import stream_tokens  # noqa: E402
from incontext.absorb.methods.kv_prefix import TrainedPrefix, compose_prefixes  # noqa: E402
from incontext.absorb.methods.kv_prefix.export import (
    cartridge_kv, load_cartridge, save_cartridge,
)  # noqa: E402
from incontext.models.families import FAMILIES  # noqa: E402
from incontext.models.hf_backend import HFCausalLM, HFLayerState  # noqa: E402
from incontext.models import Cache  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning", "ignore:.*is_gradient_checkpointing.*:FutureWarning")

VOCAB, WINDOW = 60, 24
READS_BOS = {"gemma2", "gemma3_text"}  # Gemma's tokenizer starts every text with BOS: the backend reads it first
PEFT_FILES = ["README.md", "adapter_config.json", "adapter_model.safetensors"]


def family_config(model_type: str, vocab: int = VOCAB, ids: dict | None = None):
    """2 layers, width 32, grouped-query attention where the family has it, a sliding window of 24 where it has one."""
    T = transformers
    ids = ids or {"eos_token_id": 1, "bos_token_id": 0}
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, **ids)
    return {
        "llama": lambda: T.LlamaConfig(**common),
        "mistral": lambda: T.MistralConfig(**common, sliding_window=WINDOW),
        "qwen2": lambda: T.Qwen2Config(**common),
        "qwen3": lambda: T.Qwen3Config(**common, head_dim=8),
        "gemma2": lambda: T.Gemma2Config(**common, head_dim=8, sliding_window=WINDOW),
        "gemma3_text": lambda: T.Gemma3TextConfig(**common, head_dim=8, sliding_window=WINDOW),
        "phi3": lambda: T.Phi3Config(**{**common, "pad_token_id": ids["eos_token_id"]}),
        "gpt2": lambda: T.GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=1024, **ids),
    }[model_type]()


def tiny(model_type: str, dtype=torch.float32):
    """(HFCausalLM, an untouched copy of its transformers model for peft); Gemma reads its BOS (id 0) first."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(family_config(model_type)).to(dtype).eval()
    with torch.no_grad():  # larger weights than the default init: logits that differ between inputs
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    fresh = copy.deepcopy(hf)
    lm = HFCausalLM(hf).eval()
    return (lm.read_bos_first(0) if model_type in READS_BOS else lm), fresh


def ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def perturbed_prefix(lm, p: int, m: int, seed: int) -> TrainedPrefix:
    """The document's first p tokens' K/V (kv-prefix, steps=0), then moved off it: not trivially the document."""
    adapted = get_absorb_method("kv-prefix", prefix_tokens=p, steps=0, passes=0, progress=False).absorb(lm, ids(m, seed))
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for _, buffer in adapted.named_buffers(recurse=False):
            buffer.add_(0.2 * buffer.std() * torch.randn(buffer.shape, generator=g, dtype=buffer.dtype))
    return adapted


def from_peft(fresh, folder, dtype=torch.float32):
    """PeftModel.from_pretrained on a copy of the untouched transformers model (its prompt encoder in the model's
    dtype: peft makes it in the default dtype)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return PeftModel.from_pretrained(copy.deepcopy(fresh), str(folder)).eval()
    finally:
        torch.set_default_dtype(default)


def peft_forward_greedy(peft_model, query: list[int], n: int) -> list[int]:
    """Greedy tokens through PeftModel's own forward (the cartridge as past_key_values, queries' positions from
    num_virtual_tokens, n ones before the attention mask), re-run on the growing sequence."""
    sequence = list(query)
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([sequence])
            sequence.append(int(peft_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0, -1].argmax()))
    return sequence[len(query):]


def transformers_generate(peft_model, query: list[int], n: int) -> list[int]:
    """Greedy tokens from transformers' generate on the PeftModel's base model with the prefix peft serves
    (get_prompt) as its cache: num_virtual_tokens placeholder ids before the query (generate feeds only the tokens
    after the cache), so the query's positions start at num_virtual_tokens."""
    hf = peft_model.get_base_model()
    virtual = peft_model.peft_config[peft_model.active_adapter].num_virtual_tokens
    x = torch.cat([torch.zeros(1, virtual, dtype=torch.long), torch.tensor([query])], 1)
    name = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"  # transformers >= 5.24
    out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False, eos_token_id=None,
                      pad_token_id=0, **{name: peft_model.get_prompt(1)})
    return out[0, x.shape[1]:].tolist()


def close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return float((a - b).abs().max()) <= tolerance * max(1.0, float(b.abs().max()))


@pytest.fixture(params=list(FAMILIES))
def family(request):
    return request.param


@pytest.mark.parametrize("p", [8, 30])  # 30: past the sliding window of Gemma and Mistral (their layers keep 23)
def test_the_cartridge_peft_loads_answers_as_our_prefix(family, p, tmp_path):
    lm, fresh = tiny(family)
    adapted = perturbed_prefix(lm, p, 40, seed=1)
    folder = tmp_path / "cartridge"
    assert save_cartridge(adapted, folder)["num_virtual_tokens"] == p + int(family in READS_BOS)
    assert sorted(f.name for f in folder.iterdir()) == PEFT_FILES
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["peft_type"] == "CARTRIDGE"
    bos = int(family in READS_BOS)
    assert config["peft_type"] == "CARTRIDGE" and config["num_virtual_tokens"] == p + bos and config["num_frozen_tokens"] == 1
    theirs = from_peft(fresh, folder)
    query = ids(12, seed=2).tolist()
    x = torch.tensor([query])
    with torch.no_grad():
        ours = adapted(x)
        logits = theirs(input_ids=x, attention_mask=torch.ones_like(x)).logits
        plain = lm(x, position_offset=p)
    assert close(ours, logits, 1e-5), float((ours - logits).abs().max())
    assert not close(ours, plain, 1e-2)  # the prefix matters
    mine = list(stream_tokens(adapted, query, 6))
    assert peft_forward_greedy(theirs, query, 6) == mine
    assert transformers_generate(theirs, query, 6) == mine
    back = load_cartridge(folder, lm)  # and read back: the same prefix, at the same position
    assert back.position == adapted.position and back.base is lm
    with torch.no_grad():
        assert torch.equal(back(x), ours)


@pytest.mark.parametrize("model_type, dtype, tolerance", [("llama", torch.float64, 1e-12), ("gemma3_text", torch.float64, 1e-12)])
def test_float64_round_trip_and_composition(model_type, dtype, tolerance, tmp_path):
    lm, fresh = tiny(model_type, dtype)
    first, second = perturbed_prefix(lm, 5, 9, seed=3), perturbed_prefix(lm, 7, 11, seed=4)
    save_cartridge(first, tmp_path / "a")
    save_cartridge(second, tmp_path / "b")
    compose_cartridge_adapters([tmp_path / "a", tmp_path / "b"], output_path=tmp_path / "ab")
    x = ids(10, seed=5)[None]
    with torch.no_grad():
        for ours, folder in ((first, "a"), (compose_prefixes(first, second), "ab")):
            theirs = from_peft(fresh, tmp_path / folder, dtype)
            logits = theirs(input_ids=x, attention_mask=torch.ones_like(x)).logits
            assert theirs.prompt_encoder["default"].weight.dtype == logits.dtype == dtype
            assert close(ours(x), logits, tolerance), folder


def test_peft_composition_equals_ours(family, tmp_path):
    """compose_cartridge_adapters on two folders (the prompt embeddings concatenated) == compose_prefixes of the two
    prefixes, in logits and greedy tokens, in either order; read back, the composed folder is our composition."""
    lm, fresh = tiny(family)
    first, second = perturbed_prefix(lm, 5, 9, seed=6), perturbed_prefix(lm, 7, 11, seed=7)
    save_cartridge(first, tmp_path / "a")
    save_cartridge(second, tmp_path / "b")
    query = ids(10, seed=8).tolist()
    x = torch.tensor([query])
    for order, (one, two) in (("ab", (first, second)), ("ba", (second, first))):
        compose_cartridge_adapters([tmp_path / order[0], tmp_path / order[1]], output_path=tmp_path / order)
        composed = compose_prefixes(one, two)
        theirs = from_peft(fresh, tmp_path / order)
        assert theirs.peft_config["default"].num_virtual_tokens == composed.position + int(family in READS_BOS)
        with torch.no_grad():
            ours = composed(x)
            assert close(ours, theirs(input_ids=x, attention_mask=torch.ones_like(x)).logits, 1e-5), order
            assert torch.equal(load_cartridge(tmp_path / order, lm)(x), ours)
            assert not close(ours, one(x), 1e-2)  # the second document's prefix matters
        mine = list(stream_tokens(composed, query, 6))
        assert transformers_generate(theirs, query, 6) == mine and peft_forward_greedy(theirs, query, 6) == mine


@pytest.mark.xfail("cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters, strict=True,
                   reason="peft 0.21's generate injects a prompt-learning prefix as past_key_values, which transformers "
                          ">= 5.24 ignores beside generate's own `cache` (the tokens come without the prefix)")
def test_peft_generate_itself_serves_the_cartridge(tmp_path):
    lm, fresh = tiny("llama")
    adapted = perturbed_prefix(lm, 8, 12, seed=1)
    save_cartridge(adapted, tmp_path / "c")
    theirs = from_peft(fresh, tmp_path / "c")
    query = ids(6, seed=2).tolist()
    x = torch.tensor([query])
    out = theirs.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=6, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert out[0, len(query):].tolist() == list(stream_tokens(adapted, query, 6))


def test_what_a_cartridge_cannot_hold_is_a_one_line_error(tmp_path):
    from incontext.models import Transformer, TransformerConfig

    ours = Transformer(TransformerConfig(n_layer=2, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=64)).eval()
    prefix = get_absorb_method("kv-prefix", prefix_tokens=4, steps=0, passes=0, progress=False).absorb(ours, ids(8, 1))
    info = save_cartridge(prefix, tmp_path / "ours")  # our GPT-style Transformer: written for its GPT-2 twin
    assert info["family"] == "gpt2" and (tmp_path / "ours" / "adapter_model.safetensors").is_file()
    linear = Transformer(TransformerConfig(n_layer=2, n_head=2, d_model=16, vocab_size=VOCAB, max_seq_len=64,
                                           positions="rope", norm="rmsnorm", mlp="swiglu", scale_attn=False)).eval()
    unfit = get_absorb_method("kv-prefix", prefix_tokens=4, steps=0, passes=0, progress=False).absorb(linear, ids(8, 1))
    with pytest.raises(ValueError, match="has no transformers form") as error:  # exports to no family
        save_cartridge(unfit, tmp_path / "unfit")
    assert len(str(error.value).splitlines()) == 1 and not (tmp_path / "unfit").exists()
    lm, _ = tiny("llama")
    k = torch.randn(1, 2, 4, 8)
    mixed = TrainedPrefix(lm, Cache(layers=[HFLayerState(k, k, 4), HFLayerState(k[:, :1], k[:, :1], 4)], position=4))
    with pytest.raises(ValueError, match="model_type llama: its layers hold K/V of different shapes"):
        cartridge_kv(mixed)
    save_cartridge(perturbed_prefix(lm, 4, 8, seed=1), tmp_path / "llama")
    other, _ = tiny("gpt2")  # 4 K/V heads of 8 where llama's cartridge holds 2
    with pytest.raises(ValueError, match="was made for another base model"):
        load_cartridge(tmp_path / "llama", other)
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    with pytest.raises(ValueError, match="not a CARTRIDGE adapter|adapter_config.json is corrupt"):
        load_cartridge(tmp_path / "lora", lm)


def test_saving_leaves_the_model_as_it_was(tmp_path):
    lm, _ = tiny("llama")
    adapted = perturbed_prefix(lm, 4, 8, seed=1)
    lm.hf.model.layers[0].mlp.up_proj.weight.requires_grad_(False)
    flags = [p.requires_grad for p in lm.hf.parameters()]
    before = {name: t.clone() for name, t in lm.hf.state_dict().items()}
    save_cartridge(adapted, tmp_path / "c")
    assert [p.requires_grad for p in lm.hf.parameters()] == flags
    assert all(torch.equal(before[name], t) for name, t in lm.hf.state_dict().items())


# ----------------------------------------------------------------------------- the absorb folder


SENTENCES = ["Ada Lovelace was born in London.", "Q: Where was Ada born?\nA: London", "Alan Turing works as a "
             "mathematician and has a pet cat named Mat.", "What is the name of the pet? Born in the year 1815."]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PROMPTS = ["Ada Lovelace was born in London.\nAlan Turing has a pet cat named Mat.\n",
           "Alan Turing works as a mathematician.\n"]
QUESTION = "Q: Where was Ada born?\nA:"
OPTIONS = ["steps=2", "learning_rate=0.05", "study.n_continuations=1", "study.continuation_tokens=4", "progress=false",
           "init=document"]  # the cartridge's tests: the start a CARTRIDGE holds (the default, auto, presses where it can)


@pytest.fixture(scope="module", params=["llama", "gemma3_text"])
def model_folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    tok = tiny_bpe_tokenizer(SENTENCES, 300, CHAT_TEMPLATE)
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        family_config(request.param, len(tok) + 8, {"eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return str(folder)


def run(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_absorb_writes_the_cartridge_beside_the_prefix_and_generate_agrees_with_peft(model_folder, tmp_path, capsys):
    """`incontext absorb --method kv-prefix` on a Hugging Face model (trained a few steps) writes adapted.safetensors
    + adapted.json and, in peft_adapter/, the same prefix as a CARTRIDGE; `incontext generate --adapted` (one folder,
    or two composed) prints what transformers' generate gives from PeftModel.from_pretrained on the folder (two:
    composed by peft); a folder left with the cartridge alone still loads, from it."""
    from incontext.absorb.folder import composed_folders, load_adapted
    from incontext.interop.models import load_model

    folders = [tmp_path / "first", tmp_path / "second"]
    for out, prompt, p in zip(folders, PROMPTS, (4, 3)):
        printed = run(capsys, "absorb", "--model", model_folder, "--method", "kv-prefix", "--prompt", prompt,
                      "--placement", "raw", "--out", str(out), *[x for o in OPTIONS + [f"prefix_tokens={p}"] for x in ("--set", o)])
        assert "no PEFT adapter" not in printed
        record = json.loads((out / "absorb.json").read_text())
        note = record["peft_adapter"]
        assert note["written"] and note["peft_type"] == "CARTRIDGE" and note["query_position"] == p
        assert sorted(record["files"]) == sorted([".incontext-experiment", "absorb.json", "adapted.json", "adapted.safetensors"]
                                                 + [f"peft_adapter/{name}" for name in PEFT_FILES])
        assert sorted(record["files"]) == sorted(str(f.relative_to(out)) for f in out.rglob("*") if f.is_file())
    loaded = load_model(model_folder)
    codec, eos = loaded.tokenizer, loaded.tokenizer.eos_token_id
    query = codec.encode(QUESTION)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(model_folder).eval()

    def cut(tokens):
        return tokens[: tokens.index(eos)] if eos in tokens else tokens

    compose_cartridge_adapters([f / "peft_adapter" for f in folders], output_path=tmp_path / "composed")
    for given, cartridge in (([folders[0]], folders[0] / "peft_adapter"), (folders, tmp_path / "composed")):
        printed = run(capsys, "generate", "--model", model_folder, *[x for f in given for x in ("--adapted", str(f))],
                      "--max-new-tokens", "8", QUESTION)
        theirs = cut(transformers_generate(from_peft(fresh, cartridge), query, 8))
        assert printed == codec.decode(theirs) + "\n"
        ours = composed_folders(given, loaded.model, model_folder)
        assert cut(list(stream_tokens(ours, query, 8))) == theirs
    # the cartridge alone: generate reads it (absorb.json's sha256 checked), and it is the saved prefix
    saved = AdaptedModel.load(folders[0], base=loaded.model)
    for name in ("adapted.safetensors", "adapted.json"):
        (folders[0] / name).unlink()
    alone = load_adapted(folders[0], loaded.model, model_folder)
    x = torch.tensor([query])
    with torch.no_grad():
        assert isinstance(alone, TrainedPrefix) and torch.equal(alone(x), saved(x))
    weights = folders[0] / "peft_adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + bytes(8))
    code = cli.main(["generate", "--model", model_folder, "--adapted", str(folders[0]), QUESTION])
    err = capsys.readouterr().err
    assert code == 2 and "adapter_model.safetensors is corrupt" in err and len(err.strip().splitlines()) == 1


def test_absorb_says_why_when_peft_cannot_write_the_cartridge(model_folder, tmp_path, capsys, monkeypatch):
    """A model peft's CARTRIDGE cannot serve: absorb.json and the absorb's output say why in one line, the prefix is
    saved as ours and generate reads it."""
    import incontext.absorb.methods.kv_prefix.export as cartridge

    if "llama" not in model_folder:
        pytest.skip("one family is enough")

    def refuse(adapted, folder, num_frozen_tokens=1):
        raise ValueError("model_type llama: its layers hold K/V of different shapes")

    monkeypatch.setattr(cartridge, "save_cartridge", refuse)
    out = tmp_path / "mine"
    printed = run(capsys, "absorb", "--model", model_folder, "--method", "kv-prefix", "--prompt", PROMPTS[0], "--out",
                  str(out), *[x for o in OPTIONS + ["prefix_tokens=3", "steps=1"] for x in ("--set", o)])
    assert "no PEFT adapter: model_type llama: its layers hold K/V of different shapes" in printed
    record = json.loads((out / "absorb.json").read_text())
    assert record["peft_adapter"]["written"] is False and not (out / "peft_adapter").exists()
    assert run(capsys, "generate", "--model", model_folder, "--adapted", str(out), "--max-new-tokens", "3", QUESTION)


@pytest.mark.parametrize("init, extra", [("document", []), ("press", ["press=knorm", "ratio=0.3"]),
                                         ("press", ["press=kvzip", "ratio=0.3"]),
                                         ("press", ["press=knorm", "ratio=0.3", "steps=0"])])
def test_every_init_writes_a_cartridge_peft_serves_as_generate_or_none(model_folder, init, extra, tmp_path, capsys):
    """For every kv-prefix init on the Hugging Face backend (press-rerotated runs on our Transformer alone): the plain peft path (PeftModel.from_pretrained on peft_adapter/, transformers' generate)
    gives `incontext generate --adapted`'s tokens, or the folder holds no peft_adapter/ and absorb.json says why (a
    press start keeps pairs of the whole document at their own positions, or a different count per head: a CARTRIDGE
    attends to every pair it holds, its queries right after them)."""
    if "llama" not in model_folder:
        pytest.skip("one family is enough")
    out = tmp_path / init
    options = [o for o in OPTIONS if not (o.startswith("steps=") and any(e.startswith("steps=") for e in extra))
               and not o.startswith("init=")]
    printed = run(capsys, "absorb", "--model", model_folder, "--method", "kv-prefix", "--prompt", PROMPTS[0], "--placement",
                  "raw", "--out", str(out), *[x for o in options + [f"init={init}", *extra] for x in ("--set", o)])
    note = json.loads((out / "absorb.json").read_text())["peft_adapter"]
    if not note["written"]:
        assert init == "press" and not (out / "peft_adapter").exists()
        assert "no layout for it" in note["reason"] and "no PEFT adapter" in printed
        return
    from incontext.interop.models import load_model

    codec = load_model(model_folder).tokenizer
    query = codec.encode(QUESTION)
    fresh = transformers.AutoModelForCausalLM.from_pretrained(model_folder).eval()
    theirs = transformers_generate(from_peft(fresh, out / "peft_adapter"), query, 6)
    eos = codec.eos_token_id
    theirs = theirs[: theirs.index(eos)] if eos in theirs else theirs
    printed = run(capsys, "generate", "--model", model_folder, "--adapted", str(out), "--max-new-tokens", "6", QUESTION)
    assert printed == codec.decode(theirs) + "\n"


def test_the_default_start_presses_where_kvzip_runs_and_falls_back_to_the_document_where_it_cannot(model_folder, tmp_path, capsys):
    """init=auto (the default): on Llama, with the tokenizer KVzip writes its prompt with, the prefix starts from
    KVzip's kept pairs at the document's positions (no CARTRIDGE layout: absorb.json says why); kvpress refuses KVzip
    on Gemma 3, so there the start is the document's first p tokens and the folder holds the cartridge. Either way the
    start taken is in the record's history, and generate reads the folder."""
    out = tmp_path / "auto"
    options = [o for o in OPTIONS if not o.startswith("init=")] + ["ratio=0.3"]
    printed = run(capsys, "absorb", "--model", model_folder, "--method", "kv-prefix", "--prompt", PROMPTS[0], "--placement",
                  "raw", "--out", str(out), *[x for o in options for x in ("--set", o)])
    record = json.loads((out / "absorb.json").read_text())
    init = record["history"]["init"]
    assert init == ("press" if "llama" in model_folder else "document"), init
    assert record["peft_adapter"]["written"] is (init == "document")
    assert ("no PEFT adapter" in printed) is (init == "press")
    assert run(capsys, "generate", "--model", model_folder, "--adapted", str(out), "--max-new-tokens", "3", QUESTION)
