import os

import pytest
import torch
from conftest import randomize64, without_float32_steps

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

from incontext.interop import from_hf_gpt2, from_hf_llama, to_hf_gpt2, to_hf_llama  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402

TOL = 1e-5  # float32, absolute on logits of order 1


def tokens(vocab, seed=0, shape=(3, 29)):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def randomize(model, seed):
    """Non-trivial weights everywhere (HF initialises LayerNorm to 1/0 and biases to 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


GPT2_CONFIGS = [
    dict(n_embd=64, n_layer=2, n_head=4),
    dict(n_embd=48, n_layer=3, n_head=3, n_inner=80, activation_function="relu", layer_norm_epsilon=1e-6),
    dict(n_embd=32, n_layer=1, n_head=2, activation_function="gelu", scale_attn_weights=False, tie_word_embeddings=False),
]


@pytest.mark.parametrize("options", GPT2_CONFIGS)
def test_gpt2_import_and_export_match_logits(options):
    torch.manual_seed(0)
    hf = randomize(GPT2LMHeadModel(GPT2Config(vocab_size=101, n_positions=64, bos_token_id=0, eos_token_id=0, **options)), 1).eval()
    ours = from_hf_gpt2(hf).eval()
    x = tokens(101)
    with torch.no_grad():
        reference = hf(x).logits
        assert (ours(x) - reference).abs().max() < TOL
        back = to_hf_gpt2(ours).eval()
        assert (back(x).logits - reference).abs().max() < TOL


def test_gpt2_export_of_our_own_model():
    torch.manual_seed(1)
    ours = Transformer(TransformerConfig(vocab_size=50, d_model=32, n_head=4, n_layer=2, max_seq_len=40, mlp="gelu_tanh")).eval()
    x = tokens(50, 1)
    with torch.no_grad():
        assert (to_hf_gpt2(ours).eval()(x).logits - ours(x)).abs().max() < TOL


LLAMA_CONFIGS = [
    dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
         tie_word_embeddings=True, rope_theta=100000.0, attention_bias=True, mlp_bias=True),
    dict(hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, head_dim=16),
]


@pytest.mark.parametrize("options", LLAMA_CONFIGS)
def test_llama_import_and_export_match_logits(options):
    torch.manual_seed(0)
    options = {"tie_word_embeddings": False, **options}
    hf = randomize(LlamaForCausalLM(LlamaConfig(vocab_size=97, max_position_embeddings=128, **options)), 2).eval()
    ours = from_hf_llama(hf).eval()
    assert ours.config.kv_heads == options["num_key_value_heads"]
    x = tokens(97, 2)
    with torch.no_grad():
        reference = hf(x).logits
        assert (ours(x) - reference).abs().max() < TOL
        back = to_hf_llama(ours).eval()
        assert (back(x).logits - reference).abs().max() < TOL


def test_llama_export_of_our_own_model():
    torch.manual_seed(2)
    ours = Transformer(TransformerConfig(vocab_size=50, d_model=48, n_head=4, n_kv_head=2, n_layer=2, positions="rope",
                                         norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)).eval()
    x = tokens(50, 4)
    with torch.no_grad():
        assert (to_hf_llama(ours).eval()(x).logits - ours(x)).abs().max() < TOL


def test_llama_greedy_generation_matches():
    torch.manual_seed(3)
    hf = randomize(LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                                bos_token_id=None, eos_token_id=None, pad_token_id=None)), 3).eval()
    ours = from_hf_llama(hf).eval()
    prompt = tokens(61, 3, (2, 7))
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert theirs.shape == (2, 19)
    assert torch.equal(ours.generate(prompt, 12), theirs)


@pytest.mark.parametrize(
    "options, message",
    [({"positions": "rope"}, "positions='learned'"), ({"attention": "linear"}, "attention='softmax'"),
     ({"residual_stream": "v"}, "residual_stream='none'"), ({"mlp": "swiglu"}, "mlp in")],
)
def test_gpt2_export_refuses_what_gpt2_cannot_express(options, message):
    model = Transformer(TransformerConfig(vocab_size=10, d_model=16, n_head=2, n_layer=1, **options))
    with pytest.raises(ValueError, match=message):
        to_hf_gpt2(model)


def test_llama_export_refuses_learned_positions():
    model = Transformer(TransformerConfig(vocab_size=10, d_model=16, n_head=2, n_layer=1))
    with pytest.raises(ValueError, match="positions='rope'"):
        to_hf_llama(model)


# ----------------------------------------------------------------------------- real pretrained weights

TEXT = (
    "The quick brown fox jumps over the lazy dog. Paris is the capital of France, and Berlin is the capital "
    "of Germany. Water boils at one hundred degrees Celsius at sea level."
)


@pytest.fixture(scope="module")
def smollm2():
    from incontext.interop import load_smollm2

    try:
        hf, tokenizer = load_smollm2()
    except FileNotFoundError as error:
        if os.environ.get("CI"):
            raise  # CI installs the package: its absence is a failure there
        pytest.skip(str(error))
    return hf, tokenizer, from_hf_llama(hf).eval()


def test_smollm2_real_weights_reproduce_transformers_logits(smollm2):
    hf, tokenizer, ours = smollm2
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        reference, mine = hf(ids).logits, ours(ids)
    max_abs = float((mine - reference).abs().max())
    relative = float((mine - reference).norm() / reference.norm())
    print(f"\nSmolLM2-135M on {ids.shape[1]} tokens: max |logit diff| = {max_abs:.3e}, relative = {relative:.3e}")
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())
    assert relative < 1e-4 and max_abs < 1e-3


def test_smollm2_greedy_generation_matches(smollm2):
    hf, tokenizer, ours = smollm2
    ids = tokenizer("The capital of France is Paris. The capital of Italy is", return_tensors="pt").input_ids
    theirs = hf.generate(ids, max_new_tokens=16, do_sample=False)
    mine = ours.generate(ids, 16, eos_token_id=hf.generation_config.eos_token_id)
    print(f"\ngreedy continuation: {tokenizer.decode(mine[0, ids.shape[1]:])!r}")
    assert torch.equal(mine, theirs), (tokenizer.decode(mine[0]), tokenizer.decode(theirs[0]))


# ----------------------------------------------------------------------------- float64: no rounding on the way


def assert_bit_exact(a: dict, b: dict):
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == torch.float64, name
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("options", GPT2_CONFIGS)
def test_gpt2_float64_import_is_exact_and_round_trip_bit_exact(options):
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=101, n_positions=64, bos_token_id=0, eos_token_id=0, **options)).double()
    hf = randomize64(hf, 5).eval()
    ours = from_hf_gpt2(hf).eval()
    x = tokens(101, 5)
    with torch.no_grad():
        reference = hf(x).logits
        assert (ours(x) - reference).abs().max() < 1e-12
    assert_bit_exact(to_hf_gpt2(ours).state_dict(), hf.state_dict())
    assert_bit_exact(from_hf_gpt2(to_hf_gpt2(ours)).state_dict(), ours.state_dict())


@pytest.mark.parametrize("options", LLAMA_CONFIGS)
def test_llama_float64_import_is_exact_and_round_trip_bit_exact(options):
    options = {"tie_word_embeddings": False, **options}
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=97, max_position_embeddings=128, **options)).double()
    hf = randomize64(hf, 6).eval()
    ours = from_hf_llama(hf).eval()
    x = tokens(97, 6)
    without_float32_steps(hf, ours.config.rope_theta, ours.config.dim_head)
    with torch.no_grad():
        reference = hf(x).logits
        assert (ours(x) - reference).abs().max() < 1e-12
    assert_bit_exact(to_hf_llama(ours).state_dict(), hf.state_dict())
    assert_bit_exact(from_hf_llama(to_hf_llama(ours)).state_dict(), ours.state_dict())
