"""The distillation data stage: from a document (a prompt) and the model, the sequences a prompt-free student
learns and the teacher's next-token distributions on them (Cartridges' "self-study", Eyuboglu et al. 2025, in the
form this project's methods share: distill-lora and kv-prefix train on the same sequences).

The teacher is the model with the document in its context (a document longer than `chunk_tokens`, or than the
model's context, one chunk at a time: teacher_sequences); the student reads the sequences without it:

- recall windows: the document cut into windows (stride half a window); the teacher reads the whole document
  and then the window again, the student the window alone;
- continuations the teacher samples after the document (seeded, drawn on the CPU);
- training queries a task provides (never evaluation queries), answered greedily by the teacher;
- with a tokenizer: questions the model itself writes about the document's sentences (a generic few-shot
  question writer), answered by the teacher as "Q: ...\nA:" and, where the tokenizer has a chat template, as a
  chat turn (the teacher reads the document and the question in the user turn, the student the question);
- with a tokenizer: queries derived from the document's text by rules, no writer model (derived_queries: sentence
  prefixes the teacher continues, and questions answered like the written ones);
- `grounded`: a written or derived question, or a self-study message, is kept only where the teacher's answer is
  grounded in the document (_grounded_rows).

Every tensor is made on the model's device; all randomness comes from the caller's generator. Our Transformer
decodes the continuations and answers on a cache of fixed size (`static_decode`, models/static_decode.py): all the
training queries in one batch of rows, each at its own position, whatever their lengths; on a GPU its one-token step
is replayed as a CUDA graph. It equals the plain decode up to float rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..config import limit
from ..models import Cache
from ..models.lm import copy_cache
from ..models.static_decode import StaticDecoder, bytes_per_row, supported
from ..runtime import device_of
from .generation import END_OF_TURN

STATIC_BYTES = 1 << 30  # the static cache's buffers for the answers: fewer rows at a time for a long document


@dataclass
class StudyOptions:
    """The data stage's options (`--set study.OPTION=VALUE`)."""

    window_tokens: int = limit(24, min=1)  # recall windows of this many tokens (stride half a window)
    n_continuations: int = limit(2, min=0)  # continuations the teacher samples after the document
    continuation_tokens: int = limit(32, min=1)  # tokens per continuation
    answer_tokens: int = limit(8, min=0)  # the teacher's greedy answer tokens after each training query
    n_questions: int = limit(0, min=0)  # questions the model writes about the document's sentences
    n_conversations: int = limit(0, min=0)  # self-study: messages the model writes from the seed prompts
    seed_prompts: str | tuple[str, ...] = "structuring,summarization,question,use-case,creative"  # their kinds
    derived: int = limit(0, min=0)  # queries derived from the document's text by rules (no writer model)
    derived_kinds: str | tuple[str, ...] = "prefix,about,qa"  # their kinds (derived_queries)
    grounded: bool = False  # keep only questions and messages whose answers use the document's words, surer with it
    message_tokens: int = limit(32, min=1)  # tokens per written message
    chat_answer_tokens: int = limit(24, min=1)  # the teacher's answer tokens in a chat turn
    temperature: float = limit(1.0, gt=0)  # of the sampled continuations and messages
    chunk_tokens: int = limit(0, min=0)  # the teacher reads the document in chunks of this many tokens (0: whole)
    wording_ensemble: bool = False  # one target for the wordings of one training question
    top_k: int | None = limit(20, min=1)  # the teacher's top-k log-probs per taught position (null: all)
    cache: str = ""  # a folder where the stage is kept and reused for the same model, document and options

    def __post_init__(self):
        self.seed_prompts = seed_kinds(self.seed_prompts)  # a comma string from --set, or a sequence from Python
        self.derived_kinds = seed_kinds(self.derived_kinds, DERIVED_KINDS, "derived_kinds")


# Seed prompts of self-study (the kinds Cartridges found to help, in our own words): the model, reading the
# document, writes one message a user could send about it; the teacher then answers that message with the
# document in its context, the student without.
SEED_PROMPTS = {
    "structuring": "Write one request asking to organise a part of the text above into a list or a table "
                   "(for example each person's details). Reply with the request only.",
    "summarization": "Write one request asking for a short summary of a specific part of the text above. "
                     "Reply with the request only.",
    "question": "Write one question about a specific fact stated in the text above, naming who or what it is "
                "about. Reply with the question only.",
    "use-case": "Write one message a user might send who needs the information in the text above for a practical "
                "task. Reply with the message only.",
    "creative": "Write one creative request (a short story, a poem, a letter) that must use details from the text "
                "above. Reply with the request only.",
}


DERIVED_KINDS = ("prefix", "about", "qa")  # derived_queries' kinds
GROUNDED_MARGIN = 1.0  # nats: a grounded answer's first token is this much likelier with the document than without


def seed_kinds(value, known=SEED_PROMPTS, name: str = "seed_prompts") -> tuple[str, ...]:
    """seed_prompts (or derived_kinds) as given to a method (a comma string or a sequence of kinds), checked."""

    kinds = tuple(k.strip() for k in value.split(",")) if isinstance(value, str) else tuple(value)
    unknown = sorted(set(kinds) - set(known))
    if not kinds or unknown:
        raise ValueError(f"{name} must be a comma-separated subset of {','.join(known)}, got {value!r}")
    return kinds


# A generic few-shot prompt that turns a sentence into a question about it (for a bare passage: the questions a
# user may ask are not given, so the base model writes some; nothing here comes from a task's queries)
QUESTION_WRITER = ("Sentence: The Eiffel Tower was completed in 1889.\nQuestion: When was the Eiffel Tower completed?\n\n"
                   "Sentence: Marie Curie worked as a physicist.\nQuestion: What was Marie Curie's job?\n\n"
                   "Sentence: The river Thames flows through London.\nQuestion: Which city does the Thames flow through?\n\n"
                   "Sentence: Ada Lovelace was born in London.\nQuestion: Where was Ada Lovelace born?\n\n")


