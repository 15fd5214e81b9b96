"""The converted-model cache: a model shipped as GGUF is converted once into a standard Hugging Face folder
(config.json, generation_config.json, tokenizer files, model.safetensors in float32) and read from there after.

    folder = converted_folder("smollm2", gguf_sha256, gguf_path)   # converts on the first call
    model = transformer_from_llama_folder(folder, torch.float32)    # our Transformer, no transformers import

The folder lives under $INCONTEXT_CACHE (default ~/.cache/incontext)/converted/, named by the model, the GGUF
file's sha256 and CONVERSION_VERSION, never in the package or the project tree. It is built in a hidden sibling
and renamed into place, so an interrupted conversion leaves nothing and two processes converting at once leave
one good folder (the second rename fails, and that process uses the first one's). `incontext-converted.json`,
written last, records every file's size and digest (the whole file up to 8 MB, 64 blocks of 64 KiB spread over
a larger one): a folder that fails this check is rebuilt with a one-line note on stderr.

model.safetensors holds the tensors in the model's own order (HF Llama: q, k, v, o; gate, up, down), so our
loader maps the file copy-on-write (nothing is read until used, a write to a weight stays in the process) and
takes the fused q/k/v and gate/up weights as views over adjacent tensors: a warm load copies no weight.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import math
import mmap
import os
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

CONVERSION_VERSION = 1  # bump when the folder's layout or content changes: older folders are then not read
MANIFEST = "incontext-converted.json"
WEIGHTS = "model.safetensors"
FULL_DIGEST_LIMIT = 8 << 20  # files up to this size are hashed whole on every read; larger ones are sampled
SAMPLE_BLOCKS, SAMPLE_SIZE = 64, 64 << 10
STALE_SECONDS = 24 * 3600  # hidden build folders older than this are leftovers of killed conversions

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}
_TORCH = {name: dtype for dtype, name in _DTYPES.items()}


def cache_root() -> Path:
    """$INCONTEXT_CACHE if set, else ~/.cache/incontext (shared with the assembled GGUF files and text caches)."""
    root = os.environ.get("INCONTEXT_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "incontext"


def converted_root() -> Path:
    return cache_root() / "converted"


# ----------------------------------------------------------------------------- digests


def file_digest(path: Path) -> str:
    """sha256 of the whole file (small files) or of its size and SAMPLE_BLOCKS evenly spaced blocks (large ones)."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as f:
        if size <= FULL_DIGEST_LIMIT:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
            return digest.hexdigest()
        digest.update(str(size).encode())
        step = (size - SAMPLE_SIZE) // (SAMPLE_BLOCKS - 1)
        for i in range(SAMPLE_BLOCKS):
            f.seek(i * step)
            digest.update(f.read(SAMPLE_SIZE))
    return "sampled:" + digest.hexdigest()


def sha256_cached(path: Path) -> str:
    """The sha256 of a (large, read-only) source file, remembered by path, size and modification time in the cache
    (sources.json), so a warm load does not hash the GGUF file again."""
    from ..fileio import sha256_file

    path = Path(path).resolve()
    stat = path.stat()
    key, seen = str(path), [stat.st_size, stat.st_mtime_ns]
    memo_file = converted_root() / "sources.json"
    try:
        memo = json.loads(memo_file.read_text())
        entry = memo.get(key) if isinstance(memo, dict) else None
        if isinstance(entry, dict) and entry.get("stat") == seen and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
    except (OSError, ValueError, UnicodeDecodeError):
        memo = {}
    digest = sha256_file(path)
    memo = memo if isinstance(memo, dict) else {}
    memo[key] = {"stat": seen, "sha256": digest}
    try:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        partial = memo_file.with_name(f".sources.json.{os.getpid()}.partial")
        partial.write_text(json.dumps(memo, indent=1))
        os.replace(partial, memo_file)
    except OSError:
        pass  # a read-only cache: hash again next time
    return digest


# ----------------------------------------------------------------------------- safetensors, in a chosen order


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]], metadata: dict[str, str] | None = None) -> None:
    """A standard safetensors file with the tensors' bytes in the order given (safetensors' own writer sorts them
    by dtype and name, which would split q/k/v)."""
    header, offset = {}, 0
    for name, tensor in tensors:
        if tensor.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {tensor.dtype} cannot be written to safetensors here")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-aligned
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, tensor in tensors:
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            if flat.numel():
                f.write(memoryview(flat.view(torch.uint8).numpy()))
        f.flush()
        os.fsync(f.fileno())


