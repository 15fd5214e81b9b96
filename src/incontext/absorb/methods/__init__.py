"""The absorb methods, one module (or package: method, adapted, export) each; importing one registers what it brings
(protocol.py's registries: the method by name, its adapted model, its PEFT form where it has one). No method imports
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

__all__ = ["cgt_fold", "distill_lora", "dynamic_eval", "iclca", "iclca_approx", "kv_prefix", "kv_press", "reference", "tint"]
