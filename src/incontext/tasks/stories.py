"""A procedurally generated corpus of simple children's stories, an offline stand-in for TinyStories.

Burns et al. (sec. 4) train small language models on TinyStories and probe in-context learning with
indirect object identification (IOI): "When John and Mary went to the shops, John gave the bag to" -> " Mary".
TinyStories is not available offline, so this module writes stories from templates, seeded, with many IOI
sentences ("When X and Y went to the P, X gave the O to Y.") and variants, and other sentences that name the
characters again ("Y said, "Thank you, X!"", pets with invented names that come back later), so that copying
a name from the context pays off.

Names: the characters of training and validation stories come from `TRAIN_NAMES` (the paper's eight IOI
names among them); `HELDOUT_NAMES` never occur in training or validation text and are kept for evaluation
(`heldout_stories`, and the IOI prompts of `incontext.experiments.residual_lm`). Pets get invented
consonant-vowel names ("Bimo", "Tuka"), fresh per story and never equal to a person's name; held-out names
have the same shape, so copying one is a skill the training text teaches without ever showing the name.

    task = get_task("stories", vocab_size=1024, seq_len=64)
    batch = task.sample(32, torch.Generator().manual_seed(0))           # TRAINING windows
    held_out = task.sample_validation(32, torch.Generator().manual_seed(0))

Each split is one token stream: every story preceded by <|endoftext|> (id 0). The byte-level BPE tokenizer
(`text.train_tokenizer`) is trained on the training stories only and cached as tokenizer.json in
<cache_root>/tokenizers/stories-..., keyed by a hash of the training text (so a change of templates or
sizes trains a new one).
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .base import check_positive_int
from .registry import register_task
from .text import (
    TokenStreamTask,
    ENDOFTEXT,
    ENDOFTEXT_ID,
    N_BYTES,
    cache_root,
    cached_tokenizer,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# The paper's IOI names (John, Mary, Tom, James, Dan, Emily, Sam, Amy) are ordinary training names, as they
# are in TinyStories.
TRAIN_NAMES = (
    "John", "Mary", "Tom", "James", "Dan", "Emily", "Sam", "Amy", "Lily", "Ben", "Anna", "Max", "Lucy", "Jack",
    "Sue", "Tim", "Kate", "Bob", "Sara", "Joe", "Jane", "Mark", "Ella", "Leo", "Mia", "Jake", "Rose", "Adam",
    "Grace", "Paul", "Ruby", "Peter", "Alice", "Luke", "Chloe", "Ryan", "Emma", "Noah", "Olivia", "Liam", "Sophie",
    "Henry", "Ava", "Oscar", "Ivy", "Harry", "Daisy", "Alex", "Molly", "Charlie", "Zoe", "Finn", "Holly", "Jacob",
    "Ellie", "Sophia", "David", "Laura", "Mike", "Julia", "Nick", "Hannah", "Eric", "Clara", "Fred", "Nora",
    "George", "Lisa", "Kevin", "Amber", "Simon", "Betty", "Carl", "Fiona", "Frank", "Heidi", "Steve", "Megan",
    "Andy", "Poppy", "Bill", "Jenny", "Owen", "Maya", "Jim", "Wendy", "Ted", "Kim", "Roy", "Tina", "Ned", "Pam",
)
# Held out: never in training or validation text. Most are consonant-vowel names like the invented pet names.
HELDOUT_NAMES = (
    "Nina", "Mila", "Tara", "Kira", "Dina", "Niko", "Milo", "Rosa", "Lena", "Ravi", "Kofi", "Hugo", "Nuri", "Omar",
    "Lina", "Kemi", "Zara", "Aria", "Mira", "Bela",
)
PLACES = ("park", "shops", "beach", "zoo", "school", "farm", "forest", "lake", "market", "garden", "library",
          "river", "playground", "pond", "hill", "store")
OBJECTS = ("the bag", "the ball", "an apple", "a drink", "the book", "a flower", "the kite", "a cookie", "the toy",
           "a hat", "the box", "a cake", "the key", "a shell", "a stick", "an egg", "the doll", "a cup", "a pear",
           "the map")
GIVE_VERBS = ("gave", "handed", "passed", "threw", "showed", "brought")
OPENERS = ("When", "After", "Once")
PETS = ("dog", "cat", "bird", "frog", "bunny", "puppy", "duck", "fish")
PET_ACTS = ("run", "jump", "swim", "sleep", "play", "sing", "dig", "hide")
FEELINGS = ("happy", "sad", "tired", "excited", "hungry", "scared", "proud")
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_ALL_NAMES = frozenset(TRAIN_NAMES) | frozenset(HELDOUT_NAMES)
SPLITS = ("train", "validation")


@dataclass
class StoriesConfig:
    vocab_size: int = 1024  # BPE vocabulary, <|endoftext|> and the 256 byte tokens included
    seq_len: int = 64  # tokens per sequence (windows hold seq_len + 1 tokens)
    train_stories: int = 50000
    validation_stories: int = 1000
    seed: int = 0  # the corpus seed (training and validation stories, hence the tokenizer)
    tokenizer_dir: str = ""  # where tokenizer.json is cached; "" -> <cache_root>/tokenizers/stories-...

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "train_stories", "validation_stories"):
            check_positive_int(self, name)
        if self.vocab_size < N_BYTES + 1:
            raise ValueError(
                f"StoriesConfig.vocab_size must be >= {N_BYTES + 1} (256 byte tokens and {ENDOFTEXT}), got {self.vocab_size}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"StoriesConfig.seed must be an integer >= 0, got {self.seed!r}")
        if isinstance(self.tokenizer_dir, os.PathLike):
            self.tokenizer_dir = os.fspath(self.tokenizer_dir)
        if not isinstance(self.tokenizer_dir, str):
            raise ValueError(f"StoriesConfig.tokenizer_dir must be a path string ('' for the default cache), got {self.tokenizer_dir!r}")  # noqa: TRY004 (config errors are ValueErrors here)


# Story writing


def pet_name(rng: random.Random) -> str:
    """An invented name of two or three consonant-vowel syllables that is no person's name (held out or not)."""
    while True:
        syllables = [rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.choice((2, 2, 3)))]
        name = "".join(syllables).capitalize()
        if name not in _ALL_NAMES:
            return name


