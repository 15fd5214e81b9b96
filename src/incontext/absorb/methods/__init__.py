"""The absorb methods, one module (or package: method, export) each, registered by name on import. No method imports
another (tests/test_layers.py); what two share lives one level up (protocol, distill, study, lora, presses,
prompt_update)."""

from . import (
    cgt_fold,
    distill_lora,
    dynamic_eval,
    iclca,
    iclca_approx,
    kv_prefix,
    kv_press,
    reference,
    tint,
)
from .distill_lora import export as _distill_lora_export  # noqa: F401  (registers distill-lora's PEFT export)
from .kv_prefix import export as _kv_prefix_export  # noqa: F401  (registers kv-prefix's CARTRIDGE export)

__all__ = ["cgt_fold", "distill_lora", "dynamic_eval", "iclca", "iclca_approx", "kv_prefix", "kv_press", "reference", "tint"]
