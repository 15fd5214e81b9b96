import re

import pytest
import torch

from incontext.tasks import Stories, StoriesConfig, get_task, list_tasks
from incontext.tasks.stories import (
    GIVE_VERBS,
    HELDOUT_NAMES,
    OBJECTS,
    OPENERS,
    PETS,
    TRAIN_NAMES,
    heldout_stories,
    ioi_sentence,
    pet_name,
    split_stories,
    tokenizer_folder,
)
from incontext.tasks.text import ENDOFTEXT, ENDOFTEXT_ID

pytest.importorskip("tokenizers")

N_TRAIN = 1500  # small corpus: the tokenizer trains in well under a second
VOCAB = 320

_OBJ = "|".join(re.escape(o) for o in OBJECTS)
WENT_TO = re.compile(rf"({'|'.join(OPENERS)}) (\w+) and (\w+) went to the (\w+), (\w+) ({'|'.join(GIVE_VERBS)}) ({_OBJ}) to (\w+)\.")
PLAYING = re.compile(rf"When (\w+) and (\w+) were playing with ({_OBJ}), (\w+) ({'|'.join(GIVE_VERBS)}) it to (\w+)\.")
PET = re.compile(rf"had an? (?:{'|'.join(PETS)}) named (\w+)\.")


def names_in(text: str, names) -> set[str]:
    """The names of `names` that occur in `text` as whole words."""
    return set(re.findall(r"[A-Z][a-z]+", text)) & set(names)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return StoriesConfig(vocab_size=VOCAB, seq_len=64, train_stories=N_TRAIN, validation_stories=200,
                         tokenizer_dir=str(tmp_path_factory.mktemp("stories-tok")))


@pytest.fixture(scope="module")
def task(config):
    return Stories(config)


@pytest.mark.parametrize("overrides, field", [
    ({"vocab_size": 256}, "vocab_size"), ({"vocab_size": 512.0}, "vocab_size"), ({"seq_len": 0}, "seq_len"),
    ({"train_stories": -1}, "train_stories"), ({"validation_stories": True}, "validation_stories"),
    ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"), ({"tokenizer_dir": 3}, "tokenizer_dir"),
])
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        StoriesConfig(**overrides)


def test_registered_and_unknown_split_rejected():
    assert "stories" in list_tasks()
    with pytest.raises(ValueError, match="split"):
        split_stories(0, "test", 3)


def test_corpus_is_determined_by_the_seed():
    a = split_stories(0, "train", 300)
    assert split_stories.__wrapped__(0, "train", 300) == a  # regenerated, not the cached tuple
    assert split_stories.__wrapped__(1, "train", 300) != a
    assert split_stories(0, "train", 100) == a[:100]  # more stories only append
    assert split_stories(0, "validation", 100) != a[:100]
    assert heldout_stories(20, seed=3) == heldout_stories(20, seed=3) != heldout_stories(20, seed=4)


def test_heldout_names_never_in_training_or_validation_text():
    assert not set(HELDOUT_NAMES) & set(TRAIN_NAMES)
    for split in ("train", "validation"):
        text = " ".join(split_stories(0, split, 3000))
        assert names_in(text, HELDOUT_NAMES) == set()
        assert all(re.search(rf"\b{name}\b", text) is None for name in HELDOUT_NAMES)
        assert len(names_in(text, TRAIN_NAMES)) == len(TRAIN_NAMES)  # and every training name is used
    held_out_text = " ".join(heldout_stories(300))
    assert names_in(held_out_text, TRAIN_NAMES) == set() and len(names_in(held_out_text, HELDOUT_NAMES)) > 10


def test_pet_names_are_never_person_names():
    import random

    rng = random.Random(0)
    names = {pet_name(rng) for _ in range(20000)}
    assert not names & (set(TRAIN_NAMES) | set(HELDOUT_NAMES))
    assert all(re.fullmatch(r"[A-Z][a-z]{3,5}", n) for n in names)