class MappedTensors(dict):
    """A safetensors file's tensors (name -> tensor), each over its own bytes of one copy-on-write mapping of the
    file: every tensor has its own storage, as if loaded (saving one writes only its bytes, tied weights are found
    as tied), and nothing is read until used."""

    def __init__(self, mapping: mmap.mmap):
        super().__init__()
        self.mapping = mapping
        self.base = torch.frombuffer(mapping, dtype=torch.uint8, count=1).data_ptr() if len(mapping) else 0

    def view(self, offset: int, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
        numel = math.prod(shape)
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self.mapping, dtype=dtype, count=numel, offset=offset).view(shape)

    def rows(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """torch.cat(tensors) along rows: a view of the file without copying when they lie back to back in it (a
        file written by write_safetensors in the model's order), a copy otherwise."""
        first, size = tensors[0], tensors[0].element_size()
        inside = all(t.dtype == first.dtype and t.shape[1:] == first.shape[1:] and t.is_contiguous() and t.numel()
                     and 0 <= t.data_ptr() - self.base < len(self.mapping) for t in tensors)
        if len(tensors) > 1 and inside and all(a.data_ptr() + a.numel() * size == b.data_ptr()
                                               for a, b in zip(tensors, tensors[1:])):
            return self.view(first.data_ptr() - self.base, first.dtype, [sum(t.shape[0] for t in tensors),
                                                                          *first.shape[1:]])
        return torch.cat(tensors)


def read_safetensors(path: Path) -> MappedTensors:
    """The tensors of a safetensors file mapped copy-on-write (MappedTensors; a write to one stays in the process,
    nothing is read until used); ValueError naming what is wrong with a damaged file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is truncated")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, 100 << 20):
            raise ValueError(f"{path.name}: its header length ({length}) does not fit the file")
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(f"{path.name}: its header is not JSON") from None
        if not isinstance(header, dict):
            raise ValueError(f"{path.name}: its header is not a JSON object")
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    header.pop("__metadata__", None)
    start, data = 8 + length, size - 8 - length
    tensors, covered = MappedTensors(mapping), 0
    for name, entry in header.items():
        try:
            dtype = _TORCH[entry["dtype"]]
            shape = [int(n) for n in entry["shape"]]
            begin, end = (int(n) for n in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path.name}: the header's entry for {name} is malformed") from None
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if not (0 <= begin <= end <= data and end - begin == math.prod(shape) * itemsize):
            raise ValueError(f"{path.name}: {name}'s bytes ({begin}..{end}) do not fit the file or its shape")
        covered += end - begin
        if (start + begin) % itemsize == 0:
            tensors[name] = tensors.view(start + begin, dtype, shape)
        else:  # not aligned to its dtype (after an odd-sized tensor): copied out
            tensors[name] = tensors.view(start + begin, torch.uint8, [end - begin]).clone().view(dtype).reshape(shape)
    if covered != data:
        raise ValueError(f"{path.name}: the tensors cover {covered} of its {data} data bytes")
    return tensors


# ----------------------------------------------------------------------------- the folder


def check_folder(folder: Path, source_sha256: str) -> str | None:
    """None when `folder` is a finished conversion of the source with this sha256 whose files match the manifest;
    else what is wrong, in a few words."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return f"{MANIFEST} is missing"
    except (OSError, ValueError, UnicodeDecodeError):
        return f"{MANIFEST} is unreadable"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        return f"{MANIFEST} is malformed"
    if manifest.get("version") != CONVERSION_VERSION or manifest.get("source_sha256") != source_sha256:
        return "it was converted from another file or by another version"
    for name, entry in manifest["files"].items():
        path = folder / name
        if not isinstance(entry, dict) or not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != entry.get("size"):
            return f"{name} has the wrong size"
        if file_digest(path) != entry.get("digest"):
            return f"{name} has the wrong digest"
    return None


def _note(message: str) -> None:
    print("incontext: note: " + " ".join(message.split()), file=sys.stderr)


def _remove_stale(root: Path, name: str) -> None:
    for leftover in root.glob(f".{name}.*"):
        try:
            if time.time() - leftover.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(leftover, ignore_errors=True)
        except OSError:
            pass


def converted_folder(name: str, source_sha256: str, source: Callable[[], Path],
                     convert: Callable[[Path, Path], None]) -> Path:
    """The cached conversion of the model `name` whose GGUF file has `source_sha256`; built on first use by
    convert(source(), folder) (source() is called only then), rebuilt with a one-line note when damaged."""
    root = converted_root()
    folder = root / f"{name}-{source_sha256[:16]}-v{CONVERSION_VERSION}"
    problem = check_folder(folder, source_sha256) if folder.exists() else None
    if folder.exists() and problem is None:
        return folder
    if problem is not None:
        _note(f"the converted {name} in {folder} is damaged ({problem}); rebuilding it from the GGUF file")
    root.mkdir(parents=True, exist_ok=True)
    _remove_stale(root, folder.name)
    stage = Path(tempfile.mkdtemp(dir=root, prefix=f".{folder.name}.partial-"))
    try:
        umask = os.umask(0)
        os.umask(umask)
        stage.chmod(0o777 & ~umask)
        convert(source(), stage)
        files = {p.name: {"size": p.stat().st_size, "digest": file_digest(p)} for p in sorted(stage.iterdir())}
        manifest = {"version": CONVERSION_VERSION, "model": name, "source_sha256": source_sha256, "files": files}
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")  # last: marks a finished folder
        _place(stage, folder, source_sha256)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return folder


def _place(stage: Path, folder: Path, source_sha256: str) -> None:
    """`stage` becomes `folder` by a rename; a good folder another process placed meanwhile is kept instead, a
    damaged one moved aside first."""
    from ..fileio import fsync_dir

    for _ in range(3):
        if folder.exists():
            if check_folder(folder, source_sha256) is None:
                return  # another process converted it meanwhile: theirs is as good as ours
            aside = folder.with_name(f".{folder.name}.damaged-{os.getpid()}-{time.monotonic_ns()}")
            try:
                os.replace(folder, aside)
            except OSError:
                continue
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(stage, folder)
        except OSError:  # placed by another process between the check and the rename
            continue
        fsync_dir(folder.parent)
        return
    raise OSError(f"cannot place the converted model at {folder} (other processes keep replacing it)")


def quiet_gguf_load(folder: Path, name: str, dtype: torch.dtype):
    """(model, tokenizer) from a GGUF file with transformers, without its progress bars and warnings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # the GGUF de-quantization bars would drown a command's own output
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils") or importlib.import_module(
        "transformers.modeling_gguf_pytorch_utils")
    plain_tqdm = getattr(gguf_utils, "tqdm", None)
    if plain_tqdm is not None:  # that module calls tqdm directly, past transformers' progress-bar switch
        gguf_utils.tqdm = functools.partial(plain_tqdm, disable=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    finally:
        logging.set_verbosity(verbosity)
        if plain_tqdm is not None:
            gguf_utils.tqdm = plain_tqdm
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer


def convert_gguf(gguf: Path, stage: Path) -> None:
    """Write the GGUF model as a Hugging Face folder into `stage`: float32 weights in the model's own tensor order
    (tied ones once), config.json without the GGUF quantization note, generation_config.json, tokenizer files."""
    model, tokenizer = quiet_gguf_load(gguf.parent, gguf.name, torch.float32)
    seen, tensors = set(), []
    for key, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:  # a tied weight (lm_head = embed_tokens): transformers ties it again on load
            continue
        seen.add(tensor.data_ptr())
        tensors.append((key, tensor))
    write_safetensors(stage / WEIGHTS, tensors, {"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "transformers_version"):
        config.pop(key, None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = "float32"
    (stage / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(stage)
    tokenizer.save_pretrained(stage)


# ----------------------------------------------------------------------------- reading it back


def transformer_from_llama_folder(folder: Path, dtype: torch.dtype):
    """Our Transformer from a converted Llama folder: the weights mapped from model.safetensors (float32: no copy;
    another dtype: converted once), the config from config.json; transformers is not imported."""
    from .hf import assign_into_new, config_from_llama, llama_state_to_ours

    try:
        hf_config = SimpleNamespace(**json.loads((folder / "config.json").read_text()))
        state = read_safetensors(folder / WEIGHTS)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"the converted model in {folder} cannot be read ({error}); remove the folder to rebuild it") from None
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    config = config_from_llama(hf_config, bias=any(k.endswith("_proj.bias") for k in state))
    return assign_into_new(config, llama_state_to_ours(state, config, rows=state.rows), dtype)
