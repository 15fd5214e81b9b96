"""Fictional facts for absorbing a context: invented people with a birthplace, a job, a pet and a birth year.

A prompt states the facts of a few people (and one worked question/answer, so a small LM sees the answer
format); queries ask each other fact back ("Q: Where was X born?\\nA:" -> " Marrowick"). Nothing here can be
known without the prompt: people, places and pet names are built from syllables, and names that occur in
any other text of this project (the generated stories' characters) are rejected.

    people = make_people(3, random.Random(0))
    prompt, qa = facts_prompt(people, random.Random(1))   # text, [(question, answer), ...]
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .stories import HELDOUT_NAMES, TRAIN_NAMES
from .queries import plain_question

_ONSETS = ("b", "br", "c", "cr", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "st", "t",
           "tr", "v", "w", "z", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "th", "nd", "rk", "sk", "m", "x")
_PLACE_ENDINGS = ("wick", "haven", "mere", "ford", "holm", "stead", "bury", "vale", "moor", "port")

JOBS = ("glassblower", "beekeeper", "cartographer", "blacksmith", "baker", "fisherman", "carpenter", "tailor",
        "potter", "librarian", "gardener", "shepherd", "weaver", "brewer", "mason", "jeweller", "clockmaker",
        "sailor", "miller", "astronomer")
ANIMALS = ("ferret", "parrot", "tortoise", "goat", "rabbit", "cat", "dog", "hedgehog", "owl", "goose")
ATTRIBUTES = ("birthplace", "job", "pet", "year")
MAX_PEOPLE = 10_000  # distinct invented names and places for at most this many people per prompt
PARAPHRASES = 6  # forms of each question in other words (training queries; none is the evaluation question)
_RESERVED = frozenset(name.lower() for name in TRAIN_NAMES + HELDOUT_NAMES)  # names other tasks train on


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()


def invented_name(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    """A pronounceable invented word of 2-3 syllables that no other task of this project uses."""
    while True:
        word = _word(rng, rng.randint(*syllables))
        if word.lower() not in _RESERVED and 4 <= len(word) <= 12:
            return word


@dataclass(frozen=True)
class Person:
    first: str
    last: str
    birthplace: str
    job: str
    animal: str
    pet_name: str
    year: int

    @property
    def name(self) -> str:
        return f"{self.first} {self.last}"

    def statement(self, attribute: str) -> str:
        return {
            "birthplace": f"{self.name} was born in {self.birthplace}.",
            "job": f"{self.name} works as a {self.job}.",
            "pet": f"{self.name} has a pet {self.animal} named {self.pet_name}.",
            "year": f"{self.name} was born in the year {self.year}.",
        }[attribute]

    def question(self, attribute: str) -> tuple[str, str]:
        """(question text ending in "A:", answer with its leading space)."""
        question = {
            "birthplace": f"Where was {self.name} born?",
            "job": f"What is {self.name}'s job?",
            "pet": f"What is the name of {self.name}'s pet?",
            "year": f"In which year was {self.name} born?",
        }[attribute]
        answer = {"birthplace": self.birthplace, "job": self.job, "pet": self.pet_name, "year": str(self.year)}[attribute]
        return plain_question(question), f" {answer}"

    def paraphrase(self, attribute: str, form: int = 0) -> str:
        """The question in other words (a training query for distillation: never an evaluation question); `form`
        picks one of PARAPHRASES forms (0: the one the task has always given)."""
        if not 0 <= form < PARAPHRASES:
            raise ValueError(f"paraphrase form must be in [0, {PARAPHRASES}), got {form}")
        question = {
            # forms 3-5 came later than 0-2, so paraphrases=1..3 give the queries they always gave
            "birthplace": (f"What is the birthplace of {self.name}?", f"Which town was {self.name} born in?",
                           f"Name the place where {self.name} was born.", f"What town is {self.name} from?",
                           f"Tell me the town of {self.name}'s birth.", f"{self.name} came into the world in which town?"),
            "job": (f"What does {self.name} do for a living?", f"What is the occupation of {self.name}?",
                    f"What work does {self.name} do?", f"What is {self.name}'s profession?",
                    f"Tell me what {self.name} does for work.", f"Which trade does {self.name} practise?"),
            "pet": (f"What is {self.name}'s {self.animal} called?", f"What name does {self.name}'s pet have?",
                    f"How is the pet {self.animal} of {self.name} named?", f"What did {self.name} name their {self.animal}?",
                    f"Which name does {self.name}'s {self.animal} answer to?", f"Tell me what {self.name} calls their pet."),
            "year": (f"When was {self.name} born?", f"What is {self.name}'s year of birth?",
                     f"{self.name} was born in which year?", f"What is the birth year of {self.name}?",
                     f"Tell me the year {self.name} was born.", f"{self.name} came into the world in which year?"),
        }[attribute][form]
        return plain_question(question)

    def cloze(self, attribute: str) -> str:
        """The statement up to its answer (a training query for distillation: not an evaluation question)."""
        statement = self.statement(attribute)
        return statement[: statement.rindex(" " + self.question(attribute)[1].strip())]


def make_people(n: int, rng: random.Random) -> list[Person]:
    """n people with distinct names, places and pet names (so every question has one answer)."""
    if n < 1:
        raise ValueError(f"a facts prompt needs at least one person, got {n}")
    if n > MAX_PEOPLE:  # the invented places run out near 28,000; the prompt (~70 tokens a person) long before
        raise ValueError(f"a facts prompt holds at most {MAX_PEOPLE} people (about 70 tokens each), got {n}")
    people, used = [], set()

    def fresh(make) -> str:
        while True:
            value = make()
            if value not in used:
                used.add(value)
                return value

    jobs = rng.sample(JOBS, min(n, len(JOBS)))
    for i in range(n):
        first = fresh(lambda: invented_name(rng, (2, 2)))
        last = fresh(lambda: invented_name(rng, (2, 3)))
        place = fresh(lambda: _word(rng, 1) + rng.choice(_PLACE_ENDINGS))
        pet = fresh(lambda: invented_name(rng, (1, 2)))
        people.append(Person(first, last, place, jobs[i % len(jobs)], rng.choice(ANIMALS), pet, rng.randint(1800, 1999)))
    return people


def facts_prompt(people: list[Person], rng: random.Random, attributes: tuple[str, ...] = ATTRIBUTES
                 ) -> tuple[str, list[tuple[Person, str]], tuple[Person, str]]:
    """(prompt text, the (person, attribute) pairs to ask, the pair the prompt's worked example answers).

    The prompt lists every fact, one per line, people in order and their facts shuffled, then one worked
    question and answer; that fact is not asked again."""
    for attribute in attributes:
        if attribute not in ATTRIBUTES:
            raise ValueError(f"unknown fact attribute {attribute!r}; known: {', '.join(ATTRIBUTES)}")
    lines = []
    for person in people:
        order = list(attributes)
        rng.shuffle(order)
        lines += [person.statement(a) for a in order]
    pairs = [(person, a) for person in people for a in attributes]
    example = pairs.pop(rng.randrange(len(pairs)))
    question, answer = example[0].question(example[1])
    text = "\n".join(lines) + f"\n\n{question}{answer}\n\n"
    return text, pairs, example
