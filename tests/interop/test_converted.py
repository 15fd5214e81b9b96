"""The converted-model cache (interop/converted.py): the safetensors written in a chosen order and mapped back with
fused views, the folder built once, checked on read, rebuilt when damaged, placed once by racing processes; and
(the real SmolLM2, in a temporary cache) the converted folder gives the GGUF load's tensors bit for bit and its
logits."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from incontext.interop import converted
from incontext.interop.converted import MANIFEST, check_folder, converted_folder, read_safetensors, write_safetensors


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_written_safetensors_read_back_by_the_library_and_as_fused_views(tmp_path):
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, 8, generator=g) for n in (8, 4, 4))
    tensors = [("q", q), ("k", k), ("v", v), ("norm", torch.ones(8)), ("half", torch.randn(3, generator=g).bfloat16()),
               ("ids", torch.arange(5))]
    write_safetensors(tmp_path / "t.safetensors", tensors, {"format": "pt"})
    theirs, mine = load_file(tmp_path / "t.safetensors"), read_safetensors(tmp_path / "t.safetensors")
    assert list(mine) == [name for name, _ in tensors]  # in the order written (safetensors sorts its own)
    for name, tensor in tensors:
        assert torch.equal(theirs[name], tensor) and torch.equal(mine[name], tensor) and mine[name].dtype == tensor.dtype
    fused = mine.rows([mine["q"], mine["k"], mine["v"]])
    assert torch.equal(fused, torch.cat([q, k, v]))
    assert fused.data_ptr() == mine["q"].data_ptr()  # a view of the file: no copy
    apart = mine.rows([mine["q"], mine["v"]])  # not back to back: a copy
    assert torch.equal(apart, torch.cat([q, v])) and apart.data_ptr() != mine["q"].data_ptr()
    for tensor in [fused, *mine.values()]:  # each its own storage, as if loaded: saving one writes only its bytes
        assert tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    mine["q"].add_(1.0)  # copy-on-write: the file keeps its bytes
    assert torch.equal(read_safetensors(tmp_path / "t.safetensors")["q"], q)


@pytest.mark.parametrize("damage", ["truncated", "header", "coverage"])
def test_a_damaged_safetensors_file_is_a_one_line_value_error(tmp_path, damage):
    path = tmp_path / "t.safetensors"
    write_safetensors(path, [("a", torch.randn(64, 64)), ("b", torch.randn(64))])
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:-100])
    elif damage == "header":
        path.write_bytes(raw[:8] + b"x" + raw[9:])
    else:
        path.write_bytes(raw + b"\0" * 4)
    with pytest.raises(ValueError) as error:
        read_safetensors(path)
    assert len(str(error.value).splitlines()) == 1


def fake_convert(calls):
    def convert(source: Path, stage: Path):
        calls.append(source)
        (stage / "config.json").write_text(json.dumps({"model_type": "toy"}))
        (stage / "model.safetensors").write_bytes(os.urandom(9 << 20))  # sampled, not hashed whole
    return convert


def test_the_folder_is_built_once_then_read(cache, tmp_path):
    calls = []
    source = tmp_path / "model.gguf"
    first = converted_folder("toy", "ab" * 32, lambda: source, fake_convert(calls))
    again = converted_folder("toy", "ab" * 32, lambda: source, fake_convert(calls))
    assert first == again and calls == [source]
    assert first.parent == cache / "converted" and first.name == f"toy-{'ab' * 8}-v{converted.CONVERSION_VERSION}"
    assert sorted(p.name for p in first.iterdir()) == ["config.json", MANIFEST, "model.safetensors"]
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no build folder left
    other = converted_folder("toy", "cd" * 32, lambda: source, fake_convert(calls))  # another source file: its own
    assert other != first and len(calls) == 2


@pytest.mark.parametrize("damage", ["manifest", "size", "sampled byte", "small file", "missing file", "version"])
def test_a_damaged_folder_is_rebuilt_with_a_one_line_note(cache, tmp_path, capsys, damage):
    calls = []
    folder = converted_folder("toy", "ab" * 32, lambda: tmp_path, fake_convert(calls))
    weights = folder / "model.safetensors"
    if damage == "manifest":
        (folder / MANIFEST).unlink()
    elif damage == "size":
        with weights.open("ab") as f:
            f.write(b"\0")
    elif damage == "sampled byte":  # the first block is always sampled
        raw = bytearray(weights.read_bytes())
        raw[10] ^= 0xFF
        weights.write_bytes(bytes(raw))
    elif damage == "small file":
        (folder / "config.json").write_text(json.dumps({"model_type": "toz"}))
    elif damage == "missing file":
        (folder / "config.json").unlink()
    else:
        manifest = json.loads((folder / MANIFEST).read_text())
        (folder / MANIFEST).write_text(json.dumps({**manifest, "version": 0}))
    assert check_folder(folder, "ab" * 32) is not None
    capsys.readouterr()
    assert converted_folder("toy", "ab" * 32, lambda: tmp_path, fake_convert(calls)) == folder
    note = capsys.readouterr().err
    assert len(calls) == 2 and check_folder(folder, "ab" * 32) is None
    assert note.startswith("incontext: note: the converted toy in") and "rebuilding" in note
    assert len(note.splitlines()) == 1
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


def test_two_processes_converting_at_once_leave_one_good_folder(cache, tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys, time
        from pathlib import Path
        from incontext.interop.converted import converted_folder

        def convert(source, stage):
            (stage / "model.safetensors").write_bytes(os.urandom(1 << 20))
            time.sleep(1.5)  # both are converting now
            (stage / "who").write_text(str(os.getpid()))

        print(converted_folder("toy", "ef" * 32, lambda: Path("."), convert))
    """)
    env = {**os.environ, "INCONTEXT_CACHE": str(cache), "PYTHONPATH": os.pathsep.join(sys.path)}
    runs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=120)[0].strip() for run in runs]
    assert all(run.returncode == 0 for run in runs)
    assert outputs[0] == outputs[1]
    folder = Path(outputs[0])
    assert check_folder(folder, "ef" * 32) is None
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # the loser's build folder is gone


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path))
    assert converted.converted_root() == tmp_path / "converted"
    monkeypatch.delenv("INCONTEXT_CACHE")
    assert converted.converted_root() == Path.home() / ".cache" / "incontext" / "converted"


