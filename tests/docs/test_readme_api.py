"""The README's Python API block runs as a user pastes it (slow: it loads SmolLM2 and compares on 5 SQuAD paragraphs)."""

import re

import pytest

import docsync as docs

ROOT = docs.repo_root()


def api_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_block_is_there_and_compiles():
    compile(api_block(), "README.md", "exec")


@pytest.mark.slow
def test_the_readme_python_api_runs_as_written(tmp_path, monkeypatch):
    pytest.importorskip("kvpress")
    monkeypatch.chdir(tmp_path)  # it saves runs/adapted
    scope: dict = {}
    exec(compile(api_block(), "README.md", "exec"), scope)
    rows = scope["rows"]
    assert [r["method"] for r in rows][:3] == ["keep-prompt", "drop-prompt", "kv-press"]
    assert all(r["status"] == "ok" for r in rows)
