"""A distilled LoRA exported as a PEFT adapter: transformers' own LlamaForCausalLM / GPT2LMHeadModel with the adapter
loaded by `PeftModel.from_pretrained` gives the logits of our adapted model."""

import json

import pytest
import torch

pytest.importorskip("peft")
from peft import PeftModel  # noqa: E402

from conftest import rel_error  # noqa: E402
from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.methods.distill_lora.export import load_peft_adapter, save_peft_adapter  # noqa: E402
from incontext.interop import to_hf_gpt2, to_hf_llama  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402

ALL = ("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")


def tiny(dtype, **options):
    torch.manual_seed(0)
    config = dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=48, vocab_size=64, positions="rope", norm="rmsnorm",
                  mlp="swiglu", bias=False, max_seq_len=64, init_std=0.1)
    return Transformer(TransformerConfig(**{**config, **options})).to(dtype).eval()


def absorbed(model, targets, seed=3):
    """A distilled adapter with large random factors (training would leave them small), unmerged and merged."""
    prompt = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(1))
    adapted = get_absorb_method("distill-lora", steps=2, study=dict(n_continuations=1, continuation_tokens=4), merge=False,
                                target_modules=targets, rank=4, alpha=12.0, progress=False).absorb(model, prompt)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for a, b in adapted.lora_factors().values():
            a.copy_(torch.randn(a.shape, generator=g, dtype=torch.float64) * 0.3)
            b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float64) * 0.3)
    return adapted, adapted.merged_model()


@pytest.mark.parametrize("targets", [("attn.qkv", "attn.out"), ALL])
# float64: transformers computes Llama's RoPE angles in float32, so even the base models differ by ~1e-7; the merged
# weights are compared exactly instead (and GPT-2 below, without RoPE, is compared to 1e-12)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-6)])
def test_llama_adapter_loads_in_peft_with_the_same_logits(tmp_path, targets, dtype, tol):
    model = tiny(dtype, bias="attn.qkv" in targets and len(targets) == 4)  # with biases too, once
    unmerged, merged = absorbed(model, targets)
    hf_base = to_hf_llama(model)
    folder = save_peft_adapter(merged, hf_base, tmp_path / "adapter")
    assert not any("lora" in name for name in hf_base.state_dict())  # handed back without the adapter
    config = json.loads((folder / "adapter_config.json").read_text())
    expected_parts = {"attn.qkv": ["q_proj", "k_proj", "v_proj"], "attn.out": ["o_proj"],
                      "mlp.fc_in": ["gate_proj", "up_proj"], "mlp.fc_out": ["down_proj"]}
    assert sorted(m.rsplit(".", 1)[1] for m in config["target_modules"]) == sorted(
        p for t in targets for p in expected_parts[t] for _ in range(2))
    assert config["r"] == 4 and config["lora_alpha"] == 12.0
    with_adapter = PeftModel.from_pretrained(to_hf_llama(model), folder).eval()
    query = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(20, 29).expand(2, 9)  # the adapted model reads queries after the prompt
    with torch.no_grad():
        theirs = with_adapter(query, position_ids=positions).logits
        assert rel_error(theirs, merged(query)) < tol
        assert rel_error(theirs, unmerged(query)) < tol
        assert rel_error(theirs, model(query, position_offset=20)) > 1e-2
    theirs_merged = with_adapter.merge_and_unload().state_dict()
    ours_merged = to_hf_llama(merged.base).state_dict()
    assert theirs_merged.keys() == ours_merged.keys()
    weight_tol = 1e-6 if dtype == torch.float32 else 1e-14
    for name, value in ours_merged.items():
        assert (theirs_merged[name] - value).abs().max() <= weight_tol * value.abs().max(), name


