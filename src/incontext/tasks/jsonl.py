"""The `jsonl` episode task: your own documents and questions, read from a JSONL file.

One record per line, one episode per record (in file order; blank lines are skipped):

    {"document": "Mira Talven keeps bees in Orlu. ...", "questions": [{"question": "Where does Mira Talven keep bees?", "answer": "Orlu"}]}

The document may also be under "context" or "text"; a question takes "answer" (a string) or "answers" (a list of
strings, any of which counts; the first is the one teacher-forced); other keys are ignored. The prompt is the
document; each question is asked without it, in the plain format as `Q: {question}\nA:` followed by ` {answer}`,
in the chat format as a user turn after the document's turn (the model's chat template). Each query is
teacher-forced on the answer (so the harness's agreement columns keep their meaning) and also answered greedily:
the metric `generated` scores whether the normalised greedy answer contains a gold answer, and its token F1.

`n` episodes are the file's first n records: the seed does not reorder them (so `--tune`'s validation episodes
are those records too). A bad file is refused in one line naming the file and line, before any model loads where
the tokenizer is not needed (the config reads the file).

    source = get_episode_source("jsonl", path="my_questions.jsonl")
    episodes = source.episodes(3, tokenizer=codec)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..config import check_choices
from .episodes import Episode, EpisodeSource, _need, _positive, text_query
from .metrics import normalize_answer
from .queries import plain_question

DOCUMENT_KEYS = ("document", "context", "text")  # where a record's document may be, in this order
CHAT_INTRO = "Read this document:\n"  # the chat format's first user turn: this, then the document
CHAT_REPLY = "I have read it."
_CONTEXT_UNKNOWN = 10 ** 7  # a tokenizer's model_max_length at or above this says nothing (transformers' default is 1e30)


@dataclass(frozen=True)
class QARecord:
    line: int  # its line in the file (from 1)
    document: str
    questions: tuple[tuple[str, tuple[str, ...]], ...]  # (question, gold answers)


@dataclass
class JsonlConfig:
    path: str = ""  # the JSONL file (required): one {"document": ..., "questions": [{"question": ..., "answer": ...}]} a line
    format: Literal["plain", "chat"] = "plain"  # plain: the document, then Q: question / A: answer; chat: chat turns
    max_answer_tokens: int = 16  # the greedy answer's most tokens (it also stops at a newline or the end of the turn)

    def __post_init__(self):
        if not self.path:
            raise ValueError("needs the file: option path=FILE (one JSON record of a document and its "
                             "questions a line)")
        _positive(self, "max_answer_tokens")
        check_choices(self)
        read_qa_file(self.path)  # a bad file is refused here, before a model loads


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_qa_file(path: str | Path) -> list[QARecord]:
    """The file's records; a ValueError naming the file and line for the first bad one."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"path={path}: cannot read the file ({error.strerror or error})") from None
    records = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        where = f"{path}, line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: not UTF-8 text") from None
        try:
            record = json.loads(text.removeprefix("\ufeff") if number == 1 else text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg} at column {error.colno})") from None
        records.append(parse_record(record, where, number))
    if not records:
        raise ValueError(f"{path}: no records (give one JSON object a line: "
                         '{"document": ..., "questions": [{"question": ..., "answer": ...}]})')
    return records


