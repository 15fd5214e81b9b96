from .transformer import Cache, Transformer, TransformerConfig

__all__ = ["Cache", "Transformer", "TransformerConfig"]