# ----------------------------------------------------------------------------- the real SmolLM2, in a temporary cache


TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France; naïve café, 3.14 and <|im_end|>."


@pytest.fixture(scope="module")
def smollm2_both(tmp_path_factory):
    """(the GGUF load, the converted folder) with the cache in a temporary folder."""
    pytest.importorskip("transformers")
    from incontext.interop import pretrained

    try:
        gguf = pretrained.smollm2_gguf_path()
    except FileNotFoundError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    package = sorted(str(p) for p in gguf.parent.rglob("*"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INCONTEXT_CACHE", str(tmp_path_factory.mktemp("cache")))
        reference = pretrained.load_smollm2_gguf()
        folder = pretrained.smollm2_folder()
        yield reference, folder
    assert sorted(str(p) for p in gguf.parent.rglob("*")) == package  # nothing written into the package


def test_the_converted_smollm2_has_the_gguf_tensors_and_logits(smollm2_both):
    from incontext.interop.pretrained import quiet_folder_load

    (gguf_model, _), folder = smollm2_both
    assert not any(Path.cwd() in p.parents for p in [folder])  # never in the project tree
    cached, _ = quiet_folder_load(folder, torch.float32)
    theirs, mine = gguf_model.state_dict(), cached.state_dict()
    assert set(theirs) == set(mine)
    for name in theirs:
        assert theirs[name].dtype == mine[name].dtype and torch.equal(theirs[name], mine[name]), name
    ids = torch.tensor([list(range(1, 40, 3)) + [400, 5000, 49151]])
    with torch.no_grad():
        assert torch.equal(gguf_model(ids).logits, cached(ids).logits)


def test_our_transformer_from_the_folder_equals_the_conversion_of_the_gguf_model(smollm2_both, tmp_path):
    from incontext.config import to_dict
    from incontext.interop.converted import transformer_from_llama_folder
    from incontext.interop.hf import from_hf_llama

    (gguf_model, _), folder = smollm2_both
    reference, mapped = from_hf_llama(gguf_model).eval(), transformer_from_llama_folder(folder, torch.float32).eval()
    assert to_dict(reference.config) == to_dict(mapped.config)  # absorb folders compare their base's config
    theirs, mine = reference.state_dict(), mapped.state_dict()
    assert set(theirs) == set(mine)
    for name in theirs:
        assert torch.equal(theirs[name], mine[name]), name
    assert mapped.lm_head.weight is mapped.tok_emb.weight  # tied, as the converted model
    from safetensors.torch import save_model

    save_model(mapped, str(tmp_path / "saved.safetensors"))  # its tensors save as a loaded model's do (tied: once)
    assert mapped.num_parameters() == reference.num_parameters()
    ids = torch.tensor([[1, 504, 3000, 42, 77, 9000]])
    with torch.no_grad():
        assert torch.equal(reference(ids), mapped(ids))
    halved = transformer_from_llama_folder(folder, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in halved.parameters())
    assert torch.equal(halved.blocks[0].attn.qkv.weight, reference.blocks[0].attn.qkv.weight.bfloat16())


def test_the_folder_codec_encodes_and_decodes_as_transformers(smollm2_both):
    from incontext.interop.models import FolderCodec, HFCodec

    (_, tokenizer), folder = smollm2_both
    fast, full = FolderCodec(folder), HFCodec(tokenizer)
    for text in (TEXT, " leading space", "line\nbreaks\n\n", "<|im_start|>user\nHi<|im_end|>\n", "日本語 and emoji 🙂"):
        assert fast.encode(text) == full.encode(text), text
        assert fast.decode(fast.encode(text)) == full.decode(full.encode(text)), text
    assert fast.eos_token_id == full.eos_token_id
    messages = [{"role": "user", "content": "Hi"}]
    assert fast.chat(messages, add_generation_prompt=True) == full.chat(messages, add_generation_prompt=True)


def test_load_model_reads_the_cache_without_importing_transformers(smollm2_both, tmp_path):
    _, folder = smollm2_both
    script = textwrap.dedent("""
        import sys
        from incontext.interop.models import load_model
        loaded = load_model("smollm2")
        print(loaded.tokenizer.decode(loaded.tokenizer.encode("Hello there")), "transformers" in sys.modules)
    """)
    env = {**os.environ, "INCONTEXT_CACHE": str(folder.parent.parent), "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "Hello there False"
    assert run.stderr == ""  # no conversion note: the folder was read


@pytest.mark.slow
def test_the_converted_gemma3_has_the_gguf_tensors_logits_and_tokenizer(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from incontext.interop import pretrained
    from incontext.interop.models import FolderCodec, HFCodec, leading_bos

    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path))
    gguf_model, tokenizer = pretrained.load_gemma3_270m_gguf()
    cached = pretrained.quiet_folder_model(pretrained.gemma3_270m_folder(), torch.float32)
    theirs, mine = gguf_model.state_dict(), cached.state_dict()
    assert set(theirs) == set(mine)
    for name in theirs:
        assert torch.equal(theirs[name], mine[name]), name
    ids = torch.tensor([[2, 651, 6037, 529, 9079, 563]])
    with torch.no_grad():
        assert torch.equal(gguf_model(ids).logits, cached(ids).logits)
    fast, full = FolderCodec(pretrained.gemma3_270m_folder()), HFCodec(tokenizer)
    for text in (TEXT, " leading space", "line\nbreaks\n\n", "<start_of_turn>user\nHi<end_of_turn>\n"):
        assert fast.encode(text) == full.encode(text) and fast.decode(fast.encode(text)) == full.decode(full.encode(text))
    assert fast.eos_token_id == full.eos_token_id and fast.leading_bos() == leading_bos(tokenizer) == 2
