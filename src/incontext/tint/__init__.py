"""TinT (Panigrahi et al.): a transformer that simulates fine-tuning an auxiliary transformer in its forward pass."""

from .modules import Layout, TintConfig
from .reference import sgd_reference
from .simulator import TinT

__all__ = ["Layout", "TinT", "TintConfig", "sgd_reference"]
