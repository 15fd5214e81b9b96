"""TinT (Panigrahi et al.): a transformer that simulates fine-tuning an auxiliary transformer in its forward pass."""

from .modules import Layout, TintConfig
from .reference import dynamic_eval, sgd_reference
from .simulator import TinT

__all__ = ["Layout", "TinT", "TintConfig", "dynamic_eval", "sgd_reference"]
