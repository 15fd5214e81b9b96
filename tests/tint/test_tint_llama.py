"""TinT on Llama-architecture auxiliary models (RMSNorm, SwiGLU, RoPE, no biases, grouped K/V heads), built
from tiny random transformers LlamaForCausalLM models in float64: the simulator equals R-approx (SGD with
TinT's gradient rules, K/V heads shared within a group as in the model) on logits and read-back weights."""

import pytest
import torch
from conftest import rel_error
from transformers import LlamaConfig, LlamaForCausalLM

from incontext.interop.tint_hf import tint_from_hf
from incontext.tint import TinT, TintConfig, sgd_reference
from incontext.interop.tint_hf import auxiliary_from_hf

VOCAB = 50


def hf_llama(seed: int, **options) -> LlamaForCausalLM:
    settings = dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
                    bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**settings, **options})).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # float64 weights (not float32-representable), gains near 1
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            p.copy_(1.0 + 0.2 * noise if "norm" in name else 0.15 * noise)
    return model


CASES = [  # (seed, Llama options, TinT options)
    (0, {}, {}),  # 4 query heads sharing 2 K/V heads; MLP width 40 (not a multiple of 24: zero-padded)
    (1, {"num_key_value_heads": 1, "num_hidden_layers": 3}, {"n_simulation_layers": 2, "n_steps": 2}),
    (2, {"num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 48, "attention_bias": True,
         "mlp_bias": True, "rope_theta": 500.0}, {}),
]


@pytest.mark.parametrize("seed,options,tint_options", CASES)
def test_tint_on_llama_matches_r_approx(seed, options, tint_options):
    hf = hf_llama(seed, **options)
    aux = auxiliary_from_hf(hf)
    assert aux.config.kv_heads == hf.config.num_key_value_heads
    ids = torch.randint(0, VOCAB, (12,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # transformers keeps RoPE and RMSNorm statistics in float32
        assert rel_error(aux(ids[None])[0], hf(ids[None]).logits[0]) < 1e-6
    config = TintConfig(learning_rate=0.05, rows_per_prefix=4, shards=4, **tint_options)
    sim = tint_from_hf(hf, config)
    logits, banks, losses = sim.simulate(ids, 8)
    ref_logits, ref_state, ref_losses = sgd_reference(aux, ids, 8, config, rules="approx")
    assert rel_error(logits, ref_logits) < 1e-7
    read = sim.read_weights(banks)
    assert set(read) <= set(ref_state)
    for name, value in read.items():
        assert value.shape == ref_state[name].shape, name
        assert rel_error(value, ref_state[name]) < 1e-7, name
    assert torch.allclose(torch.stack(losses), torch.stack(ref_losses), rtol=1e-10)
    original = aux.state_dict()
    moved = [n for n, v in read.items() if not torch.equal(v, original[n])]
    assert any(".attn.qkv." in n for n in moved) and any(".mlp.fc_in." in n for n in moved)
    with torch.no_grad():
        assert rel_error(sim.updated_model(aux, banks)(ids[None])[0], logits) < 1e-10


def test_grouped_value_heads_take_one_step_of_the_summed_gradient():
    """The K/V rows read back keep the grouped shape and W_K stays frozen; only W_V moves."""
    hf = hf_llama(3)
    aux = auxiliary_from_hf(hf)
    sim = TinT(aux, TintConfig(learning_rate=0.05, rows_per_prefix=4, shards=4))
    ids = torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(3))
    _, banks, _ = sim.simulate(ids, 10)
    qkv, before = sim.read_weights(banks)["blocks.1.attn.qkv.weight"], aux.blocks[1].attn.qkv.weight
    q_rows, kv_rows = 24, 2 * 6
    assert qkv.shape == before.shape == (q_rows + 2 * kv_rows, 24)
    assert torch.equal(qkv[: q_rows + kv_rows], before[: q_rows + kv_rows])
    assert not torch.equal(qkv[q_rows + kv_rows :], before[q_rows + kv_rows :])


def test_untied_llama_is_refused():
    with pytest.raises(ValueError, match="tied embeddings"):
        tint_from_hf(hf_llama(0, tie_word_embeddings=False), TintConfig(rows_per_prefix=4, shards=4))
