"""TinT built from Hugging Face GPT-2 and OPT (random weights): the auxiliary model matches the HF logits and
the simulator matches R-approx on it."""

import pytest
import torch
from conftest import rel_error
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

from incontext.tint import TintConfig, sgd_reference
from incontext.interop.tint_hf import auxiliary_from_hf, from_hf_opt, tint_from_hf


def hf_models():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=12, n_layer=2, n_head=2, n_positions=32,
                                      activation_function="gelu")).double().eval()
    opt = OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=12, num_hidden_layers=2, ffn_dim=48, num_attention_heads=2,
                                   max_position_embeddings=32, word_embed_proj_dim=12)).double().eval()
    for model in (gpt2, opt):
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name or "ln" in name or name.endswith("bias"):
                    p.add_(0.2 * torch.randn_like(p))
    return {"gpt2": gpt2, "opt": opt}


@pytest.mark.parametrize("kind", ["gpt2", "opt"])
def test_tint_from_hf(kind):
    hf = hf_models()[kind]
    ids = torch.randint(0, 50, (10,), generator=torch.Generator().manual_seed(1))
    aux = auxiliary_from_hf(hf)
    with torch.no_grad():
        assert rel_error(aux(ids[None]), hf(ids[None]).logits) < 1e-6  # HF keeps some float32 steps
    config = TintConfig(learning_rate=0.05)
    logits, _, _ = tint_from_hf(hf, config).simulate(ids, 6)
    ref_logits, _, _ = sgd_reference(aux, ids, 6, config)
    assert rel_error(logits, ref_logits) < 1e-7


def test_opt_projection_rejected():
    config = OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, ffn_dim=32, num_attention_heads=2,
                       max_position_embeddings=32, word_embed_proj_dim=8)
    with pytest.raises(ValueError, match="word_embed_proj_dim"):
        from_hf_opt(OPTForCausalLM(config))


def test_opt_float64_import_is_exact():
    """float64 weights with nonzero low bits survive the import (no float32 model on the way)."""
    torch.manual_seed(1)
    hf = OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=12, num_hidden_layers=2, ffn_dim=48, num_attention_heads=2,
                                  max_position_embeddings=32, word_embed_proj_dim=12)).double().eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    ours = from_hf_opt(hf)
    ids = torch.randint(0, 50, (2, 12), generator=g)
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max() < 1e-12
    assert ours.tok_emb.weight.dtype == torch.float64
    assert torch.equal(ours.blocks[0].mlp.fc_in.weight, hf.model.decoder.layers[0].fc1.weight)