@pytest.mark.parametrize("seed", range(5))
def test_ioi_sentence_subject_gives_to_the_other_name(seed):
    import random

    rng = random.Random(seed)
    for _ in range(200):
        s, io = rng.sample(TRAIN_NAMES, 2)
        sentence = ioi_sentence(rng, s, io)
        match = WENT_TO.fullmatch(sentence)
        if match:
            first, second, subject, receiver = match[2], match[3], match[5], match[8]
        else:
            match = PLAYING.fullmatch(sentence)
            assert match, sentence
            first, second, subject, receiver = match[1], match[2], match[4], match[6]
        assert {first, second} == {s, io} and (subject, receiver) == (s, io)


def test_stories_are_full_of_ioi_sentences_and_reused_names():
    stories = split_stories(0, "train", 2000)
    with_ioi = with_pet = named_again = 0
    for story in stories:
        ioi = [m for m in WENT_TO.finditer(story)] + [m for m in PLAYING.finditer(story)]
        with_ioi += bool(ioi)
        for m in WENT_TO.finditer(story):
            assert m[5] in (m[2], m[3]) and m[8] in (m[2], m[3]) and m[5] != m[8]
        for pet in PET.findall(story):
            with_pet += 1
            assert story.count(pet) >= 3  # introduced, then named again
        people = set(re.findall(r"\b[A-Z][a-z]+\b", story)) & set(TRAIN_NAMES)
        assert 1 <= len(people) <= 3
        named_again += all(story.count(p) >= 2 for p in people)
    assert with_ioi > 0.5 * len(stories) and with_pet > 0.1 * len(stories)
    assert named_again > 0.8 * len(stories)  # in most stories every character is named at least twice


def test_tokenizer_round_trip_and_cache(task, config):
    tok = task.tokenizer
    assert tok.get_vocab_size() == VOCAB and tok.token_to_id(ENDOFTEXT) == ENDOFTEXT_ID
    for text in list(split_stories(0, "train", 50)) + heldout_stories(50) + ['Mila said, "Thank you, Zara!"']:
        assert task.decode(task.encode(text)) == text
    assert (tokenizer_folder(config) / "tokenizer.json").is_file()
    again = Stories(config).tokenizer  # read back from the cache
    assert again.to_str() == tok.to_str()
    with pytest.raises(ValueError, match="vocab_size"):
        _ = Stories(StoriesConfig(vocab_size=VOCAB + 10, train_stories=N_TRAIN, tokenizer_dir=config.tokenizer_dir)).tokenizer


def test_streams_and_batches(task, config):
    stream = task.tokens("train")
    assert stream[0] == ENDOFTEXT_ID and int((stream == ENDOFTEXT_ID).sum()) == N_TRAIN
    assert task.decode(stream[: 200]).startswith(ENDOFTEXT + split_stories(0, "train", 1)[0])
    batch = task.sample(8, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == batch.targets.shape == (8, 64) and batch.mask.all()
    starts = batch.info["start"]
    for row in range(8):
        window = stream[starts[row] : starts[row] + 65]
        assert torch.equal(batch.inputs[row], window[:-1]) and torch.equal(batch.targets[row], window[1:])
    again = task.sample(8, torch.Generator().manual_seed(0))
    assert torch.equal(again.inputs, batch.inputs)
    validation = task.sample_validation(8, torch.Generator().manual_seed(0))
    assert not torch.equal(validation.inputs, batch.inputs)
    uniform = torch.zeros(8, 64, VOCAB)
    metrics = task.evaluate(uniform, batch)
    assert metrics["loss"] == pytest.approx(torch.log(torch.tensor(float(VOCAB))).item(), rel=1e-6)


def test_get_task_with_overrides_gives_model_io(config):
    task = get_task("stories", vocab_size=VOCAB, train_stories=N_TRAIN, tokenizer_dir=config.tokenizer_dir)
    assert task.model_io() == {"vocab_size": VOCAB} and task.sequence_length == 64