def ioi_sentence(rng: random.Random, subject: str, indirect_object: str) -> str:
    """One IOI sentence: both names in the opening clause (random order), then `subject` gives something to
    `indirect_object`. The two shapes differ in how the object is introduced."""
    first, second = (subject, indirect_object) if rng.random() < 0.5 else (indirect_object, subject)
    obj, verb = rng.choice(OBJECTS), rng.choice(GIVE_VERBS)
    if rng.random() < 0.75:
        return f"{rng.choice(OPENERS)} {first} and {second} went to the {rng.choice(PLACES)}, {subject} {verb} {obj} to {indirect_object}."
    return f"When {first} and {second} were playing with {obj}, {subject} {verb} it to {indirect_object}."


def _event(rng: random.Random, a: str, b: str, others: list[str]) -> list[str]:
    """A few sentences about the characters; most name them again."""
    kind = rng.random()
    giver, taker = (a, b) if rng.random() < 0.5 else (b, a)
    if kind < 0.45:
        sentences = [ioi_sentence(rng, giver, taker)]
        if rng.random() < 0.5:
            sentences.append(rng.choice((f'{taker} said, "Thank you, {giver}!"', f"{taker} smiled at {giver}.",
                                         f"{taker} was very {rng.choice(FEELINGS)}.")))
        return sentences
    if kind < 0.6:
        place = rng.choice(PLACES)
        return [f'{giver} said to {taker}, "Let\'s go to the {place}!"', f'{taker} said, "Yes, {giver}!"']
    if kind < 0.75:
        owner, pet = rng.choice((a, b)), pet_name(rng)
        return [f"{owner} had a {rng.choice(PETS)} named {pet}.", f"{pet} liked to {rng.choice(PET_ACTS)}.",
                f"{owner} and {pet} played in the {rng.choice(PLACES)}."]
    if kind < 0.85 and others:
        friend = rng.choice(others)
        return [f"Then {friend} came to play with {giver}.", f"{friend} {rng.choice(GIVE_VERBS)} {rng.choice(OBJECTS)} to {taker}."]
    return [f"{giver} was {rng.choice(FEELINGS)}.", f"{taker} hugged {giver}.", f"{giver} smiled at {taker}."]


