"""incontext: in-context learning and context-to-weights methods in one PyTorch library."""

__version__ = "0.1.0"
__all__ = ["Cache", "Transformer", "TransformerConfig", "__version__"]


def __getattr__(name: str):
    # imported on first use, so that `incontext --help` (which imports this package) does not load torch
    if name in ("Cache", "Transformer", "TransformerConfig"):
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
