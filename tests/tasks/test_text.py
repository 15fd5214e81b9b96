import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from incontext.tasks import Shakespeare, ShakespeareConfig, get_task, list_tasks
from incontext.tasks import text
from incontext.tasks.text import ENDOFTEXT, ENDOFTEXT_ID, edition_plays, split_plays, tokenizer_folder

VOCAB = 300  # small: trains in about a second
SEQ_LEN = 64


def require(load):
    """The corpus / tokenizers may be absent locally (skip), never on CI (fail)."""
    try:
        return load()
    except (FileNotFoundError, ImportError) as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def plays():
    require(lambda: __import__("tokenizers"))
    return require(text.shakespeare_plays)


@pytest.fixture(scope="module")
def config(plays, tmp_path_factory):
    return ShakespeareConfig(vocab_size=VOCAB, seq_len=SEQ_LEN, tokenizer_dir=str(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def task(config):
    task = Shakespeare(config)
    task.train_tokens  # trains the tokenizer and encodes the streams once for the module
    return task


# Config and split (no corpus needed)


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_size": 256}, "vocab_size"),  # below 256 bytes + <|endoftext|>
        ({"vocab_size": 512.0}, "vocab_size"),
        ({"seq_len": 0}, "seq_len"),
        ({"seq_len": True}, "seq_len"),
        ({"validation_plays": 0}, "validation_plays"),
        ({"validation_plays": -2}, "validation_plays"),
        ({"tokenizer_dir": 3}, "tokenizer_dir"),
        ({"edition": "quarto"}, "edition"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"ShakespeareConfig.{field}"):
        ShakespeareConfig(**overrides)
    with pytest.raises(ValueError, match=f"ShakespeareConfig.{field}"):
        get_task("shakespeare", **overrides)


def test_unknown_edition_lists_the_editions():
    with pytest.raises(ValueError) as excinfo:
        ShakespeareConfig(edition="First Folio")
    message = str(excinfo.value)
    assert "'First Folio'" in message and all(f"'{e}'" in message for e in ("modern", "folio", "all"))
    with pytest.raises(ValueError, match="unknown edition 'quarto'"):
        edition_plays("quarto", {"hamlet_gut": "x"})


def test_registered_and_config_accepts_paths(tmp_path):
    assert "shakespeare" in list_tasks()
    task = get_task("shakespeare", seq_len=32, tokenizer_dir=tmp_path)  # nothing loaded yet
    assert isinstance(task.config, ShakespeareConfig) and task.config.tokenizer_dir == str(tmp_path)
    assert task.sequence_length == 32 and task.name == "shakespeare"


FAKE = {name: name.upper() for name in ["b_gut", "a_gut_f", "d_gut", "c_gut", "b_gut_f", "e_gut", "c_gut_f"]}


def test_editions_and_split_by_sorted_play_name():
    assert list(edition_plays("modern", FAKE)) == ["b_gut", "c_gut", "d_gut", "e_gut"]
    assert list(edition_plays("folio", FAKE)) == ["a_gut_f", "b_gut_f", "c_gut_f"]
    assert list(edition_plays("all", FAKE)) == sorted(FAKE)
    assert split_plays(ShakespeareConfig(validation_plays=1), FAKE) == (["b_gut", "c_gut", "d_gut"], ["e_gut"])
    assert split_plays(ShakespeareConfig(validation_plays=2, edition="folio"), FAKE) == (
        ["a_gut_f"],
        ["b_gut_f", "c_gut_f"],
    )
    assert split_plays(ShakespeareConfig(validation_plays=3, edition="all"), FAKE)[1] == ["c_gut_f", "d_gut", "e_gut"]
    with pytest.raises(ValueError, match="validation_plays=4 leaves no training play"):
        split_plays(ShakespeareConfig(validation_plays=4), FAKE)


def test_default_tokenizer_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("INCONTEXT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = ShakespeareConfig(vocab_size=1024, validation_plays=3, edition="folio")
    expected = tmp_path / "home" / ".cache" / "incontext" / "tokenizers" / "shakespeare-folio-v1024-h3"
    assert tokenizer_folder(config) == expected
    monkeypatch.setenv("INCONTEXT_CACHE", str(tmp_path / "cache"))
    assert tokenizer_folder(config) == tmp_path / "cache" / "tokenizers" / "shakespeare-folio-v1024-h3"
    assert tokenizer_folder(ShakespeareConfig(tokenizer_dir=str(tmp_path / "mine"))) == tmp_path / "mine"


# Tokenizer


def test_tokenizer_round_trip_and_special_token(task):
    assert task.tokenizer.get_vocab_size() == VOCAB and task.model_io() == {"vocab_size": VOCAB}
    assert task.tokenizer.token_to_id(ENDOFTEXT) == ENDOFTEXT_ID == 0
    for line in [
        "To be, or not to be, that is the question:\n",
        "  O Romeo, Romeo! wherefore art thou Romeo?\n\n\tDeny thy father — and refuse thy name; ’tis “so” ✓",
    ]:
        ids = task.encode(line)
        assert ENDOFTEXT_ID not in ids and all(0 <= i < VOCAB for i in ids)
        assert task.decode(ids) == line
        assert task.decode(torch.tensor(ids)) == line
    assert len(task.encode("the king")) < len("the king")  # merges were learned


def test_tokenizer_training_is_deterministic_and_sees_training_plays_only(task, config, plays, tmp_path, monkeypatch):
    seen = []
    original = text.train_tokenizer

    def recording(texts, vocab_size):
        seen.append((list(texts), vocab_size))
        return original(texts, vocab_size)

    monkeypatch.setattr(text, "train_tokenizer", recording)
    retrained = text.load_tokenizer(ShakespeareConfig(vocab_size=VOCAB, tokenizer_dir=str(tmp_path)))
    train_names, validation_names = split_plays(config, plays)
    assert len(seen) == 1 and seen[0][1] == VOCAB
    assert seen[0][0] == [plays[name] for name in train_names]
    assert retrained.get_vocab() == task.tokenizer.get_vocab()
    first = json.loads((Path(config.tokenizer_dir) / "tokenizer.json").read_text())["model"]
    second = json.loads((tmp_path / "tokenizer.json").read_text())["model"]
    assert first["vocab"] == second["vocab"] and first["merges"] == second["merges"]


def test_second_load_reads_the_cache(task, config, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("trained or encoded again instead of reading the cache")

    monkeypatch.setattr(text, "train_tokenizer", refuse)
    monkeypatch.setattr(text, "encode_plays", refuse)
    again = Shakespeare(ShakespeareConfig(vocab_size=VOCAB, seq_len=SEQ_LEN, tokenizer_dir=config.tokenizer_dir))
    assert again.tokenizer.to_str() == task.tokenizer.to_str()
    assert torch.equal(again.train_tokens, task.train_tokens)
    assert torch.equal(again.validation_tokens, task.validation_tokens)
    assert again.train_tokens.dtype == torch.int64
    # The patch bites: an empty folder has nothing to read.
    with pytest.raises(AssertionError, match="instead of reading the cache"):
        text.load_tokenizer(ShakespeareConfig(vocab_size=VOCAB, tokenizer_dir=str(tmp_path)))
    # A cached tokenizer of another size is refused, not silently used.
    with pytest.raises(ValueError, match="vocab_size=512"):
        text.load_tokenizer(ShakespeareConfig(vocab_size=512, tokenizer_dir=config.tokenizer_dir))
    cached = sorted(Path(config.tokenizer_dir).glob("tokens-*.npy"))
    assert [p.name.split("-")[1] for p in cached] == ["train", "validation"]
    assert np.load(cached[0], allow_pickle=False).shape == task.train_tokens.shape


# Streams and split


def test_streams_are_the_split_plays_joined_by_endoftext(task, config, plays):
    train_names, validation_names = split_plays(config, plays)
    assert validation_names == ["troilus_and_cressida_gut", "twelfth_night_gut", "two_gentlemen_of_verona_gut", "winters_tale_gut"]
    assert not any(name.endswith("_f") for name in train_names) and len(train_names) > 30
    for stream, names in ((task.train_tokens, train_names), (task.validation_tokens, validation_names)):
        assert stream.ndim == 1 and stream.dtype == torch.int64
        assert int((stream == ENDOFTEXT_ID).sum()) == len(names) - 1
        assert task.decode(stream) == ENDOFTEXT.join(plays[name] for name in names)


def test_validation_windows_come_from_validation_plays_only(task, config, plays):
    train_names, validation_names = split_plays(config, plays)
    train_text = [plays[name] for name in train_names]
    validation_text = [plays[name] for name in validation_names]
    long = Shakespeare(ShakespeareConfig(vocab_size=VOCAB, seq_len=256, tokenizer_dir=config.tokenizer_dir))
    windows = long.validation_windows(8, torch.Generator().manual_seed(0))
    assert windows.shape == (8, 257) and windows.dtype == torch.int64
    for window in windows:
        piece = max(task.decode(window).split(ENDOFTEXT), key=len)  # the window within one play
        assert len(piece) >= 200
        assert any(piece in play for play in validation_text)
        assert not any(piece in play for play in train_text)


# Batches


@pytest.mark.parametrize("split", ["train", "validation"])
def test_batches_are_stream_windows_with_next_token_targets(task, split):
    sample = task.sample if split == "train" else task.sample_validation
    stream = task.train_tokens if split == "train" else task.validation_tokens
    batch = sample(16, torch.Generator().manual_seed(1))
    assert batch.inputs.shape == batch.targets.shape == batch.mask.shape == (16, SEQ_LEN)
    assert batch.inputs.dtype == batch.targets.dtype == torch.int64 and batch.mask.dtype == torch.bool
    assert batch.mask.all() and (batch.targets >= 0).all()
    assert torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
    starts = batch.info["start"]
    assert set(batch.info) == {"start"} and starts.shape == (16,) and starts.dtype == torch.int64
    assert (starts >= 0).all() and (starts <= len(stream) - SEQ_LEN - 1).all()
    for row, start in enumerate(starts.tolist()):
        assert torch.equal(batch.inputs[row], stream[start : start + SEQ_LEN])
        assert torch.equal(batch.targets[row], stream[start + 1 : start + SEQ_LEN + 1])


def test_seeds_reproduce_and_differ(task):
    def draw(seed, method=task.sample):
        return method(8, torch.Generator().manual_seed(seed))

    a, b, c = draw(0), draw(0), draw(1)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.info["start"], b.info["start"])
    assert not torch.equal(a.info["start"], c.info["start"])
    assert torch.equal(draw(3, task.sample_validation).inputs, draw(3, task.sample_validation).inputs)
    assert not torch.equal(draw(3, task.sample_validation).inputs, draw(4, task.sample_validation).inputs)
    v1 = task.validation_windows(4, torch.Generator().manual_seed(5))
    assert torch.equal(v1, task.validation_windows(4, torch.Generator().manual_seed(5)))


def test_stream_shorter_than_a_window_is_an_error(task, config):
    too_long = Shakespeare(ShakespeareConfig(vocab_size=VOCAB, seq_len=10**7, tokenizer_dir=config.tokenizer_dir))
    with pytest.raises(ValueError, match="seq_len"):
        too_long.sample(1, torch.Generator().manual_seed(0))


# Loss and metrics


def test_loss_and_evaluate(task):
    batch = task.sample(4, torch.Generator().manual_seed(2))
    uniform = torch.zeros(4, SEQ_LEN, VOCAB)
    metrics = task.evaluate(uniform, batch)
    assert set(metrics) == {"loss", "perplexity"} and all(isinstance(v, float) for v in metrics.values())
    assert metrics["loss"] == pytest.approx(math.log(VOCAB), rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(VOCAB, rel=1e-4)

    confident = torch.nn.functional.one_hot(batch.targets, VOCAB).float() * 50
    assert task.evaluate(confident, batch)["loss"] < 1e-6
    assert task.evaluate(confident, batch)["perplexity"] == pytest.approx(1.0)
    assert task.loss(confident.bfloat16(), batch).dtype == torch.float32

    # Only masked positions count: wrong logits outside the mask change nothing.
    wrong = confident.clone()
    wrong[:, : SEQ_LEN // 2] = torch.nn.functional.one_hot((batch.targets[:, : SEQ_LEN // 2] + 1) % VOCAB, VOCAB) * 50.0
    batch.mask[:, : SEQ_LEN // 2] = False
    assert task.loss(wrong, batch).item() < 1e-6
    batch.mask[:] = True
    assert task.loss(wrong, batch).item() > 10
