"""Result files stay small: no weight file over 1 MB is tracked by git (the result's command remakes it)."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".npz", ".npy")
LIMIT = 1_000_000


def tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")


def test_no_tracked_weight_file_is_over_1_mb():
    big = [f"{name} ({(ROOT / name).stat().st_size / 1e6:.1f} MB)" for name in tracked()
           if name.endswith(WEIGHTS) and (ROOT / name).is_file() and (ROOT / name).stat().st_size > LIMIT]
    assert not big, "weight files over 1 MB in git (ignore them; their command remakes them): " + ", ".join(big)


def test_no_leftover_merge_or_editor_files_are_tracked():
    stray = [name for name in tracked() if name.endswith((".orig", ".rej", ".bak", ".swp", "~"))]
    assert not stray, "leftover files tracked by git: " + ", ".join(stray)


def test_every_committed_output_folder_keeps_its_marker():
    """A committed command output (an absorb folder's absorb.json) keeps the marker that lets its command write it
    again: its weight files are not committed, so re-running the command that remakes them must be allowed to."""
    names = set(tracked())
    unmarked = [str(Path(name).parent) for name in names
                if Path(name).name == "absorb.json" and str(Path(name).parent / ".incontext-experiment") not in names]
    assert not unmarked, "absorb folders committed without .incontext-experiment: " + ", ".join(sorted(unmarked))
