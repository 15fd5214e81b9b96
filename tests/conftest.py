import os

import pytest
import torch
from hypothesis import settings

# property tests: few examples, no deadline (CPU timing varies with load), reproducible in CI
settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-300))


class ByteCodec:
    """A byte-level tokenizer (UTF-8 bytes as ids): enough for the text sources on tiny random models."""

    def encode(self, text):
        return list(text.encode("utf-8"))

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8")


def randomize64(model, seed):
    """float64 weights with nonzero low bits (not float32-representable); norm gains near 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            is_gain = name.endswith("weight") and ("norm" in name or ".ln_" in name)
            p.copy_(1.0 + 0.2 * noise if is_gain else 0.1 * noise)
    assert all(not torch.equal(p, p.float().double()) for p in model.parameters())
    return model


def without_float32_steps(hf, theta: float, dim: int):
    """transformers computes RoPE angles and RMSNorm statistics in float32 even in a float64 model (a ~1e-7 logit
    gap unrelated to the weights); redo both in float64 (any *RMSNorm, the model's rotary embedding if it has
    one), to test a conversion itself."""

    def rope(x, position_ids):
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
        angles = position_ids[..., None].double() * inv_freq
        emb = torch.cat([angles, angles], -1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    def rms_norm(module):
        return lambda x: module.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))

    if hasattr(getattr(hf, "model", None), "rotary_emb"):
        hf.model.rotary_emb.forward = rope
    for module in hf.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = rms_norm(module)
    return hf


def tiny_bpe_tokenizer(sentences, vocab_size, chat_template):
    """A byte-level BPE tokenizer trained on `sentences` (specials <|im_start|> = BOS, <|im_end|> = EOS) with a chat
    template: a real tokenizer for tiny random Hugging Face models, nothing downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", bos_token="<|im_start|>")
    tokenizer.chat_template = chat_template
    return tokenizer



SENTENCES = ["Ada Lovelace was born in London.", "Alan Turing works as a mathematician and has a pet cat named Mat.",
             "Q: Where was Ada born?\nA: London", "What is the name of the pet? Born in the year 1815."]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_llama_backends(vocab_size: int):
    """(our Transformer, the Hugging Face backend) with the same weights: a tiny random Llama with grouped K/V heads
    (2 layers, width 32, 4 heads, 2 K/V heads), its matrices scaled up so that attention is not uniform."""
    import transformers

    from incontext.interop.hf import wrap_hf

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=0, eos_token_id=1)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    lm = wrap_hf(hf).eval()
    return lm.as_transformer(), lm


def r_approx_steps(model, sequences, targets, config, layers: int | None = None, steps: int | None = None) -> dict:
    """TinT's own gradient rules (R-approx) as plain SGD: `steps` steps (default config.n_steps) on the top `layers`
    layers' parameter subset (default config.n_simulation_layers), each on the loss summed over the target tokens of
    every sequence; the updated state dict (the reference for tint_update)."""
    import torch.nn.functional as F

    from incontext.tint.reference import functional_forward, merge_parameters, split_parameters, trainable_names

    params = split_parameters(model)
    params["lm_head.weight"] = params.get("lm_head.weight", params["tok_emb.weight"])
    names = trainable_names(model, config.n_simulation_layers if layers is None else layers)
    for _ in range(config.n_steps if steps is None else steps):
        leaves = {n: params[n].clone().requires_grad_(True) for n in names}
        loss = 0.0
        for ids, keep in zip(sequences, targets):
            logits = functional_forward(model, {**params, **leaves}, ids, "approx", config)
            loss = loss + F.cross_entropy(logits[:-1][keep[1:]], ids[1:][keep[1:]], reduction="sum")
        grads = torch.autograd.grad(loss, list(leaves.values()))
        with torch.no_grad():
            for n, g in zip(names, grads):
                params[n] = params[n] - config.learning_rate * g
    return merge_parameters(params)
