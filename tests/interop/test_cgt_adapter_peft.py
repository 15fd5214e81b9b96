"""A CGT adapter's folded context exported onto transformers' LlamaForCausalLM: as a PEFT LoRA adapter (loaded with
PeftModel.from_pretrained, lora_bias carrying the shift) and as a plain Llama with biases; both give the logits of the
adapter run with that frozen context."""

import warnings

import pytest
import torch
from cgt_adapter_helpers import random_adapter, random_base, tokens
from peft import PeftModel
from test_hf import without_float32_steps

from incontext.absorb.methods.cgt_fold import prompt_context
from incontext.absorb.methods.cgt_fold.export import llama_adapter_factors, save_folded_llama, save_llama_adapter
from incontext.interop.hf import to_hf_llama


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # peft: "lora_bias on a layer without bias: merging is not possible" (expected)
        warnings.simplefilter("ignore")
        yield


def adapter_and_context(seed, dtype):
    base = random_base(seed, dtype=dtype, n_layer=4)
    adapter = random_adapter(base, seed, split_layer=1, n_y_blocks=1, rank=3, n_templates=4)
    y = prompt_context(adapter, tokens(seed, 1, 10))
    return adapter, y, tokens(seed + 7, 2, 12)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
@pytest.mark.parametrize("seed", [0, 1])
def test_peft_adapter_on_hf_llama_equals_the_frozen_context_adapter(tmp_path, dtype, tolerance, seed):
    adapter, y, query = adapter_and_context(seed, dtype)
    if dtype == torch.float64:
        assert all(not torch.equal(p, p.float().to(dtype)) for p in adapter.base.parameters())
    save_llama_adapter(adapter, y, tmp_path / "adapter")
    hf_base = to_hf_llama(adapter.base).eval()
    assert not hf_base.config.attention_bias  # the base stays bias-free; the shift is the LoRA's bias
    with_adapter = PeftModel.from_pretrained(hf_base, tmp_path / "adapter").eval()
    c = adapter.base.config
    if dtype == torch.float64:  # transformers' RoPE and RMSNorm statistics run in float32 otherwise
        without_float32_steps(with_adapter.base_model.model, c.rope_theta, c.dim_head)
    with torch.no_grad():
        expected = adapter(query, y=y[None])
        got = with_adapter(query).logits
        unadapted = to_hf_llama(adapter.base)(query).logits
    assert (got - expected).abs().max() < tolerance
    assert (unadapted - expected).abs().max() > 100 * tolerance  # the adapter matters at this tolerance


def test_folded_llama_with_biases_equals_the_adapter(tmp_path):
    from transformers import LlamaForCausalLM

    adapter, y, query = adapter_and_context(2, torch.float64)
    hf = LlamaForCausalLM.from_pretrained(save_folded_llama(adapter, y, tmp_path / "folded"), dtype=torch.float64).eval()
    assert hf.config.attention_bias and hf.config.mlp_bias
    without_float32_steps(hf, adapter.base.config.rope_theta, adapter.base.config.dim_head)
    with torch.no_grad():
        assert (hf(query).logits - adapter(query, y=y[None])).abs().max() < 1e-10


def test_adapter_factors_cover_q_k_v_gate_up_of_the_guided_layers():
    adapter, y, _ = adapter_and_context(3, torch.float32)
    factors = llama_adapter_factors(adapter, y)
    parts = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
    assert set(factors) == {f"model.layers.{i}.{p}" for i in (1, 2, 3) for p in parts}
    b, a, bias = factors["model.layers.1.self_attn.k_proj"]
    c = adapter.base.config
    assert b.shape == (c.kv_heads * c.dim_head, 3) and a.shape == (3, c.d_model) and bias.shape == (c.kv_heads * c.dim_head,)


@pytest.mark.slow
def test_smollm2_adapter_exports_to_peft_with_the_same_logits(tmp_path):
    from incontext.interop.models import load_model

    base = load_model("smollm2").model
    adapter = random_adapter(base, 0, split_layer=26, n_y_blocks=2, d_y=16, n_head_y=2, rank=4, n_templates=4)
    with torch.no_grad():
        for generator in [*adapter.guide.t_attn, *adapter.guide.t_mlp]:
            generator.left.mul_(0.1)  # updates of a realistic size (the random ones above swamp the base)
    prompt, query = torch.randint(0, 49152, (1, 20)), torch.randint(0, 49152, (1, 16))
    y = prompt_context(adapter, prompt)
    save_llama_adapter(adapter, y, tmp_path / "adapter")
    with_adapter = PeftModel.from_pretrained(to_hf_llama(base).eval(), tmp_path / "adapter").eval()
    with torch.no_grad():
        expected = adapter(query, y=y[None])
        assert (with_adapter(query).logits - expected).abs().max() < 1e-4 * expected.abs().max()
        assert (base(query) - expected).abs().max() > 1e-2 * expected.abs().max()
