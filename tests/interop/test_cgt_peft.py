"""Export of a folded CGT: a Hugging Face GPT-2 checkpoint, and the context as a PEFT LoRA adapter."""

import torch
from peft import PeftModel
from transformers import GPT2LMHeadModel

from conftest import rel_error
from incontext.absorb.methods.cgt_fold import fold
from incontext.absorb.methods.cgt_fold.export import save_base_gpt2, save_folded_gpt2, save_lora_adapter
from incontext.models.cgt import CGT, CGTConfig


def trained_looking_cgt() -> CGT:
    torch.manual_seed(0)
    model = CGT(CGTConfig(n_layer=3, split_layer=1, d_x=16, n_head_x=2, d_y=8, n_head_y=2, rank=3, n_templates=4,
                          vocab_size=16, max_seq_len=32))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".left", ".right")):
                p.normal_(0.0, 0.3)
    return model.eval()


def test_folded_model_exports_to_gpt2_with_the_same_logits(tmp_path):
    model = trained_looking_cgt()
    y = model.context(torch.randint(0, 16, (1, 10)))[0, -1]
    query = torch.randint(0, 16, (2, 12))
    save_folded_gpt2(model, y, tmp_path / "gpt2")
    hf = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    with torch.no_grad():
        assert rel_error(hf(query).logits, model(query, y=y[None])) < 1e-5


def test_lora_adapter_merges_into_the_folded_weights(tmp_path):
    model = trained_looking_cgt()
    y = model.context(torch.randint(0, 16, (1, 10)))[0, -1]
    save_base_gpt2(model, tmp_path / "base")
    save_lora_adapter(model, y, tmp_path / "adapter")
    base = GPT2LMHeadModel.from_pretrained(tmp_path / "base").eval()
    with_adapter = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    query = torch.randint(0, 16, (2, 12))
    with torch.no_grad():
        expected = model(query, y=y[None])
        assert rel_error(with_adapter(query).logits, expected) < 1e-5  # unmerged: base + B A x + bias
        merged = with_adapter.merge_and_unload()
        assert rel_error(merged(query).logits, expected) < 1e-5
    folded_hf = GPT2LMHeadModel.from_pretrained(save_folded_gpt2(model, y, tmp_path / "folded")).state_dict()
    merged_sd = merged.state_dict()
    unadapted = GPT2LMHeadModel.from_pretrained(tmp_path / "base").state_dict()  # merge changed `base` in place
    changed = set()
    for name, value in folded_hf.items():
        assert torch.allclose(merged_sd[name], value, rtol=0, atol=1e-6), name
        if not torch.equal(value, unadapted[name]):
            changed.add(name.rsplit(".", 1)[0])
    assert changed == {f"transformer.h.{i}.{m}" for i in (1, 2) for m in ("attn.c_attn", "mlp.c_fc")}
    assert fold(model, y).config.n_layer == 3
