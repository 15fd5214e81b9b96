"""Tiny random CGT adapters for the tests (tests/models, tests/interop, tests/absorb)."""

import torch

from incontext.models import CGTAdapter, CGTAdapterConfig, Transformer, TransformerConfig

VOCAB = 41


def random_base(seed, llama=True, dtype=torch.float64, n_layer=4, **options) -> Transformer:
    """A tiny random base: Llama-like (RoPE, RMSNorm, SwiGLU, grouped K/V, no biases) or GPT-2-like; float64
    weights that float32 cannot represent, norm gains away from one."""
    shape = dict(n_layer=n_layer, n_head=4, d_model=16, vocab_size=VOCAB, max_seq_len=64)
    if llama:
        shape.update(n_kv_head=2, d_mlp=24, positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)
    torch.manual_seed(seed)
    base = Transformer(TransformerConfig(**{**shape, **options})).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in base.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype)
            p.copy_(1.0 + 0.2 * noise if "norm" in name and name.endswith("weight") else 0.3 * noise)
    return base.eval()


def random_adapter(base, seed, **options) -> CGTAdapter:
    """An adapter with every guide weight random (as after training): L templates nonzero, mixing of order one."""
    config = dict(split_layer=2, n_y_blocks=2, d_y=8, n_head_y=2, rank=3, n_templates=4)
    adapter = CGTAdapter(base, CGTAdapterConfig(**{**config, **options}), generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in adapter.guide.named_parameters():
            scale = 1.0 if ".mix." in name else 0.3
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
    return adapter.eval()


def tokens(seed, b, t):
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))
