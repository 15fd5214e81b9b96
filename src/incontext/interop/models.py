"""One way to name a model on the command line: `smollm2`, a run folder or checkpoint of ours, or a local
Hugging Face model folder. Each resolves to our `Transformer`, a tokenizer when the model reads text, and
the training task when the model was trained here (the harness then draws that task's episodes).

    loaded = load_model("smollm2")
    loaded.model, loaded.tokenizer.encode("Hello"), loaded.task
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MODEL_CHOICES = "smollm2 (the shipped pretrained SmolLM2-135M-Instruct), a run folder or checkpoint of ours " \
                "(holding state.json), a linearize-smollm2 result folder (the linearized SmolLM2), " \
                "or a local Hugging Face model folder (holding config.json)"


class HFCodec:
    """A Hugging Face tokenizer as the harness's codec: encode without special tokens, decode, chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this tokenizer has no chat template")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id


@dataclass
class LoadedModel:
    model: Any  # our Transformer (or CGT for a CGT run)
    tokenizer: Any | None  # a codec (encode/decode), None for models of synthetic tasks
    task: Any | None  # the training task of a run of ours
    description: str
    hf_name: str | None = None  # "smollm2" or the HF folder, for exporting adapters


def load_model(spec: str | Path, dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Resolves a model name or folder (see MODEL_CHOICES); one-line errors for anything else."""
    if str(spec) == "smollm2":
        from .hf import from_hf_llama
        from .pretrained import load_smollm2

        hf_model, tokenizer = load_smollm2(dtype)
        return LoadedModel(from_hf_llama(hf_model).eval(), HFCodec(tokenizer), None,
                           "SmolLM2-135M-Instruct (pretrained, Llama architecture)", "smollm2")
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"unknown model {str(spec)!r}: give {MODEL_CHOICES}")
    from .linearized import is_linearized_folder

    if is_linearized_folder(path):
        from .linearized import load_linearized

        smollm2 = load_model("smollm2", dtype)
        return LoadedModel(load_linearized(path, smollm2.model), smollm2.tokenizer, None,
                           f"SmolLM2-135M-Instruct linearized by learned feature maps ({path})", None)
    if (path / "config.json").is_file() and not (path / "state.json").is_file():
        return _load_hf_folder(path, dtype)
    from ..train import load_for_eval
    from ..train.checkpoint import resolve_checkpoint

    try:
        checkpoint = resolve_checkpoint(path)
    except (FileNotFoundError, ValueError) as error:
        raise FileNotFoundError(f"{path} is not a model: give {MODEL_CHOICES} ({error})") from None
    model, config = load_for_eval(checkpoint)
    task = config.build_task()
    codec = task if hasattr(task, "encode") else None  # text tasks tokenize with their own BPE
    return LoadedModel(model.to(dtype).eval(), codec, task, f"run {checkpoint} (task {task.name})")


def _load_hf_folder(path: Path, dtype: torch.dtype) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .hf import from_hf_gpt2, from_hf_llama

    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    converters = {"llama": from_hf_llama, "gpt2": from_hf_gpt2}
    if model_type not in converters:
        raise ValueError(f"{path}: model_type {model_type!r} is not supported; supported: {', '.join(converters)}")
    from transformers.utils import logging

    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # no "Loading weights" bar on stderr: errors stay one line
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    finally:
        if bar:
            logging.enable_progress_bar()
    try:
        codec = HFCodec(AutoTokenizer.from_pretrained(path))
    except (OSError, ValueError):
        codec = None  # a model without tokenizer files: synthetic tasks only
    return LoadedModel(converters[model_type](hf_model).eval(), codec, None, f"Hugging Face {model_type} model {path}", str(path))