def write_story(rng: random.Random, names: tuple[str, ...] | list[str], events: int | None = None) -> str:
    """One story about two (sometimes three) characters drawn from `names`: an optional opening, `events`
    events (1-3 when None) and an ending."""
    cast = rng.sample(list(names), 3)
    a, b, others = cast[0], cast[1], cast[2:] if rng.random() < 0.3 else []
    intros = [
        f"Once upon a time, there were two friends, {a} and {b}.",
        f"{a} and {b} were best friends.",
        f"{a} had a friend named {b}.",
        f"One day, {a} met {b} at the {rng.choice(PLACES)}.",
    ]
    sentences = [rng.choice(intros)] if rng.random() < 0.7 else []
    for _ in range(rng.randint(1, 3) if events is None else events):
        sentences += _event(rng, a, b, others)
    sentences.append(rng.choice((f"{a} and {b} went home.", f"{a} and {b} were very happy.", "The end.",
                                 f"{b} and {a} played until dark.")))
    return " ".join(sentences)


@functools.lru_cache(maxsize=8)
def split_stories(seed: int, split: str, n: int) -> tuple[str, ...]:
    """The `n` stories of a split ("train" or "validation"): training names only, one generator per
    (seed, split), so the validation stories do not depend on how many training stories there are."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    rng = random.Random(f"stories/{seed}/{split}")
    return tuple(write_story(rng, TRAIN_NAMES) for _ in range(n))


def heldout_stories(n: int, seed: int = 0, events: int | None = None) -> list[str]:
    """`n` stories whose characters are all HELDOUT names (never in training or validation text)."""
    rng = random.Random(f"stories/{seed}/heldout")
    return [write_story(rng, HELDOUT_NAMES, events) for _ in range(n)]


# IOI prompts (indirect object identification, Wang et al. 2022): "... A and B went to the P, S gave O to"


# (prompt with {s} = subject, first name, second name); Burns et al.'s four sentences, asked in both orders
PAPER_IOI_PROMPTS = (
    ("When John and Mary went to the shops, {s} gave the bag to", "John", "Mary"),
    ("When Tom and James went to the park, {s} gave the ball to", "Tom", "James"),
    ("When Dan and Emily went to the shops, {s} gave an apple to", "Dan", "Emily"),
    ("After Sam and Amy went to the park, {s} gave a drink to", "Sam", "Amy"),
)


@dataclass
class IOIPrompt:
    text: str  # ends before the answer, e.g. "When John and Mary went to the shops, John gave the bag to"
    correct: str  # the indirect object
    incorrect: str  # the subject
    group: str  # e.g. "paper 1", "train names", "held-out names"


def paper_ioi_prompts() -> list[IOIPrompt]:
    """The paper's four IOI sentences, each with either name as the subject (8 prompts)."""
    prompts = []
    for i, (template, first, second) in enumerate(PAPER_IOI_PROMPTS, 1):
        for subject, indirect in ((first, second), (second, first)):
            prompts.append(IOIPrompt(template.format(s=subject), indirect, subject, f"paper {i}"))
    return prompts


