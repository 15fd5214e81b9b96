"""The plain question format and a user's training questions, in one place.

A plain-format question is `Q: {question}\\nA:`, its answer read after it with a leading space (the `facts` task,
`documents`, `jsonl`, a base model's chat, the data stages' written questions). `plain_question` writes one,
`question_of` reads the question back.

Training questions (`incontext absorb --train-queries FILE`): one question a line, the lines of one block wordings of
one question, a blank line between questions (read_train_queries); each line is read after the document as
`train_query_text` gives it, tokenized by `train_query_ids`.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from .placement import chat_turn, unmarked

QUESTION = "Q: {}\nA:"


def plain_question(question: str) -> str:
    """"Where was Ada born?" -> "Q: Where was Ada born?\\nA:"."""
    return QUESTION.format(question)


def is_plain_question(text: str) -> bool:
    return text.startswith("Q: ") and text.endswith("\nA:")


def question_of(text: str) -> str:
    """A plain-format question's own words ("Q: ...\\nA:" -> "..."); other text as it is."""
    return text.removeprefix("Q: ").removesuffix("\nA:")


def train_query_text(line: str) -> str:
    """A training-question line as the text read after the document: a question or request (ending in ?, . or !) in
    the plain format; a line without closing punctuation as it is, the start of a statement the document completes
    ("Ada Lovelace was born in"), as the `facts` task's statement cut before its answer."""
    return plain_question(line) if line.endswith(("?", ".", "!")) else line


def read_train_queries(file: Path) -> list[list[str]]:
    """A training-questions file: questions the absorb may train on (never the ones it will be scored with), one a
    line (train_query_text); the lines of one block are wordings of one question (wording_ensemble teaches them one
    target), a blank line starts the next question."""
    file = Path(file)
    if not file.is_file():
        raise FileNotFoundError(f"training questions {file}: no such file")
    groups, block = [], []
    for line in file.read_text(encoding="utf-8-sig").splitlines() + [""]:  # a BOM is not part of the first line
        if line.strip():
            block.append(line.strip())
        elif block:
            groups.append(block)
            block = []
    if not groups:
        raise ValueError(f"training questions {file} holds no questions (one a line, a blank line between questions)")
    return groups


class TrainQueries(NamedTuple):
    """A training-questions file read (read_train_queries) and tokenized (train_query_ids) for absorb(...)."""
    lines: list[list[str]]  # the file's questions, each its block of wordings (read_train_queries)
    ids: list[list[int]]  # each wording's token ids, in order
    groups: list[int]  # each wording's question index


def train_query_ids(groups: list[list[str]], codec, limit: int | None, prompt_text: str, prompt_tokens: int,
                    placement: str = "raw") -> tuple[list[list[int]], list[int]]:
    """Each wording's token ids (train_query_text, on a new line when the prompt does not end in one; after a
    system-placed document a question is the user's turn, as a chat asks it) and its question's index (absorb's
    train_groups). `limit`: the most tokens the model reads (None: no limit)."""
    start = "" if unmarked(prompt_text).endswith("\n") or placement == "system" else "\n"
    ids, questions = [], []
    for question, wordings in enumerate(groups):
        for text in wordings:
            asked = placement == "system" and text.endswith(("?", ".", "!"))
            query = codec.encode(chat_turn(codec, text, placement) if asked else start + train_query_text(text))
            if limit is not None and prompt_tokens + len(query) >= limit:
                raise ValueError(f"training question {text[:40]!r} has {len(query)} tokens; after the {prompt_tokens}-token "
                                 f"prompt the model reads at most {limit} (and the answer needs room)")
            ids.append(query)
            questions.append(question)
    return ids, questions


def train_queries(file: Path, codec, limit: int | None, prompt_text: str, prompt_tokens: int,
                  placement: str = "raw") -> TrainQueries:
    """A training-questions file read and tokenized after the placed document (`prompt_text`, `prompt_tokens`)."""
    groups = read_train_queries(file)
    return TrainQueries(groups, *train_query_ids(groups, codec, limit, prompt_text, prompt_tokens, placement))
