"""TinT (Panigrahi et al.): a transformer that simulates fine-tuning an auxiliary transformer in its forward pass."""

from .builders import auxiliary_from_hf, tint_from_hf
from .modules import Layout, TintConfig
from .reference import sgd_reference
from .simulator import TinT

__all__ = ["Layout", "TinT", "TintConfig", "auxiliary_from_hf", "sgd_reference", "tint_from_hf"]
