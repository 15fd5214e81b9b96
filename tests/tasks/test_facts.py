import random
import re

import pytest
import torch

from conftest import ByteCodec
from incontext.tasks.episodes import get_episode_source
from incontext.tasks.facts import ATTRIBUTES, facts_prompt, make_people
from incontext.tasks.stories import HELDOUT_NAMES, TRAIN_NAMES


STATEMENT = re.compile(r"^(?P<name>\w+ \w+) (?:was born in (?:the year (?P<year>\d+)|(?P<place>\w+))|works as a (?P<job>\w+)"
                       r"|has a pet \w+ named (?P<pet>\w+))\.$")
QUESTION = {
    "birthplace": re.compile(r"^Q: Where was (\w+ \w+) born\?\nA:$"),
    "job": re.compile(r"^Q: What is (\w+ \w+)'s job\?\nA:$"),
    "pet": re.compile(r"^Q: What is the name of (\w+ \w+)'s pet\?\nA:$"),
    "year": re.compile(r"^Q: In which year was (\w+ \w+) born\?\nA:$"),
}


def facts_from_text(prompt: str) -> dict[tuple[str, str], str]:
    """Reads the facts back from the prompt's lines (an independent parser of the rendered text)."""
    facts = {}
    for line in prompt.split("\n\n")[0].splitlines():
        m = STATEMENT.match(line)
        assert m, line
        for attribute, group in (("birthplace", "place"), ("job", "job"), ("pet", "pet"), ("year", "year")):
            if m.group(group):
                assert (m.group("name"), attribute) not in facts
                facts[(m.group("name"), attribute)] = m.group(group)
    return facts


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_every_answer_is_recomputed_from_the_prompt_text(seed):
    codec = ByteCodec()
    for episode in get_episode_source("facts", people=3).episodes(4, seed=seed, tokenizer=codec):
        text = codec.decode(episode.prompt)
        facts = facts_from_text(text)
        assert len(facts) == 3 * len(ATTRIBUTES)
        assert len(episode.queries) == len(facts) - 1  # the worked example is not asked again
        asked = set()
        for q in episode.queries:
            ids = torch.cat([q.inputs, q.targets[-1:]])
            first = int(q.mask.nonzero().min())
            question, answer = codec.decode(ids[: first + 1]), codec.decode(q.targets[q.mask])
            matches = [(a, p.match(question)) for a, p in QUESTION.items() if p.match(question)]
            assert len(matches) == 1, question
            attribute, m = matches[0]
            assert answer == " " + facts[(m.group(1), attribute)]
            asked.add((m.group(1), attribute))
        assert len(asked) == len(episode.queries)
        worked = set(facts) - asked
        assert len(worked) == 1
        name, attribute = worked.pop()
        worked_question, worked_answer = text.split("\n\n")[1].rsplit("\n", 1)
        m = QUESTION[attribute].match(worked_question + "\nA:")
        assert m and m.group(1) == name and worked_answer == f"A: {facts[(name, attribute)]}"


def test_names_are_held_out_and_unique():
    rng = random.Random(0)
    reserved = {n.lower() for n in TRAIN_NAMES + HELDOUT_NAMES}
    for _ in range(50):
        people = make_people(4, rng)
        words = [w for p in people for w in (p.first, p.last, p.birthplace, p.pet_name)]
        assert len(set(words)) == len(words)
        assert not reserved & {w.lower() for w in words}


def test_seeds_reproduce_and_differ():
    codec = ByteCodec()
    a = get_episode_source("facts").episodes(3, seed=5, tokenizer=codec)
    b = get_episode_source("facts").episodes(3, seed=5, tokenizer=codec)
    c = get_episode_source("facts").episodes(3, seed=6, tokenizer=codec)
    assert all(torch.equal(x.prompt, y.prompt) for x, y in zip(a, b))
    assert all(torch.equal(qx.targets, qy.targets) for x, y in zip(a, b) for qx, qy in zip(x.queries, y.queries))
    assert not torch.equal(a[0].prompt, c[0].prompt)


