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

from ..runtime import Runtime, resolve_runtime

MODEL_CHOICES = "smollm2 (the shipped pretrained SmolLM2-135M-Instruct), qwen2.5-coder-0.5b (the shipped " \
                "Qwen2.5-Coder-0.5B-Instruct), gemma3-270m (the shipped Gemma-3-270M), a run folder or checkpoint of ours " \
                "(holding state.json), a linearize-smollm2 result folder (the linearized SmolLM2), " \
                "or a local Hugging Face model folder (holding config.json)"


class HFCodec:
    """A Hugging Face tokenizer as the harness's codec: encode without special tokens, decode, chat template. Text
    marked as data (tasks.placement.as_data: a document, a user's message) is encoded as plain text, a special
    token's text as its characters; special tokens come only from the template's own text."""

    reads_data_marks = True

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        from ..tasks.placement import DATA_OPEN, data_segments

        if DATA_OPEN not in text:
            return self._encode(text, False)
        return [i for segment, data in data_segments(text) for i in self._encode(segment, data)]

    def _encode(self, text: str, data: bool) -> list[int]:
        if data:
            return self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
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


class FolderCodec(HFCodec):
    """HFCodec for a Hugging Face folder's tokenizer.json, read by the `tokenizers` library alone (encode, decode,
    the EOS id: what generation needs); transformers' tokenizer (`.tokenizer`: the chat template, the vocabulary)
    loads on first use. Encode and decode are the same as transformers' (tests check) where the folder's
    tokenizer_config.json asks for no clean-up of decoded spaces; otherwise decode goes to transformers."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        self.fast = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        config_file = self.folder / "tokenizer_config.json"
        self.settings = json.loads(config_file.read_text()) if config_file.is_file() else {}
        self._full = None

    @property
    def tokenizer(self):
        if self._full is None:
            from transformers import AutoTokenizer

            self._full = AutoTokenizer.from_pretrained(self.folder)
        return self._full

    def __len__(self) -> int:
        """The number of tokens (added ones included), without loading transformers' tokenizer."""
        return self.fast.get_vocab_size(with_added_tokens=True)

    def _encode(self, text: str, data: bool) -> list[int]:
        if not data:
            return self.fast.encode(text, add_special_tokens=False).ids
        self.fast.encode_special_tokens = True  # special tokens' text read as text
        try:
            return self.fast.encode(text, add_special_tokens=False).ids
        finally:
            self.fast.encode_special_tokens = False

    def decode(self, ids) -> str:
        if self.settings.get("clean_up_tokenization_spaces"):
            return super().decode(ids)
        return self.fast.decode(list(ids), skip_special_tokens=False)

    def _special(self, key: str) -> str | None:
        token = self.settings.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        return token if isinstance(token, str) else None

    @property
    def eos_token_id(self) -> int | None:
        eos = self._special("eos_token")
        return self.fast.token_to_id(eos) if eos is not None else self.tokenizer.eos_token_id

    def leading_bos(self) -> int | None:
        """leading_bos(tokenizer) without loading transformers' tokenizer."""
        bos = self._special("bos_token")
        bos_id = None if bos is None else self.fast.token_to_id(bos)
        if bos_id is None:
            return None
        ids = self.fast.encode("a", add_special_tokens=True).ids
        return bos_id if ids and ids[0] == bos_id else None


