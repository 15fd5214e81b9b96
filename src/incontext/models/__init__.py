from .cgt import CGT, CGTConfig, CGTOutput
from .cgt_adapter import CGTAdapter, CGTAdapterConfig
from .cgt_losses import CGTLossConfig, cgt_loss
from .transformer import Cache, LayerState, Transformer, TransformerConfig

__all__ = ["CGT", "CGTAdapter", "CGTAdapterConfig", "CGTConfig", "CGTLossConfig", "CGTOutput", "Cache", "LayerState",
           "Transformer", "TransformerConfig", "cgt_loss"]
