"""distill-lora: context distillation into a LoRA adapter. method.py: the method, its options and the adapted model
(DistilledLoRA); export.py: the adapter as a PEFT LoRA folder and back."""

from .method import DistilledLoRA, DistillLoRA, DistillLoRAOptions, compose_loras

__all__ = ['DistillLoRA', 'DistillLoRAOptions', 'DistilledLoRA', 'compose_loras']
