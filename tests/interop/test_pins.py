"""The pinned transformers / peft (pyproject.toml) as a user runs them, with no workaround of ours: a PEFT CARTRIDGE
loaded with `PeftModel.from_pretrained` serves its prefix through plain `generate` (transformers >= 5.24 silently
drops it: this test fails on such an upgrade), and the shipped SmolLM2's kv-prefix folder, on the base that
`incontext export-model` writes, generates exactly what `incontext generate --adapted` prints."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from peft import PeftModel  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from incontext.cli import commands as cli  # noqa: E402
from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.decode import stream_tokens  # noqa: E402
from incontext.absorb.methods.kv_prefix.export import save_cartridge  # noqa: E402
from incontext.interop.hf import wrap_hf  # noqa: E402


def run(capsys, *argv) -> str:
    capsys.readouterr()
    assert cli.main(list(argv)) == 0
    return capsys.readouterr().out


def test_peft_generate_serves_a_cartridge_as_a_user_writes_it(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    hf.save_pretrained(tmp_path / "base")
    lm = wrap_hf(hf).eval()
    document = torch.randint(2, 96, (16,), generator=torch.Generator().manual_seed(1))
    prefix = get_absorb_method("kv-prefix", prefix_tokens=6, steps=0, passes=0, progress=False).absorb(lm, document)
    with torch.no_grad():  # moved off the document's own K/V: a prefix the base alone could not imitate
        for _, buffer in prefix.named_buffers(recurse=False):
            buffer.add_(0.5 * buffer.std() * torch.randn(buffer.shape, generator=torch.Generator().manual_seed(2)))
    save_cartridge(prefix, tmp_path / "cartridge")
    query = torch.randint(2, 96, (1, 5), generator=torch.Generator().manual_seed(3))

    # the user's code, as peft's docs write it
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    model = PeftModel.from_pretrained(base, tmp_path / "cartridge")
    out = model.generate(input_ids=query, attention_mask=torch.ones_like(query), max_new_tokens=8, do_sample=False)

    served = out[0, query.shape[1]:].tolist()
    assert served == list(stream_tokens(prefix, query[0].tolist(), 8))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "base").generate(
        input_ids=query, attention_mask=torch.ones_like(query), max_new_tokens=8, do_sample=False)
    assert served != plain[0, query.shape[1]:].tolist()  # the prefix is served, not ignored


def test_the_shipped_models_kv_prefix_folder_works_in_peft_as_a_user_writes_it(tmp_path, capsys):
    pytest.importorskip("gguf")
    document = "Noor Abadzhieva lives in Reykjavik. She works as a translator and keeps a cat named Pip."
    question = "Where does Noor Abadzhieva live?"
    run(capsys, "absorb", "--model", "smollm2", "--method", "kv-prefix", "--prompt", document, "--out",
        str(tmp_path / "folder"), *[x for o in ("steps=2", "passes=0", "study.derived=0", "study.n_continuations=0",
                                               "progress=false", "init=document") for x in ("--set", o)])
    record = json.loads((tmp_path / "folder" / "absorb.json").read_text())
    assert record["peft_adapter"]["written"] and record["peft_adapter"]["family"] == "llama", record.get("peft_adapter")
    run(capsys, "export-model", "--model", "smollm2", "--out", str(tmp_path / "base"))
    printed = run(capsys, "generate", "--model", "smollm2", "--adapted", str(tmp_path / "folder"), "--chat",
                  "--max-new-tokens", "12", question)

    # the user's code: the exported base, the folder's adapter, the question as the turn after the system turn
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "base")
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    model = PeftModel.from_pretrained(base, tmp_path / "folder" / "peft_adapter")
    turn = tokenizer.apply_chat_template([{"role": "system", "content": "D"}, {"role": "user", "content": question}],
                                         tokenize=False, add_generation_prompt=True)
    # absorb placed the document as the system turn up to the user's text (absorb.json: placement system)
    assert record["placement"] == "system"
    opening = "D<|im_end|>\n<|im_start|>user\n"
    turn = turn[turn.index(opening) + len(opening):]
    ids = tokenizer(turn, add_special_tokens=False, return_tensors="pt").input_ids
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    tokens = out[0, ids.shape[1]:].tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    answer = tokenizer.decode(tokens[: tokens.index(end)] if end in tokens else tokens)
    assert printed.strip() == answer.strip()


@pytest.mark.slow
def test_the_second_shipped_models_kv_prefix_folder_works_in_peft_as_a_user_writes_it(tmp_path, capsys):
    """The same for Gemma-3-270M (a base model on the Hugging Face backend: the document raw, the query after it;
    its CARTRIDGE holds the BOS the model reads first, so the user's query goes without one, as absorb.json says).
    Slow: the model loads from its GGUF parts and export-model writes its ~1 GB of float32 weights."""
    pytest.importorskip("gguf")
    document = "Noor Abadzhieva lives in Reykjavik. She works as a translator and keeps a cat named Pip."
    question = "\nQ: Where does Noor Abadzhieva live?\nA:"
    run(capsys, "absorb", "--model", "gemma3-270m", "--method", "kv-prefix", "--prompt", document, "--out",
        str(tmp_path / "folder"), *[x for o in ("steps=2", "passes=0", "heldout=0", "study.derived=0",
                                               "study.n_continuations=0", "progress=false") for x in ("--set", o)])
    record = json.loads((tmp_path / "folder" / "absorb.json").read_text())
    assert record["peft_adapter"]["written"], record.get("peft_adapter")
    assert "give the query without it" in record["peft_adapter"]["load"]
    run(capsys, "export-model", "--model", "gemma3-270m", "--out", str(tmp_path / "base"))
    printed = run(capsys, "generate", "--model", "gemma3-270m", "--adapted", str(tmp_path / "folder"),
                  "--max-new-tokens", "8", question)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "base")
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                      tmp_path / "folder" / "peft_adapter")
    ids = tokenizer(question, add_special_tokens=False, return_tensors="pt").input_ids
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert printed.strip() == tokenizer.decode(out[0, ids.shape[1]:]).strip()
