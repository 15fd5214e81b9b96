"""cgt-fold: a CGT's context vector y folded into plain weights. method.py: the fold and the method; export.py: the
folded model or its LoRA adapter for transformers / peft."""

from .method import (
    CGTFold,
    CGTFoldOptions,
    FoldedContext,
    biased_copy,
    fold,
    guided_linears,
    lora_factors,
    prompt_context,
)

__all__ = ['CGTFold', 'CGTFoldOptions', 'FoldedContext', 'biased_copy', 'fold', 'guided_linears', 'lora_factors', 'prompt_context']
