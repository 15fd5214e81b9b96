"""incontext: in-context learning and context-to-weights methods in one PyTorch library."""

from .models import Cache, Transformer, TransformerConfig

__version__ = "0.1.0"
__all__ = ["Cache", "Transformer", "TransformerConfig", "__version__"]