def leading_bos(tokenizer) -> int | None:
    """The BOS id when the tokenizer starts every text with it (Gemma, Llama 3), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if tokenizer is None or bos is None:
        return None
    try:
        ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    except (TypeError, ValueError, KeyError):
        return None
    return bos if ids and ids[0] == bos else None


@dataclass
class LoadedModel:
    model: Any  # a causal LM of either backend (our Transformer, HFCausalLM), or a CGT for a CGT run
    tokenizer: Any | None  # a codec (encode/decode), None for models of synthetic tasks
    task: Any | None  # the training task of a run of ours
    description: str
    family: str | None = None  # the Hugging Face model_type the weights came from (families table), if any


def load_model(spec: str | Path, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None, *,
               runtime: Runtime | None = None) -> LoadedModel:
    """Resolves a model name or folder (see MODEL_CHOICES) onto a device in a dtype: `runtime`'s as it is (resolved
    once by the caller: the CLI's, from --device / --dtype), else `device` (default cpu) in `dtype` (default float32),
    both checked here (runtime.resolve_runtime); one-line errors for anything else. Hugging Face folders load on the
    Hugging Face backend (transformers' own model and cache); `smollm2` and runs of ours on our Transformer."""
    if runtime is None:
        runtime = resolve_runtime("cpu" if device is None else device, torch.float32 if dtype is None else dtype)
    elif device is not None or dtype is not None:
        raise TypeError("load_model takes a runtime or a device and dtype, not both")
    loaded = _load(spec, runtime.dtype)
    check_vocabulary(loaded, spec)
    loaded.model = loaded.model.to(runtime.device)
    return loaded


def check_vocabulary(loaded: LoadedModel, spec: str | Path) -> None:
    """One-line ValueError when the tokenizer gives ids the model has no embedding for (a tokenizer of more tokens
    than the model's vocabulary: the first such id would end in an IndexError inside the embedding)."""
    codec = loaded.tokenizer  # a FolderCodec counts its tokens itself (no transformers import); HFCodec its tokenizer's
    tokenizer = codec if isinstance(codec, FolderCodec) else getattr(codec, "tokenizer", None)
    vocab = getattr(getattr(loaded.model, "config", None), "vocab_size", None)
    if tokenizer is None or not isinstance(vocab, int):
        return  # a task's own codec matches its model
    tokens = len(tokenizer)
    if tokens > vocab:
        raise ValueError(f"model {str(spec)!r}: its tokenizer has {tokens} tokens but the model's vocabulary holds "
                         f"{vocab} (ids {vocab} and up have no embedding): the tokenizer does not belong to these weights")


def _load(spec: str | Path, dtype: torch.dtype) -> LoadedModel:
    if str(spec) == "smollm2":  # from the converted-model cache (interop/converted.py): no transformers import
        from .converted import transformer_from_llama_folder
        from .pretrained import smollm2_folder

        folder = smollm2_folder()
        return LoadedModel(transformer_from_llama_folder(folder, dtype).eval(), FolderCodec(folder), None,
                           "SmolLM2-135M-Instruct (pretrained, Llama architecture)", "llama")
    if str(spec) == "gemma3-270m":
        from .hf import wrap_hf
        from .pretrained import gemma3_270m_folder, quiet_folder_model

        folder = gemma3_270m_folder()
        codec = FolderCodec(folder)  # transformers' Gemma tokenizer takes seconds to build; loaded when asked for
        lm = wrap_hf(quiet_folder_model(folder, dtype)).read_bos_first(codec.leading_bos()).eval()
        return LoadedModel(lm, codec, None, "Gemma-3-270M (pretrained, Hugging Face backend)", "gemma3_text")
    if str(spec) == "qwen2.5-coder-0.5b":
        from .hf import wrap_hf
        from .pretrained import qwen05_folder, quiet_folder_model

        folder = qwen05_folder()
        codec = FolderCodec(folder)
        lm = wrap_hf(quiet_folder_model(folder, dtype)).read_bos_first(codec.leading_bos()).eval()
        return LoadedModel(lm, codec, None, "Qwen2.5-Coder-0.5B-Instruct (pretrained, Hugging Face backend)", "qwen2")
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(f"unknown model {str(spec)!r}: give {MODEL_CHOICES}")
    from .linearized import is_linearized_folder

    if is_linearized_folder(path):
        from .linearized import load_linearized

        smollm2 = _load("smollm2", dtype)
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
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.families import FAMILIES
    from .hf import wrap_hf

    try:
        config = json.loads((path / "config.json").read_text())
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"{path / 'config.json'} is not valid JSON") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path / 'config.json'} is not a JSON object")
    model_type = config.get("model_type")
    from transformers.utils import logging

    bar, verbosity = logging.is_progress_bar_enabled(), logging.get_verbosity()
    logging.disable_progress_bar()  # no "Loading weights" bar on stderr: errors stay one line
    logging.set_verbosity_error()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as error:  # e.g. truncated weights
        raise ValueError(f"{path}: transformers cannot load this model ({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        codec = HFCodec(tokenizer)
    except (OSError, ValueError, TypeError):
        tokenizer, codec = None, None  # a model without tokenizer files: synthetic tasks only
    known = "" if model_type in FAMILIES else " (not in the families table: LoRA targets and conversion unknown)"
    lm = wrap_hf(hf_model.eval()).read_bos_first(leading_bos(tokenizer)).eval()
    return LoadedModel(lm, codec, None,
                       f"Hugging Face {model_type} model {path}{known}", model_type)
