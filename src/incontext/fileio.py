"""Durable file writes and strict JSON, shared by checkpoints, data caches and result files (no torch here).

A file that must survive a crash is written under a temporary name, fsync'd, renamed into place, and its
folder fsync'd, so that after a power loss the name points at either the old or the complete new content.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def fsync_file(path: str | Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(path: str | Path) -> None:
    """Make a rename or a new entry in folder `path` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def durable_replace(partial: str | Path, path: str | Path) -> None:
    """Rename a fully written file (or folder) `partial` to `path` after flushing it to disk."""
    partial, path = Path(partial), Path(path)
    if partial.is_dir():
        for child in partial.iterdir():
            if child.is_file():
                fsync_file(child)
        fsync_dir(partial)
    else:
        fsync_file(partial)
    os.replace(partial, path)
    fsync_dir(path.parent)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder (never a half-written file)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        durable_replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def finite_for_json(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None, so that it can be written as strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_for_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_for_json(v) for v in value]
    return value


def strict_json(value: Any, indent: int | None = 2) -> str:
    """JSON that every parser accepts: NaN and infinities become null (bare NaN is not JSON)."""
    return json.dumps(finite_for_json(value), indent=indent, allow_nan=False)