def sampled_ioi_prompts(names: tuple[str, ...] | list[str], pairs: int, seed: int, group: str) -> list[IOIPrompt]:
    """`pairs` random name pairs in random IOI sentences ("<Opener> A and B went to the P, S <verb> O to"),
    each pair asked with either name as the subject."""
    rng = random.Random(f"ioi/{seed}/{group}")
    prompts = []
    for _ in range(pairs):
        a, b = rng.sample(list(names), 2)
        opener, place, verb, obj = rng.choice(OPENERS), rng.choice(PLACES), rng.choice(GIVE_VERBS), rng.choice(OBJECTS)
        for subject, indirect in ((a, b), (b, a)):
            text = f"{opener} {a} and {b} went to the {place}, {subject} {verb} {obj} to"
            prompts.append(IOIPrompt(text, indirect, subject, group))
    return prompts


def ioi_prompts(pairs: int, seed: int, paper: bool = True) -> list[IOIPrompt]:
    """The IOI probe set: the paper's prompts (if `paper`), then `pairs` sampled pairs of training names
    ("train names") and of held-out names ("held-out names")."""
    return ((paper_ioi_prompts() if paper else []) + sampled_ioi_prompts(TRAIN_NAMES, pairs, seed, "train names")
            + sampled_ioi_prompts(HELDOUT_NAMES, pairs, seed, "held-out names"))


# Tokenizer and streams


def _training_digest(config: StoriesConfig) -> str:
    digest = hashlib.sha256()
    for story in split_stories(config.seed, "train", config.train_stories):
        digest.update(story.encode("utf-8") + b"\0")
    return digest.hexdigest()[:12]


def tokenizer_folder(config: StoriesConfig) -> Path:
    """`config.tokenizer_dir` if given, else <cache_root>/tokenizers/stories-v<vocab>-<hash of the training text>."""
    if config.tokenizer_dir:
        return Path(config.tokenizer_dir).expanduser()
    return cache_root() / "tokenizers" / f"stories-v{config.vocab_size}-{_training_digest(config)}"


def load_tokenizer(config: StoriesConfig) -> Tokenizer:
    """The tokenizer trained on the training stories (cached in tokenizer_folder)."""
    return cached_tokenizer(tokenizer_folder(config), lambda: list(split_stories(config.seed, "train", config.train_stories)),
                            config.vocab_size, "StoriesConfig")


def encode_stories(tokenizer: Tokenizer, stories: list[str] | tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """(stream, starts): the stories as one 1-D int64 stream, each preceded by <|endoftext|>, and the offset of
    each story's <|endoftext|> in it."""
    encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    pieces: list[int] = []
    starts: list[int] = []
    for encoding in encode_batch(list(stories), add_special_tokens=False):
        starts.append(len(pieces))
        pieces.append(ENDOFTEXT_ID)
        pieces.extend(encoding.ids)
    return torch.tensor(pieces, dtype=torch.int64), torch.tensor(starts, dtype=torch.int64)


@register_task("stories")
class Stories(TokenStreamTask):
    """Next-token prediction on windows of procedurally generated children's stories.

    `sample` draws TRAINING windows; `sample_validation` held-out stories with the same names (the validation
    loss); `heldout_stories` text with names never seen in training (for in-context probes). Each split's
    stream is encoded on first use.
    """

    config_class = StoriesConfig
    config: StoriesConfig

    def __init__(self, config: StoriesConfig | None = None):
        super().__init__(config)
        self._split_streams: dict[str, torch.Tensor] = {}

    def load_tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.config)

    def load_streams(self) -> dict[str, torch.Tensor]:
        return {split: self.tokens(split) for split in ("train", "validation")}

    def stories(self, split: str) -> tuple[str, ...]:
        n = self.config.train_stories if split == "train" else self.config.validation_stories
        return split_stories(self.config.seed, split, n)

    def tokens(self, split: str) -> torch.Tensor:
        """The split's token stream, 1-D int64 (CPU)."""
        if split not in self._split_streams:
            stream, _ = encode_stories(self.tokenizer, self.stories(split))
            if len(stream) < self.config.seq_len + 1:
                raise ValueError(f"the {split} stream has {len(stream)} tokens, fewer than StoriesConfig.seq_len + 1 = "
                                 f"{self.config.seq_len + 1}: write more stories")
            self._split_streams[split] = stream
        return self._split_streams[split]