def parse_record(record, where: str, line: int = 0) -> QARecord:
    """One line's JSON value as a record, or a ValueError starting with `where`."""
    if not isinstance(record, dict):
        raise ValueError(f'{where}: a record is a JSON object {{"document": ..., "questions": [...]}}, '
                         f"got a {type(record).__name__}")
    key = next((k for k in DOCUMENT_KEYS if k in record), None)
    if key is None:
        raise ValueError(f'{where}: the record has no "document" (nor "context" or "text"); its keys: {sorted(record)}')
    document = record[key]
    if not isinstance(document, str) or not document.strip():
        raise ValueError(f'{where}: "{key}" must be a non-empty string, got {_short(document)}')
    questions = record.get("questions")
    if not isinstance(questions, list) or not questions:
        raise ValueError(f'{where}: "questions" must be a non-empty list of {{"question": ..., "answer": ...}}, '
                         f"got {_short(questions)}")
    parsed = []
    for i, item in enumerate(questions, 1):
        at = f"{where}, question {i}"
        if not isinstance(item, dict):
            raise ValueError(f'{at}: must be an object {{"question": ..., "answer": ...}}, got {_short(item)}')
        question = item.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f'{at}: "question" must be a non-empty string, got {_short(question)}')
        if "answers" in item:
            answers = item["answers"]
            if not isinstance(answers, list) or not answers:
                raise ValueError(f'{at}: "answers" must be a non-empty list of strings, got {_short(answers)}')
        elif "answer" in item:
            answers = [item["answer"]]
        else:
            raise ValueError(f'{at}: needs "answer" (a string) or "answers" (a list of strings)')
        for answer in answers:
            if not isinstance(answer, str) or not normalize_answer(answer):
                raise ValueError(f"{at}: an answer must be a string with a word left after normalising (lowercase, "
                                 f"no punctuation or articles), got {_short(answer)}")
        parsed.append((" ".join(question.split()), tuple(a.strip() for a in answers)))
    return QARecord(line, document.strip(), tuple(parsed))


def _context_limit(codec) -> int | None:
    """The tokenizer's context length where it states one (a Hugging Face tokenizer's model_max_length)."""
    limit = getattr(getattr(codec, "tokenizer", None), "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < _CONTEXT_UNKNOWN else None


class JsonlQA(EpisodeSource):
    name = "jsonl"
    description = ("your own documents and questions from a JSONL file (path=FILE): one episode per record, the "
                   "file's first --episodes records in order (the seed does not reorder them); the greedy answer "
                   "scored by normalised contains and token F1")
    metric = "generated"
    config_class = JsonlConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        if self.config.format == "chat" and not hasattr(codec, "chat"):
            raise ValueError("jsonl format=chat needs a tokenizer with a chat template")
        records = read_qa_file(self.config.path)
        if len(records) < n:
            raise ValueError(f"{self.config.path} holds {len(records)} records, fewer than the {n} episodes asked "
                             f"(one episode per record): ask for {len(records)} episodes or fewer")
        return [self._episode(codec, record) for record in records[:n]]

    def _episode(self, codec, record: QARecord) -> Episode:
        where = f"{self.config.path}, line {record.line}"
        if self.config.format == "plain":
            prompt = record.document + "\n\n"
            asked = [(plain_question(question), " " + answers[0], answers) for question, answers in record.questions]
        else:
            turns = [{"role": "user", "content": CHAT_INTRO + record.document},
                     {"role": "assistant", "content": CHAT_REPLY}]
            prompt = codec.chat(turns, add_generation_prompt=False)
            asked = []
            for question, answers in record.questions:
                full = codec.chat(turns + [{"role": "user", "content": question}], add_generation_prompt=True)
                if not full.startswith(prompt):
                    raise ValueError("the chat template does not extend a conversation by appending to it")
                asked.append((full[len(prompt):], answers[0], answers))
        prompt_ids = codec.encode(prompt)
        limit = _context_limit(codec)
        queries = []
        for i, (question, answer, answers) in enumerate(asked, 1):
            try:
                query = text_query(codec, question, answer)
            except ValueError as error:
                raise ValueError(f"{where}, question {i}: {error}") from None
            need = len(prompt_ids) + len(query.inputs)  # what the prompted model reads (the greedy answer stops at the end)
            if limit is not None and need > limit:
                raise ValueError(f"{where}, question {i}: the document, question and answer take {need} tokens, more "
                                 f"than the model's context of {limit}")
            queries.append(dataclasses.replace(query, answers=answers, max_answer_tokens=self.config.max_answer_tokens))
        if not prompt_ids:
            raise ValueError(f"{where}: the document is empty after tokenization")
        return Episode(prompt=torch.tensor(prompt_ids), queries=queries)