@pytest.mark.parametrize("paraphrases", [1, 2, 3, 6])
def test_training_queries_are_not_the_evaluation_questions(paraphrases):
    codec = ByteCodec()
    episode = get_episode_source("facts", questions=f"paraphrases:{paraphrases}").episodes(1, seed=0, tokenizer=codec)[0]
    questions = {codec.decode(q.inputs[: int(q.mask.nonzero().min()) + 1]) for q in episode.queries}
    assert all(q.endswith("\nA:") for q in questions)
    answers = {codec.decode(q.targets[q.mask]).strip() for q in episode.queries}
    # a cloze and `paraphrases` other wordings per asked fact, all different
    assert len(episode.train_queries) == (1 + paraphrases) * len(episode.queries)
    texts = [codec.decode(t) for t in episode.train_queries]
    assert len(set(texts)) == len(texts)
    # the wordings of one question (its statement cut before the answer, then its paraphrases) share its id
    assert episode.train_groups == [i // (1 + paraphrases) for i in range(len(texts))]
    assert episode.query_groups == list(range(len(episode.queries)))  # query i asks question i
    for text in texts:
        assert text not in questions
        assert not any(answer in text for answer in answers)  # no answer inside
    if paraphrases > 1:  # the first wording is the one the task gave before the option existed
        one = get_episode_source("facts", questions="paraphrases:1").episodes(1, seed=0, tokenizer=codec)[0]
        assert [codec.decode(t) for t in one.train_queries[:2]] == texts[:2]
    if paraphrases > 3:  # the wordings added later come after the first three: paraphrases=3 gives what it gave
        three = get_episode_source("facts", questions="paraphrases:3").episodes(1, seed=0, tokenizer=codec)[0]
        assert [codec.decode(t) for t in three.train_queries] == [
            text for i, text in enumerate(texts) if i % (1 + paraphrases) <= 3]


def test_bad_facts_settings():
    with pytest.raises(ValueError, match="people"):
        get_episode_source("facts", people=0)
    with pytest.raises(ValueError, match="questions=paraphrases:7: the task has 6 wordings"):
        get_episode_source("facts", questions="paraphrases:7")
    with pytest.raises(ValueError, match="questions=paraphrases:0: the task has 6 wordings"):
        get_episode_source("facts", questions="paraphrases:0")
    with pytest.raises(ValueError, match=r"give one of none \| cloze \| paraphrases:N"):
        get_episode_source("facts", questions="all")
    with pytest.raises(ValueError, match="unknown key"):  # the option before it was named: refused, not ignored
        get_episode_source("facts", paraphrases=3)
    with pytest.raises(ValueError, match="format"):
        get_episode_source("facts", format="html")
    with pytest.raises(ValueError, match="unknown fact attribute"):
        facts_prompt(make_people(1, random.Random(0)), random.Random(0), attributes=("height",))
    with pytest.raises(ValueError, match="at most 10000 people"):  # it looked for fresh names for ever past ~28,000
        make_people(10_001, random.Random(0))
    with pytest.raises(ValueError, match="people=10001: a facts prompt holds at most 10000 people"):
        get_episode_source("facts", people=10_001)


def test_chat_format_splits_at_a_turn():
    class ChatCodec(ByteCodec):
        def chat(self, messages, add_generation_prompt=False):
            text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
            return text + ("<assistant>" if add_generation_prompt else "")

    codec = ChatCodec()
    for placement in ("system", "user"):
        episode = get_episode_source("facts", format="chat", placement=placement).episodes(1, seed=0, tokenizer=codec)[0]
        prompt = codec.decode(episode.prompt)
        assert prompt.endswith("</assistant>")
        q = episode.queries[0]
        question = codec.decode(q.inputs[: int(q.mask.nonzero().min()) + 1])
        assert question.startswith("<user>") and question.endswith("<assistant>")
        plain = codec.decode(get_episode_source("facts").episodes(1, seed=0, tokenizer=codec)[0].prompt)
        facts = plain[: plain.index("\n\nQ:")]
        if placement == "system":  # the facts are the system turn, then the worked example's exchange
            assert prompt.startswith(f"<system>{facts}</system><user>") and "Remember" not in prompt
        else:
            assert prompt.startswith(f"<user>Remember these facts:\n{facts}</user><assistant>I will remember them.")
    with pytest.raises(ValueError, match="placement"):
        get_episode_source("facts", format="chat", placement="top")


def test_the_document_alone_is_the_default():
    """No training query reaches a method unless the task is asked for them (questions=...); cloze gives the
    statement starts alone."""
    codec = ByteCodec()
    alone = get_episode_source("facts", people=3).episodes(2, seed=0, tokenizer=codec)
    assert all(e.train_queries == [] and e.train_groups is None and e.query_groups is None for e in alone)
    split = get_episode_source("facts", people=3, documents=2).episodes(1, seed=0, tokenizer=codec)[0]
    assert split.train_queries == [] and split.train_groups is None and all(not p.train_queries for p in split.parts)
    cloze = get_episode_source("facts", people=3, questions="cloze").episodes(1, seed=0, tokenizer=codec)[0]
    assert len(cloze.train_queries) == len(cloze.queries)
    assert all(not codec.decode(t).startswith("Q:") for t in cloze.train_queries)
    with_questions = get_episode_source("facts", people=3, questions="paraphrases:2").episodes(2, seed=0, tokenizer=codec)
    assert [e.prompt.tolist() for e in with_questions] == [e.prompt.tolist() for e in alone]  # same documents
