"""distill-lora: context distillation into a LoRA adapter. method.py: the method and its options; adapted.py:
the adapted model (DistilledLoRA); export.py: the adapter as a PEFT LoRA folder and back."""

from .adapted import DistilledLoRA, compose_loras
from .method import DistillLoRA, DistillLoRAOptions
from . import export  # noqa: F401  (registers its PEFT LoRA form: export and load)

__all__ = ['DistillLoRA', 'DistillLoRAOptions', 'DistilledLoRA', 'compose_loras']