@torch.no_grad()
def teacher_sequences(model, prompt: torch.Tensor, queries: list[torch.Tensor], options: StudyOptions, codec,
                      generator: torch.Generator, groups: list[int] | None = None,
                      decode: str = "always", writer=None) -> tuple[list, dict[str, int]]:
    """The training sequences as (student tokens (L,), teacher log-probs (n, V) for the last n <= L positions)
    pairs, and how many of each kind (see the module docstring). `codec` (encode/decode, chat) may be None.

    A document longer than a chunk (chunk_spans: `chunk_tokens`, or half the model's context for a document the
    context does not hold) is read by the teacher one chunk at a time: each recall window with the chunk that holds it
    most centrally, each training query with the chunk that shares most of its rare tokens (assign_chunks), and
    the continuations, written and derived questions, conversations and foreign queries shared out over the chunks (each chunk's
    own, in turn). `groups`: a question's id for each training query (its wordings share one; None: each query its
    own), read with `wording_ensemble`, which also sends all the wordings of one question to one chunk."""
    m = prompt.shape[0]
    spans = chunk_spans(m, options.chunk_tokens, model.config.max_seq_len)
    groups = groups if options.wording_ensemble else None
    if len(spans) == 1:
        return _chunk_sequences(model, prompt, queries, None, options, codec, generator, groups=groups, decode=decode,
                                writer=writer)
    size = spans[0][1] - spans[0][0]
    width = max(1, min(options.window_tokens, size // 2, model.config.max_seq_len - size))  # each whole in a chunk
    k, starts = len(spans), window_starts(m, width)
    # each window to the chunk that holds it most centrally (the first of equals)
    windows = [max(range(k), key=lambda j: min(s - spans[j][0], spans[j][1] - s - width)
                   if spans[j][0] <= s and s + width <= spans[j][1] else -1) for s in starts]
    if groups is None:
        homes = assign_chunks(prompt, spans, queries)
    else:  # a question's wordings together, in the chunk its wordings' tokens point to
        ids = list(dict.fromkeys(groups))
        merged = assign_chunks(prompt, spans, [torch.cat([q for q, g in zip(queries, groups) if g == i]) for i in ids])
        home_of = dict(zip(ids, merged))
        homes = [home_of[g] for g in groups]
    sequences, counts = [], {}

    def share(n: int, j: int) -> int:
        return n * (j + 1) // k - n * j // k

    for j, (a, b) in enumerate(spans):
        part = dataclasses.replace(options, n_continuations=share(options.n_continuations, j),
                                   n_questions=share(options.n_questions, j), derived=share(options.derived, j),
                                   n_conversations=share(options.n_conversations, j))
        mine = [s - a for s, home in zip(starts, windows) if home == j]
        out, seen = _chunk_sequences(model, prompt[a:b], [q for q, home in zip(queries, homes) if home == j], mine,
                                     part, codec, generator, width,
                                     groups=None if groups is None else [g for g, home in zip(groups, homes) if home == j],
                                     decode=decode, writer=writer)
        sequences += out
        for key, value in seen.items():  # counts add up; the derived queries' texts join
            counts[key] = counts[key] + value if key in counts else value
    counts["chunks"] = k
    return sequences, counts


def heldout_sequences(model, prompt: torch.Tensor, options: StudyOptions, generator: torch.Generator,
                      n: int) -> list:
    """`n` fresh continuations of the document (the data stage's continuation kind: `continuation_tokens` at
    `temperature`, after the first chunk the teacher reads) with the teacher's full log-probabilities: a held-out
    batch, never trained on, on which the full KL(teacher || student) is measured (distill.heldout_kl)."""
    a, b = chunk_spans(prompt.shape[0], options.chunk_tokens, model.config.max_seq_len)[0]
    room = (model.config.max_seq_len or b - a + options.continuation_tokens) - (b - a)
    if n <= 0 or room <= 0:
        return []
    cache = Cache.empty(model.config.n_layer)
    last = model(prompt[None, a:b], cache=cache)[0, -1]
    tokens, logits = _sample(model, cache, last, n, min(options.continuation_tokens, room), options.temperature,
                             generator, decode="never")
    return [(t, F.log_softmax(_wide(x), -1)) for t, x in zip(tokens, logits)]


def chunk_spans(m: int, chunk_tokens: int, max_len: int | None) -> list[tuple[int, int]]:
    """The chunks of an m-token document the teacher reads, as (start, end): the whole document when `chunk_tokens`
    is 0 and the model's context (max_len) holds it, else windows of `chunk_tokens` (0: half the context) at a
    stride of half a chunk, the last flush with the end, so that every passage of at most half a chunk lies whole
    in one of them."""
    size = chunk_tokens or (m if max_len is None or m < max_len else max_len // 2)
    if max_len is not None and size >= max_len:
        raise ValueError(f"chunk_tokens={size} leaves the teacher no room within the model's context ({max_len} tokens)")
    if m <= size:
        return [(0, m)]
    stride = max(1, size // 2)
    return [(s, s + size) for s in sorted(set(range(0, m - size + 1, stride)) | {m - size})]


def window_starts(m: int, width: int) -> list[int]:
    """Where the recall windows of `width` tokens start: a stride of half a window, the last flush with the end."""
    return sorted(set(list(range(0, m - width + 1, max(1, width // 2))) + [m - width]))


def assign_chunks(prompt: torch.Tensor, spans: list[tuple[int, int]], queries: list[torch.Tensor]) -> list[int]:
    """For each query, the chunk that shares most of its rare tokens: the sum, over the query's distinct tokens that
    the chunk holds, of log(chunks / chunks holding the token) (a token in every chunk counts nothing; a name
    counts most); ties go to the earliest chunk."""
    held = [set(prompt[a:b].tolist()) for a, b in spans]
    out = []
    for query in queries:
        tokens = set(query.tolist())
        weight = {t: math.log(len(spans) / n) for t in tokens if (n := sum(t in h for h in held))}
        scores = [sum(weight[t] for t in tokens & h) for h in held]
        out.append(scores.index(max(scores)))
    return out


def _chunk_sequences(model, prompt: torch.Tensor, queries: list[torch.Tensor], starts: list[int] | None,
                     options: StudyOptions, codec, generator: torch.Generator, width: int | None = None,
                     groups: list[int] | None = None, decode: str = "always", writer=None):
    """teacher_sequences for the teacher reading `prompt` (the document, or one chunk of it); `starts`: its recall
    windows' starts (None: every window of the prompt), of `width` tokens; `groups`: the training queries' question
    ids, for wording_ensemble (None: none); `writer`: (model, tokenizer) that writes the questions and self-study
    messages (None: the model itself)."""
    m, max_len = prompt.shape[0], model.config.max_seq_len
    cache = Cache.empty(model.config.n_layer)
    prompt_logits = model(prompt[None], cache=cache)[0]
    room = max_len - m
    sequences, counts = [], {}
    windows = _recall_windows(model, cache, prompt, width or min(options.window_tokens, m, room), starts)
    sequences += windows
    counts["recall_windows"] = len(windows)
    if options.n_continuations:
        tokens, logits = _sample(model, cache, prompt_logits[-1], options.n_continuations,
                                 min(options.continuation_tokens, room), options.temperature, generator, decode)
        sequences += [(t, _log_probs(x)) for t, x in zip(tokens, logits)]
    counts["continuations"] = options.n_continuations
    text = document_text(codec, prompt.tolist()) if codec is not None else ""
    writer, pen = writer if writer is not None else (model, codec)  # who writes the questions and messages
    questions = _questions(writer, text, pen, options.n_questions) if codec is not None and options.n_questions else []
    derived = derived_queries(text, options.derived_kinds, options.derived, generator) if text and options.derived else []
    device = prompt.device  # every tensor made here follows the model (a CUDA model gets CUDA ids)

    def encode(t):
        return torch.tensor(codec.encode(t), device=device)

    written = [("questions", encode(f"Q: {t}\nA:"), t) for t in questions] + [("derived", encode(t), t) for t in derived]
    written = [(kind, q, t) for kind, q, t in written if q.shape[0] + options.answer_tokens < room]
    texts = [t for _, _, t in written]
    written = [(kind, q) for kind, q, _ in written]
    plain = queries + [q for _, q in written]
    answered = _answer(model, cache, plain, [min(options.answer_tokens, room - q.shape[0]) for q in plain], decode)
    if groups is not None:
        answered[: len(queries)], counts["ensembled"] = wording_ensemble(model, cache, queries, answered[: len(queries)],
                                                                         groups, decode)
    sequences += answered[: len(queries)]
    counts.update(train_queries=len(queries), questions=0, derived=0, chat_turns=0)
    counts.update({"ungrounded": 0} if options.grounded else {})

    def keep(items, starts, kinds):  # the items (grounded ones only, with `grounded`) into sequences, counted by kind
        ok = _grounded_rows(model, codec, text, items, starts) if options.grounded and items else [True] * len(items)
        for item, tags, fine in zip(items, kinds, ok):
            sequences.extend([item] * fine)
            for tag in tags if fine else ("ungrounded",):
                counts[tag] += 1
        return ok

    ok = keep(answered[len(queries):], [q.shape[0] - 1 for _, q in written], [(kind,) for kind, _ in written])
    # the derived queries trained on, as text (the harness reads which asked questions they cover: harness.coverage)
    counts["derived_queries"] = [t for (kind, _), t, fine in zip(written, texts, ok) if kind == "derived" and fine]
    messages = _seed_messages(writer, text, pen, options, generator) if codec is not None and options.n_conversations else []
    counts["conversations"] = len(messages)
    templated = codec is not None and _has_template(codec)  # a base model (Gemma-3-270M) has no chat template
    if messages and not templated:  # a base model: the messages as plain Q/A turns
        asked = [q for q in map(encode, (f"Q: {t}\nA:" for t in messages)) if q.shape[0] + options.answer_tokens < room]
        keep(_answer(model, cache, asked, [min(options.chat_answer_tokens, room - q.shape[0]) for q in asked], decode),
             [q.shape[0] - 1 for q in asked], [()] * len(asked))
    if templated:  # the written and derived questions, and the messages, as chat turns
        asked = ([(t, ("chat_turns",)) for t in questions] + [(t[3:-3], ("chat_turns",)) for t in derived
                                                               if t.startswith("Q: ") and t.endswith("\nA:")]
                 + [(t, ("chat_turns",)) for t in messages])
        chat = _chat_turns(model, prompt, [t for t, _ in asked], room, codec, options.chat_answer_tokens) if asked else []
        kept = [(turn, tags) for turn, (_, tags) in zip(chat, asked) if turn is not None]
        keep([t for t, _ in kept], [t[0].shape[0] - t[1].shape[0] for t, _ in kept], [tags for _, tags in kept])
    return sequences, counts

def document_text(codec, ids: list[int]) -> str:
    """The document's text as the writer and the rules read it: the ids decoded without the tokenizer's special
    tokens (a chat template's markers around a system-placed document, a BOS), which are no text to ask about."""
    special = set(getattr(getattr(codec, "tokenizer", None), "all_special_ids", None) or ())
    return codec.decode([i for i in ids if i not in special])


def _seed_messages(model, document: str, codec, options: StudyOptions, generator: torch.Generator) -> list[str]:
    """`n_conversations` messages the model (the writer) writes about the document's text, cycling through the
    seed-prompt kinds: it reads the document and the seed instruction (in a user turn where there is a chat template)
    and samples a message to its end of turn or line (seeded, drawn on the CPU)."""
    unknown = sorted(set(options.seed_prompts) - set(SEED_PROMPTS))
    if unknown or not options.seed_prompts:
        raise ValueError(f"seed_prompts must be a non-empty subset of {', '.join(SEED_PROMPTS)}, got {options.seed_prompts}")
    document, device = document.strip(), device_of(model)
    chat = hasattr(codec, "chat") and _has_template(codec)
    stops = {getattr(codec, "eos_token_id", None)}
    messages = []
    for i in range(options.n_conversations):
        instruction = SEED_PROMPTS[options.seed_prompts[i % len(options.seed_prompts)]]
        text = (codec.chat([{"role": "user", "content": f"{document}\n\n{instruction}"}], add_generation_prompt=True)
                if chat else f"{document}\n\n{instruction}\nRequest:")
        ids = torch.tensor(codec.encode(text), device=device)
        if model.config.max_seq_len is not None and ids.shape[0] + options.message_tokens > model.config.max_seq_len:
            continue
        cache = Cache.empty(model.config.n_layer)
        logits = model(ids[None], cache=cache)[0, -1]
        out = []
        for _ in range(options.message_tokens):
            probs = torch.softmax(logits.float() / options.temperature, -1).cpu()
            token = int(torch.multinomial(probs, 1, generator=generator))
            piece = codec.decode([token])
            if token in stops or piece.strip() in END_OF_TURN or (not chat and "\n" in piece):
                break
            out.append(token)
            logits = model(torch.tensor([[token]], device=device), cache=cache)[0, -1]
        message = codec.decode(out).strip()
        if message and message not in messages:
            messages.append(message)
    return messages


def _has_template(codec) -> bool:
    if not hasattr(codec, "chat"):
        return False
    try:
        codec.chat([{"role": "user", "content": "x"}])
    except (ValueError, AttributeError, TypeError):
        return False
    return True


def _questions(model, document: str, codec, n_questions: int) -> list[str]:
    """Questions the model (the writer; without the document) writes about up to n_questions of the document's
    sentences, spread evenly over it."""
    device = device_of(model)
    sentences = [s for s in _sentences(document) if len(s.split()) >= 3]
    if len(sentences) > n_questions:
        sentences = [sentences[round(i * len(sentences) / n_questions)] for i in range(n_questions)]
    questions = []
    for sentence in sentences:
        ids = torch.tensor(codec.encode(f"{QUESTION_WRITER}Sentence: {sentence}\nQuestion:"), device=device)
        if ids.shape[0] + 24 > model.config.max_seq_len:
            continue
        cache = Cache.empty(model.config.n_layer)
        logits = model(ids[None], cache=cache)[0, -1]
        out = []
        for _ in range(24):  # greedy, to the end of the line
            token = int(logits.argmax())
            if "\n" in codec.decode([token]):
                break
            out.append(token)
            logits = model(torch.tensor([[token]], device=device), cache=cache)[0, -1]
        question = codec.decode(out).strip()
        if question.endswith("?") and question not in questions:
            questions.append(question)
    return questions

def _chat_turns(model, prompt, questions, room, codec, chat_answer_tokens: int) -> list:
    """Each question as a chat turn: the teacher reads the prompt and the question in the user turn and
    answers greedily (to its end of turn); the student reads the question alone and learns the answer. One item
    per question (None where the context has no room for it)."""
    eos = getattr(codec, "eos_token_id", None)
    marker = "\u0000QUESTION\u0000"
    template = codec.chat([{"role": "user", "content": f"{codec.decode(prompt.tolist()).strip()}\n\n{marker}"}],
                          add_generation_prompt=True)
    head, tail = template.split(marker)
    head_ids = torch.tensor(codec.encode(head), device=prompt.device)
    if head_ids.shape[0] + 64 > model.config.max_seq_len:
        return [None] * len(questions)
    head_cache = Cache.empty(model.config.n_layer)
    model(head_ids[None], cache=head_cache)
    out = []
    for question in questions:
        student = torch.tensor(codec.encode(codec.chat([{"role": "user", "content": question}], add_generation_prompt=True)),
                               device=prompt.device)
        teacher = torch.tensor(codec.encode(question + tail), device=prompt.device)
        n = min(chat_answer_tokens, room - student.shape[0],
                model.config.max_seq_len - head_ids.shape[0] - teacher.shape[0])
        if n < 1:
            out.append(None)
            continue
        cache = _copy(head_cache)
        first = model(teacher[None], cache=cache)[0, -1]
        tokens, logits = _greedy(model, cache, first, n, eos)
        out.append((torch.cat([student, tokens[:-1]]), _log_probs(logits)))
    return out


# ----------------------------------------------------------------------------- queries derived from the text

_STOP = set("a an the in on at of to for by with from as and or but if so then this that these those it its he she they "
            "we you i his her their our my there here is are was were be been has have had do does did not no however "
            "after before when while during each every some all what who which how where also than into about".split())
_NAME = re.compile(r"[A-Z][\w-]*(?: [A-Z][\w-]*)*")  # a run of capitalised words
_NUMBER = re.compile(r"\d(?:[\d,.:/-]*\d)?")  # a number, a time, a date
_WHEN = re.compile(r"(?:(?:mon|tues|wednes|thurs|fri|satur|sun)day|january|february|march|april|may|june|july|august|"
                   r"september|october|november|december|\d{1,2}:\d\d|\d{4}|noon|midnight)\b", re.I)
_SUBJECT = r"(?P<x>[A-Z][\w'-]*(?: [\w'-]+){0,5}?)"  # a sentence's subject: up to six words
_PARTICIPLE = r"(?P<p> (?:[a-z]+ed|born|held|built|made|found|kept|set|run|sold|seen|written|given))?"
_RULES = [  # (pattern over a sentence without its last punctuation, the question it asks), tried in turn
    (re.compile(_SUBJECT + r" (?P<v>has|have|had) (?:\d[\d,.]*|one|two|three|four|five|six|seven|eight|nine|ten|"
                r"several|many) (?P<z>[a-z][a-z -]*?)(?:,.*| (?:in|on|at|of|named|called|with|and|for|who|which|that)\b.*)?"),
     lambda m, x: f"How many {m['z']} {dict(has='does', have='do', had='did')[m['v']]} {x} have?"),
    (re.compile(_SUBJECT + r" (?P<v>is|are|was|were)" + _PARTICIPLE + r" (?P<prep>on|at|in|during|since) (?P<y>.+)"),
     lambda m, x: (f"When {m['v']} {x}{m['p'] or ''}?" if _WHEN.match(m["y"]) else
                   f"Where {m['v']} {x}{m['p'] or ''}?" if m["y"][0].isupper() and m["prep"] in ("at", "in") else None)),
    (re.compile(_SUBJECT + r" (?P<verb>[a-z]{2,}[^s\W]s)(?P<o>(?: [\w'-]+)*?) (?:on|at) (?P<y>.+)"),
     lambda m, x: (f"When does {x} {re.sub(r'(?:(?<=[cs]h)|(?<=[xo]))es$|s$', '', m['verb'])}{m['o']}?"
                   if _WHEN.match(m["y"]) else None)),
    (re.compile(_SUBJECT + r" (?P<v>is|are|was|were) (?!not\b|(?:[a-z]+ed|born|on|at|in|during|since)\b)(?P<y>.+)"),
     lambda m, x: f"What {m['v']} {x}?"),
]


def derived_queries(text: str, kinds, limit: int, generator: torch.Generator) -> list[str]:
    """Up to `limit` distinct queries derived from the text alone, spread over its sentences (each sentence's in an
    order drawn from `generator`, one per sentence in turn): "prefix", a sentence up to a name, a number (time, date)
    or its last content word, which the teacher continues; "about", "Q: What does the text say about NAME?\nA:" for
    each name; "qa", sentences turned into questions by rules (_RULES), "Q: ...?\nA:"."""
    kinds = seed_kinds(kinds, DERIVED_KINDS, "derived_kinds")
    sentences = _sentences(text)
    if limit < 1 or not sentences:
        return []
    capitalised = Counter(re.findall(r"\b[A-Z][\w-]*", text))
    spans = [_name_spans(s, capitalised) for s in sentences]
    names = list(dict.fromkeys(s[a:b] for s, found in zip(sentences, spans) for a, b in found))
    per, seen = [], set()
    for s, found in zip(sentences, spans):
        mine = []
        if "prefix" in kinds:
            content = [m.start() for m in re.finditer(r"[^\W\d_]{3,}", s) if m.group().lower() not in _STOP][-1:]
            starts = sorted({a for a, _ in found} | {m.start() for m in _NUMBER.finditer(s)} | set(content))
            mine += [s[:a].rstrip() for a in starts if s[:a].strip()]
        if "about" in kinds:
            mine += [f"Q: What does the text say about {s[a:b]}?\nA:" for a, b in found]
        if "qa" in kinds:
            mine += [f"Q: {q}\nA:" for q in _rule_questions(s, names)]
        mine = [q for q in dict.fromkeys(mine) if q not in seen]
        seen.update(mine)
        per.append([mine[i] for i in torch.randperm(len(mine), generator=generator).tolist()])
    picked = []
    for r in range(max(map(len, per))):  # round r: the r-th query of every sentence that has one, while they fit
        layer, need = [(i, r, qs[r]) for i, qs in enumerate(per) if len(qs) > r], limit - len(picked)
        picked += layer if len(layer) <= need else [layer[k * len(layer) // need] for k in range(need)]
        if len(picked) == limit:
            break
    return [q for *_, q in sorted(picked)]


def cloze(text: str, answer: str) -> str | None:
    """The sentence of `text` that holds `answer`, up to it (the form the sentence-prefix rule cuts: "Ada was born
    in" for "Ada was born in Paris."), or None where the answer is not in the text or starts its sentence."""
    at = text.find(answer) if answer else -1
    if at < 0:
        return None
    start = max(text.rfind(mark, 0, at) for mark in (".", "\n", "!", "?")) + 1
    return text[start:at].strip() or None


def _name_spans(sentence: str, capitalised: Counter) -> list[tuple[int, int]]:
    """Where the sentence names something: runs of capitalised words, at its start without a leading stopword ("The")
    and only as two or more words or a word the text capitalises twice or more."""
    out = []
    for m in _NAME.finditer(sentence):
        a, run = m.start(), m.group()
        first, _, rest = run.partition(" ")
        if a == 0 and (first.lower() in _STOP or not rest and capitalised[first] < 2):
            a, run = a + len(first) + 1, rest if first.lower() in _STOP else ""
        if run and run.lower() not in _STOP:
            out.append((a, a + len(run)))
    return out


def _rule_questions(sentence: str, names: list[str]) -> list[str]:
    """The questions _RULES ask of one sentence, and "Who VERB ...?" where it starts with a name and a verb."""
    s, out = sentence.rstrip(" .!?;:"), []
    for pattern, ask in _RULES:
        m = pattern.fullmatch(s)
        x = m and m["x"]
        if m and "," not in x and x.lower() not in _STOP and x.split()[0].lower() not in _STOP - {"the", "a", "an", "this"}:
            question = ask(m, x[0].lower() + x[1:] if x.split()[0].lower() in _STOP else x)
            out += [question] if question else []
    who = max((n for n in names if s.startswith(n + " ")), key=len, default=None)
    m = who and re.fullmatch(r"(?P<verb>[a-z]+(?:s|ed)) (?P<rest>[^,]+)", s[len(who) + 1:])
    return out + ([f"Who {m['verb']} {m['rest']}?"] if m else [])


@functools.lru_cache(maxsize=8)
def _words(text: str) -> frozenset[str]:
    """The text's words, lowercased (one document's, read once for all the answers grounded against it)."""
    return frozenset(re.findall(r"[^\W_]+", text.lower()))


def grounded(answer_text: str, document_text: str) -> bool:
    """Whether one of the answer's content words (alphanumeric of >= 3 characters and no stopword, or any number) is a
    word of the document, case-insensitive."""
    document = _words(document_text)
    return any(w in document for w in re.findall(r"[^\W_]+", answer_text.lower())
               if w.isdigit() or len(w) >= 3 and w not in _STOP)


@torch.no_grad()
def _grounded_rows(model, codec, document_text: str, items: list, starts: list[int], rows: int = 16) -> list[bool]:
    """For each teacher sequence (ids, log-probs on its last n positions) whose answer follows ids[start]: whether its
    answer is grounded in the document's text and its first answer token GROUNDED_MARGIN nats likelier to the teacher
    (the document in context) than to the model reading ids[: start + 1] alone (right-padded batches of `rows`)."""
    eos = getattr(codec, "eos_token_id", None)
    out = []
    for j in range(0, len(items), rows):
        part = list(zip(items[j: j + rows], starts[j: j + rows]))
        batch = part[0][0][0].new_zeros(len(part), max(a + 1 for _, a in part))
        for r, ((ids, _), a) in enumerate(part):
            batch[r, : a + 1] = ids[: a + 1]
        last = model(batch)[torch.arange(len(part), device=batch.device), [a for _, a in part]]
        for ((ids, logp), a), bare in zip(part, _log_probs(last)):
            answer = torch.cat([ids[a + 1:], logp[-1:].argmax(-1)]).tolist()
            gain = float(logp[a - ids.shape[0] + logp.shape[0], answer[0]] - bare[answer[0]])
            out.append(gain > GROUNDED_MARGIN and grounded(codec.decode([t for t in answer if t != eos]), document_text))
    return out


# ----------------------------------------------------------------------------- helpers


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def _wide(x: torch.Tensor) -> torch.Tensor:
    """x in float32 at least, float64 kept."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """In float32 at least (half-precision logits lose the small probabilities), float64 kept."""
    return F.log_softmax(_wide(logits), -1).to(logits.dtype)


def _copy(cache: Cache, batch: int = 1) -> Cache:
    """A cache of the same context that a forward pass can extend without touching `cache`, for `batch` rows."""
    return copy_cache(cache, batch)


def _static(model, cache, rows: int, room: int, decode: str = "always") -> StaticDecoder | None:
    """A StaticDecoder for `rows` rows and `room` new positions after `cache` where `decode` asks for one ("always":
    with our Transformer on any device, where one batch of every query cuts the data stage's CPU time to 0.63 of a
    decode per group of equal lengths at 165 tokens; "cuda": on a CUDA device only; "never": the benchmarks' peer),
    captured on a CUDA device, else None (the plain decode)."""
    cuda = device_of(model).type == "cuda"
    if decode == "never" or (decode == "cuda" and not cuda) or not supported(model, cache):
        return None
    return StaticDecoder(model, cache, rows, room, capture=cuda)


def _sample(model, cache, last_logits, n, length, temperature, generator, decode: str = "always"):
    """n continuations of `length` tokens sampled from the model after the cached prompt, and the model's
    logits after each sampled token (n, length, V): the teacher's targets come with the sampling."""
    static = _static(model, cache, n, length, decode)
    cache = None if static is not None else _copy(cache, n)
    logits = last_logits.expand(n, -1)
    tokens, targets = [], []
    for _ in range(length):
        # drawn on the CPU from the method's CPU generator: the same draws whatever device the model is on
        probs = torch.softmax(logits.float() / temperature, -1).cpu()
        token = torch.multinomial(probs, 1, generator=generator).to(logits.device)
        logits = model(token, cache=cache)[:, -1] if static is None else static.step(token).clone()
        tokens.append(token)
        targets.append(logits)
    return torch.cat(tokens, 1), torch.stack(targets, 1)


def _greedy(model, cache, first_logits, n, stop_id=None):
    """Up to n greedy tokens after the cached context (ending with `stop_id` if drawn) and the logits each was
    chosen from ((k,), (k, V)); extends `cache`."""
    tokens, logits = [], [first_logits]
    for i in range(n):
        tokens.append(int(logits[-1].argmax()))
        if tokens[-1] == stop_id or i + 1 == n:
            break
        logits.append(model(torch.tensor([[tokens[-1]]], device=first_logits.device), cache=cache)[0, -1])
    return torch.tensor(tokens, device=first_logits.device), torch.stack(logits)


def _answered(model, cache, query, n_answer):
    """A training query and the teacher's greedy answer: the teacher reads the cached prompt, the query and
    its answer; the student learns the teacher's next-token distributions on all of it."""
    logits = model(query[None], cache=cache)[0]
    if n_answer < 1:
        return query, _log_probs(logits)
    tokens, answer_logits = _greedy(model, cache, logits[-1], n_answer)
    return torch.cat([query, tokens[:-1]]), _log_probs(torch.cat([logits, answer_logits[1:]]))


def _answered_batched(model, cache, queries: list[torch.Tensor], n_answers: list[int], rows: int = 16) -> list:
    """`_answered` (the reference, one query at a time) for many queries at once: queries of one length and answer
    length go through the model together, up to `rows` at a time, so a document's many training queries cost a few
    batched decodes instead of one decode each (on a GPU, where each decode step is launch-bound, ~8x fewer steps at
    489 tokens). The same sequences in the same order; equal to the reference up to float rounding of batched
    products (tests/absorb/test_self_study.py)."""
    out: list = [None] * len(queries)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (query, n) in enumerate(zip(queries, n_answers)):
        groups.setdefault((query.shape[0], n), []).append(i)
    for (_, n), members in groups.items():
        for chunk in (members[j: j + rows] for j in range(0, len(members), rows)):
            batch = torch.stack([queries[i] for i in chunk])
            step = _copy(cache, len(chunk))
            logits = model(batch, cache=step)  # (b, L, V)
            answers, answer_logits = [], []
            if n >= 1:
                last = logits[:, -1]
                for k in range(n):
                    answers.append(last.argmax(-1, keepdim=True))
                    if k + 1 == n:
                        break
                    last = model(answers[-1], cache=step)[:, -1]
                    answer_logits.append(last)
            for r, i in enumerate(chunk):
                if n < 1:
                    out[i] = (queries[i], _log_probs(logits[r]))
                    continue
                tokens = torch.cat([a[r] for a in answers])
                teacher = torch.cat([logits[r]] + [x[r: r + 1] for x in answer_logits])
                out[i] = (torch.cat([queries[i], tokens[:-1]]), _log_probs(teacher))
    return out


def _answered_full_passes(model, cache, queries: list[torch.Tensor], n_answers: list[int], rows: int = 32) -> list:
    """`_answered` for many queries of any lengths at once, for a GPU: the queries with the same answer length go
    right-padded into one batch (up to `rows`), and their n greedy answer tokens come from n full passes over the
    batch (pass j reads each query and its first j answer tokens and picks token j+1 at each row's own last
    position; causal attention leaves the padding unseen), the last pass giving every taught position's logits. On
    a GPU, where a pass costs about what a one-token decode step costs (launch-bound), that is n passes per batch
    instead of n decode steps per group of one query length; on a CPU each pass re-reads the whole batch, so
    `_answered_batched` (incremental decoding) is cheaper there. Equal to the reference up to float rounding of
    batched products (tests/absorb/test_self_study.py)."""
    out: list = [None] * len(queries)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(n_answers):
        groups.setdefault(n, []).append(i)
    for n, members in groups.items():
        for chunk in (members[j: j + rows] for j in range(0, len(members), rows)):
            lengths = [queries[i].shape[0] for i in chunk]
            width = max(lengths) + max(n - 1, 0)
            tokens = queries[chunk[0]].new_zeros(len(chunk), width)
            for r, i in enumerate(chunk):
                tokens[r, : lengths[r]] = queries[i]
            last = torch.tensor(lengths, device=tokens.device) - 1  # each row's last filled position
            rows_index = torch.arange(len(chunk), device=tokens.device)
            for k in range(max(n, 1)):
                logits = model(tokens[:, : max(lengths) + k], cache=_copy(cache, len(chunk)))
                if n < 1 or k + 1 == n:
                    break
                tokens[rows_index, last + 1] = logits[rows_index, last].argmax(-1)  # answer token k + 1 of n
                last = last + 1
            for r, i in enumerate(chunk):
                taught = lengths[r] + max(n - 1, 0)
                out[i] = (tokens[r, :taught].clone(), _log_probs(logits[r, :taught]))
    return out


def _answered_static(model, cache, queries: list[torch.Tensor], n_answers: list[int], static: StaticDecoder) -> list:
    """`_answered` for many queries of any lengths on a StaticDecoder (its rows at a time, the last chunk filled up
    with copies of its first query): each chunk right-padded goes through one eager pass, then its greedy answer
    tokens come from decode steps (replayed as a CUDA graph), each row at its own position. Equal to the reference
    up to float rounding of batched products (tests/absorb/test_self_study.py)."""
    out: list = [None] * len(queries)
    for j in range(0, len(queries), static.rows):
        chunk = list(range(j, min(j + static.rows, len(queries))))
        members = chunk + [chunk[0]] * (static.rows - len(chunk))
        lengths = [queries[i].shape[0] for i in members]
        tokens = queries[0].new_zeros(static.rows, max(lengths))
        for r, i in enumerate(members):
            tokens[r, : lengths[r]] = queries[i]
        static.restart()
        lengths_t = torch.tensor(lengths, device=tokens.device)
        logits = static.prefill(tokens, lengths_t)
        last = logits[torch.arange(static.rows, device=tokens.device), lengths_t - 1]
        n = max(n_answers[i] for i in chunk)
        answers, answer_logits = [], []
        for k in range(n):
            answers.append(last.argmax(-1))
            if k + 1 == n:
                break
            last = static.step(answers[-1]).clone()
            answer_logits.append(last)
        for r, i in enumerate(chunk):
            query, m = queries[i], n_answers[i]
            if m < 1:
                out[i] = (query, _log_probs(logits[r, : lengths[r]]))
                continue
            said = torch.stack([a[r] for a in answers[:m]])
            teacher = torch.cat([logits[r, : lengths[r]]] + [x[r: r + 1] for x in answer_logits[: m - 1]])
            out[i] = (torch.cat([query, said[:-1]]), _log_probs(teacher))
    return out


def _answer(model, cache, queries: list[torch.Tensor], n_answers: list[int], decode: str = "always", rows: int = 32) -> list:
    """The teacher's greedy answers to the training queries: decode steps on a static cache (_static: our
    Transformer; replayed as a CUDA graph on a GPU), else full passes on a GPU (transformers' models) and incremental
    decoding elsewhere (see _answered_full_passes); all equal the one-query-at-a-time reference `_answered`."""
    if not queries:
        return []
    room = max(q.shape[0] for q in queries) + max(n_answers)
    if supported(model, cache):  # every row holds a copy of the document's K/V: at most STATIC_BYTES of buffers in all
        rows = max(1, min(rows, STATIC_BYTES // bytes_per_row(cache, room)))
    static = _static(model, cache, min(rows, len(queries)), room, decode)
    if static is not None:
        return _answered_static(model, cache, queries, n_answers, static)
    if queries[0].is_cuda:
        return _answered_full_passes(model, cache, queries, n_answers)
    return _answered_batched(model, cache, queries, n_answers)


def wording_ensemble(model, cache, queries: list[torch.Tensor], answered: list, groups: list[int],
                     decode: str = "always") -> tuple[list, int]:
    """One target for the wordings of one question (the queries sharing a `groups` id; `answered`: their `_answer`
    sequences): the teacher often answers one fact right in one wording and wrong in another, and a student taught
    both learns neither. The consensus answer is the wording's greedy answer whose first token has the highest
    log-probability summed over the wordings; every wording is then read with that answer (teacher-forced) and
    taught, at each answer position, the teacher's log-probabilities averaged over the wordings and renormalised (a
    product of experts: the wordings that agree, or are sure, outweigh the ones that guess). The query positions keep
    their own targets. A self-consistency ensemble of the teacher: it reads no answer the document's teacher did not
    give. Returns the new sequences and how many questions were ensembled (those with two or more wordings whose
    answers have one length)."""
    out, members = list(answered), {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    chosen, redo, where = {}, [], []
    for g, rows in members.items():
        answers = [torch.cat([answered[i][0][queries[i].shape[0]:], answered[i][1][-1:].argmax(-1)]) for i in rows]
        if len(rows) < 2 or len({a.shape[0] for a in answers}) > 1:
            continue
        first = torch.stack([_wide(answered[i][1][queries[i].shape[0] - 1]) for i in rows])  # (wordings, V)
        best = answers[int(first[:, torch.stack([a[0] for a in answers])].sum(0).argmax())]
        chosen[g] = best
        for i, answer in zip(rows, answers):
            if not torch.equal(answer, best):
                redo.append(torch.cat([queries[i], best[:-1]]))
                where.append(i)
    for i, item in zip(where, _answer(model, cache, redo, [0] * len(redo), decode)):
        out[i] = item
    for g, best in chosen.items():
        rows = members[g]
        taught = torch.stack([_wide(out[i][1][queries[i].shape[0] - 1:]) for i in rows])  # (wordings, n, V)
        poe = F.log_softmax(taught.mean(0), -1)
        for i in rows:
            m = queries[i].shape[0]
            out[i] = (out[i][0], torch.cat([out[i][1][: m - 1], poe.to(out[i][1].dtype)]))
    return out, len(chosen)


def _recall_windows(model, cache, prompt, width, starts: list[int] | None = None):
    """The prompt in windows of `width` tokens (at `starts`; None: window_starts, a stride of width // 2, the last one
    flush with the end): the teacher reads the cached prompt and then the window, the student the window alone."""
    starts = window_starts(prompt.shape[0], width) if starts is None else starts
    if not starts:
        return []
    windows = torch.stack([prompt[s: s + width] for s in starts])
    logits = torch.cat([model(chunk, cache=_copy(cache, chunk.shape[0])) for chunk in windows.split(16)])
    return [(w, _log_probs(x)) for w, x in zip(windows, logits)]




def top_k_targets(sequences: list, k: int) -> list:
    """Each (ids, teacher log-probs (n, V)) as (ids, top-k log-probs (n, k), their token ids (n, k)): the student
    sees the teacher's distribution where it holds its mass (Cartridges keeps k = 20), at k / V of the memory."""
    out = []
    for ids, logp in sequences:
        values, index = logp.topk(min(k, logp.shape[-1]), dim=-1)
        out.append((ids, values, index))
    return out


# ----------------------------------------------------------------------------- the stage's cache on disk


FINGERPRINT_TEXT = "Q: Where was Abe Lonn born?\nA: In Rome, 1987 (\u00fcber caf\u00e9)."


def tokenizer_fingerprint(codec) -> str | None:
    """None without a tokenizer; else a short sha256 of what the data stage reads of it: its ids for a probe text,
    its end-of-turn id and its chat template's rendering of a probe turn (where it has one). Two tokenizers that
    write different questions or chat turns get different data stages."""
    if codec is None:
        return None
    import hashlib
    import json

    parts = {"type": type(codec).__name__, "ids": list(map(int, codec.encode(FINGERPRINT_TEXT))),
             "eos": getattr(codec, "eos_token_id", None)}
    if _has_template(codec):
        parts["chat"] = codec.chat([{"role": "user", "content": FINGERPRINT_TEXT}], add_generation_prompt=True)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stage_key(model, prompt: torch.Tensor, queries: list[torch.Tensor], settings: dict) -> str:
    """sha256 naming one data stage: the model (a sample of its weights), the document, the training queries and
    every setting that shapes the sequences (options, k, seed, the tokenizer's fingerprint)."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().flatten()
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(flat[:: max(1, flat.numel() // 1024)][:1024].to(torch.float64).cpu().numpy().tobytes())
    for ids in [prompt, *queries]:
        digest.update(ids.detach().cpu().numpy().astype("int64").tobytes() + b"|")
    return digest.hexdigest()


def save_stage(folder, key: str, sequences: list, counts: dict, settings: dict):
    """The stage as <key>.safetensors + <key>.json in `folder`, written through temporary names and renamed (an
    interrupted write leaves no half file under the real name)."""
    import json
    import os
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i, item in enumerate(sequences):
        for j, tensor in enumerate(item):
            tensors[f"{i}.{j}"] = tensor.detach().contiguous().cpu()
    weights, record = folder / f"{key}.safetensors", folder / f"{key}.json"
    partial = folder / f".{key}.{os.getpid()}.partial"
    try:
        save_file(tensors, str(partial))
        partial.replace(weights)
        partial.write_text(json.dumps({"settings": settings, "counts": counts, "sequences": len(sequences),
                                       "parts": len(sequences[0]) if sequences else 0}, indent=1, default=str))
        partial.replace(record)
    finally:
        partial.unlink(missing_ok=True)


def load_stage(folder, key: str, settings: dict, device) -> tuple[list, dict] | None:
    """The cached stage of `key` when both files are there and its recorded settings are these; else None."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    weights, record = Path(folder) / f"{key}.safetensors", Path(folder) / f"{key}.json"
    if not (weights.is_file() and record.is_file()):
        return None
    try:
        meta = json.loads(record.read_text())
        if json.loads(json.dumps(settings, default=str)) != meta["settings"]:
            return None
        tensors = load_file(str(weights), device=str(device))
        sequences = [tuple(tensors[f"{i}.{j}"] for j in range(meta["parts"])) for i in range(meta["sequences"])]
    except (ValueError, KeyError, OSError):
        return None  # a damaged cache entry is rebuilt (under the same name, by save_stage)
    return sequences, meta["counts"]


def study(model, prompt: torch.Tensor, queries: list[torch.Tensor], options: StudyOptions, codec,
          generator: torch.Generator, *, seed: int | None = None, groups: list[int] | None = None,
          static_decode: str = "always", writer=None) -> tuple[list, dict]:
    """The data stage with its cache: the teacher's sequences (top-k targets unless options.top_k is None), read
    from `options.cache` when an entry with the same model, document, queries and settings is there, else built
    (from `generator`) and stored. `seed` names the generator's seed in the key (the cached draws depend on it);
    `groups` (the training queries' question ids) is read with `options.wording_ensemble`; `static_decode`: where
    the decodes run on a fixed-size cache (_static; a speed switch, the same sequences); `writer`: (model, tokenizer)
    that writes the questions and self-study messages, e.g. a larger local model (None: the model itself)."""
    key = None
    if options.cache:  # the key (a pass over the weights, the tokenizer's fingerprint) only where there is a cache
        shaping = {k: v for k, v in dataclasses.asdict(options).items() if k not in ("cache", "top_k")}
        settings = {"options": shaping, "top_k": options.top_k, "seed": seed, "tokenizer": tokenizer_fingerprint(codec)}
        if options.wording_ensemble:
            settings["groups"] = None if groups is None else list(map(int, groups))
        if writer is not None:  # another writer, other questions: its weights' sample and tokenizer name the stage
            settings["writer"] = [stage_key(writer[0], prompt[:0], [], {}), tokenizer_fingerprint(writer[1])]
        key = stage_key(model, prompt, queries, settings)
        cached = load_stage(options.cache, key, settings, prompt.device)
        if cached is not None:
            return cached[0], {**cached[1], "cached": True}
    sequences, counts = teacher_sequences(model, prompt, queries, options, codec, generator, groups, static_decode,
                                          writer)
    if options.top_k is not None:
        sequences = top_k_targets(sequences, options.top_k)
    if key is not None:
        save_stage(options.cache, key, sequences, counts, settings)
    return sequences, {**counts, "cached": False}