def test_gpt2_adapter_loads_in_peft_with_the_same_logits(tmp_path):
    model = tiny(torch.float64, positions="learned", norm="layernorm", mlp="gelu_tanh", bias=True, n_kv_head=None)
    unmerged, merged = absorbed(model, ALL)
    folder = save_peft_adapter(unmerged, to_hf_gpt2(model), tmp_path / "adapter")
    with_adapter = PeftModel.from_pretrained(to_hf_gpt2(model), folder).eval()
    query = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = with_adapter(query, position_ids=torch.arange(20, 29).expand(2, 9)).logits
        assert rel_error(theirs, merged(query)) < 1e-12
        merged_hf = with_adapter.merge_and_unload()
        assert rel_error(merged_hf(query, position_ids=torch.arange(20, 29).expand(2, 9)).logits, merged(query)) < 1e-12


# ----------------------------------------------------------------------------- and back: load_peft_adapter


@pytest.mark.parametrize("family, targets", [("llama", ("attn.qkv", "attn.out")), ("llama", ALL), ("gpt2", ALL)])
def test_a_saved_adapter_loads_back_as_the_merged_model(tmp_path, family, targets):
    options = {} if family == "llama" else dict(positions="learned", norm="layernorm", mlp="gelu_tanh", bias=True,
                                                 n_kv_head=None)
    model = tiny(torch.float32, **options)
    unmerged, merged = absorbed(model, targets)
    export = to_hf_llama if family == "llama" else to_hf_gpt2
    folder = save_peft_adapter(unmerged, export(model), tmp_path / "adapter")
    loaded = load_peft_adapter(folder, model, offset=20)
    assert loaded.spec == merged.spec and loaded.offset == 20 and loaded.merged
    query = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ours, reference = loaded(query), merged(query)
        assert (ours - reference).abs().max() < 1e-5 * reference.abs().max()
        # and transformers + peft reading the same folder
        theirs = PeftModel.from_pretrained(export(model), folder).eval()(
            query, position_ids=torch.arange(20, 29).expand(2, 9)).logits
        assert (ours - theirs).abs().max() < 1e-5 * theirs.abs().max()
        assert rel_error(ours, model(query, position_offset=20)) > 1e-2  # the adapter is not a no-op
    for name, (a, b) in merged.lora_factors().items():  # the factors come back too (a reload can be exported again)
        assert torch.equal(loaded.lora_factors()[name][0], a) and torch.equal(loaded.lora_factors()[name][1], b)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), tiny(torch.float32, **options).parameters()))


def test_a_bad_or_foreign_adapter_is_refused_with_its_reason(tmp_path):
    model = tiny(torch.float32)
    unmerged, _ = absorbed(model, ("attn.qkv", "attn.out"))
    folder = save_peft_adapter(unmerged, to_hf_llama(model), tmp_path / "adapter")
    wider = tiny(torch.float32, d_model=48)  # same layout, other sizes: another base model
    with pytest.raises(ValueError, match="made for another base model"):
        load_peft_adapter(folder, wider, offset=20)
    deeper_adapter = save_peft_adapter(absorbed(tiny(torch.float32, n_layer=3), ("attn.qkv",))[0],
                                       to_hf_llama(tiny(torch.float32, n_layer=3)), tmp_path / "deeper")
    with pytest.raises(ValueError, match="made for another base model"):
        load_peft_adapter(deeper_adapter, model, offset=20)
    gpt2 = tiny(torch.float32, positions="learned", norm="layernorm", mlp="gelu_tanh", bias=True, n_kv_head=None)
    with pytest.raises(ValueError, match="made for another base model"):  # a Llama adapter on a GPT-2-style model
        load_peft_adapter(folder, gpt2, offset=20)
    weights = folder / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="adapter_model.safetensors is corrupt"):
        load_peft_adapter(folder, model, offset=20)
    weights.unlink()
    with pytest.raises(ValueError, match="adapter_model.safetensors is missing"):
        load_peft_adapter(folder, model, offset=20)
    (folder / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json is corrupt"):
        load_peft_adapter(folder, model, offset=20)
