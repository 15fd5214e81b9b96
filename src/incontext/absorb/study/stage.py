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
- reconstruction (KVzip's signal): after an instruction to repeat the document (REPEAT; a chat turn where the
  tokenizer has a template), a piece of the document; the teacher reads the whole document first, the student the
  instruction and the piece (reconstruction_pieces: `reconstruction` pieces of `reconstruction_tokens`, spread over
  the document);
- `grounded`: a written or derived question, or a self-study message, is kept only where the teacher's answer is
  grounded in the document (_grounded_rows).

Every tensor is made on the model's device; all randomness comes from the caller's generator. Our Transformer
decodes the continuations and answers on a cache of fixed size (`static_decode`, models/static_decode.py): all the
training queries in one batch of rows, each at its own position, whatever their lengths; on a GPU its one-token step
is replayed as a CUDA graph. It equals the plain decode up to float rounding.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ...models import Cache
from ...tasks.placement import chat_turn
from ...tasks.queries import is_plain_question, plain_question, question_of
from .answer import _answer, _copy, _log_probs, _sample, _wide, wording_ensemble
from .cache import load_stage, save_stage, stage_key, tokenizer_fingerprint
from .derived import derived_queries, document_text
from .options import REPEAT, StudyOptions
from .writers import (
    _chat_turns,
    _grounded_rows,
    _has_template,
    _questions,
    _seed_messages,
)


@torch.no_grad()
def teacher_sequences(model, prompt: torch.Tensor, queries: list[torch.Tensor], options: StudyOptions, codec,
                      generator: torch.Generator, groups: list[int] | None = None,
                      decode: str = "always", writer=None, top_k: int | None = None) -> tuple[list, dict[str, int]]:
    """The training sequences as (student tokens (L,), teacher log-probs (n, V) for the last n <= L positions)
    pairs, and how many of each kind (see the module docstring). `codec` (encode/decode, chat) may be None.
    `top_k`: the recall windows and reconstruction pieces (most of a long document's sequences) come already cut to
    their top-k targets (top_k_targets' form), each as it is made: a 2k-token document's windows then never hold
    their full-vocabulary log-probs all at once.

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
                                writer=writer, top_k=top_k)
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
    piece = min(options.reconstruction_tokens, size // 2)  # each piece whole in a chunk
    all_pieces = reconstruction_pieces(m, options.reconstruction, piece)
    piece_homes = [max(range(k), key=lambda j: min(s - spans[j][0], spans[j][1] - e)
                       if spans[j][0] <= s and e <= spans[j][1] else -1) for s, e in all_pieces]
    sequences, counts = [], {}

    def share(n: int, j: int) -> int:
        return n * (j + 1) // k - n * j // k

    for j, (a, b) in enumerate(spans):
        part = dataclasses.replace(options, n_continuations=share(options.n_continuations, j),
                                   n_questions=share(options.n_questions, j), derived=share(options.derived, j),
                                   n_conversations=share(options.n_conversations, j))
        mine = [s - a for s, home in zip(starts, windows) if home == j]
        pieces = [(s - a, e - a) for (s, e), home in zip(all_pieces, piece_homes) if home == j]
        out, seen = _chunk_sequences(model, prompt[a:b], [q for q, home in zip(queries, homes) if home == j], mine,
                                     part, codec, generator, width,
                                     groups=None if groups is None else [g for g, home in zip(groups, homes) if home == j],
                                     decode=decode, writer=writer, pieces=pieces, top_k=top_k)
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
        raise ValueError(f"study.chunk_tokens={size} leaves the teacher no room within the model's context ({max_len} tokens)")
    if m <= size:
        return [(0, m)]
    stride = max(1, size // 2)
    return [(s, s + size) for s in sorted(set(range(0, m - size + 1, stride)) | {m - size})]


def reconstruction_pieces(m: int, n: int, width: int) -> list[tuple[int, int]]:
    """`n` pieces of at most `width` tokens of an m-token document, as (start, end): consecutive from its start, and
    where n pieces do not cover it, spread evenly over it (the first at its start, the last flush with its end)."""
    width = min(width, m)
    if n <= 0 or width <= 0:
        return []
    starts = list(range(0, m - width + 1, width))
    if starts[-1] != m - width:
        starts.append(m - width)
    if len(starts) > n:
        starts = [starts[round(i * (len(starts) - 1) / max(1, n - 1))] for i in range(n)] if n > 1 else starts[:1]
    return [(s, s + width) for s in dict.fromkeys(starts)]


def _reconstruction(model, cache, prompt: torch.Tensor, codec, pieces: list[tuple[int, int]], room: int,
                    top_k: int | None = None) -> list:
    """(instruction + piece, the teacher's log-probs at the instruction's last token and each piece token) for each
    piece: the teacher has read the document (`cache`), then reads the instruction to repeat it and the piece
    (`top_k`: cut to top-k targets as made)."""
    if not pieces or codec is None:
        return []
    text = f"\n\n{REPEAT}\n"
    if _has_template(codec):  # the instruction as the user's turn after the document, the assistant's reply begun
        try:
            text = chat_turn(codec, REPEAT, "system")
        except ValueError:  # a template that renders a turn differently in each conversation: the plain form
            pass
    instruction = torch.tensor(codec.encode(text), device=prompt.device)
    out = []
    for s, e in pieces:
        e = min(e, s + room - instruction.shape[0])
        if e <= s:
            continue
        ids = torch.cat([instruction, prompt[s:e]])
        logits = model(ids[None], cache=_copy(cache, 1))[0]
        out.append(_cut((ids, _log_probs(logits[instruction.shape[0] - 1:])), top_k))
    return out


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
                     groups: list[int] | None = None, decode: str = "always", writer=None,
                     pieces: list[tuple[int, int]] | None = None, top_k: int | None = None):
    """teacher_sequences for the teacher reading `prompt` (the document, or one chunk of it); `starts`: its recall
    windows' starts (None: every window of the prompt), of `width` tokens; `groups`: the training queries' question
    ids, for wording_ensemble (None: none); `writer`: (model, tokenizer) that writes the questions and self-study
    messages (None: the model itself); `pieces`: the reconstruction pieces, (start, end) in `prompt` (None:
    reconstruction_pieces of the whole prompt); `top_k`: the windows and pieces cut to top-k targets as made."""
    m, max_len = prompt.shape[0], model.config.max_seq_len
    cache = Cache.empty(model.config.n_layer)
    last_logits = model(prompt[None], cache=cache)[0, -1]  # the document's other positions' logits are never read
    room = max_len - m
    sequences, counts = [], {}
    windows = _recall_windows(model, cache, prompt, width or min(options.window_tokens, m, room), starts, top_k)
    sequences += windows
    counts["recall_windows"] = len(windows)
    if pieces is None:
        pieces = reconstruction_pieces(m, options.reconstruction, options.reconstruction_tokens)
    rebuilt = _reconstruction(model, cache, prompt, codec, pieces, room, top_k)
    sequences += rebuilt
    counts["reconstruction"] = len(rebuilt)
    if options.n_continuations:
        tokens, logits = _sample(model, cache, last_logits, options.n_continuations,
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

    written = [("questions", encode(plain_question(t)), t) for t in questions] + [("derived", encode(t), t) for t in derived]
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
        asked = [q for q in map(encode, (plain_question(t) for t in messages)) if q.shape[0] + options.answer_tokens < room]
        keep(_answer(model, cache, asked, [min(options.chat_answer_tokens, room - q.shape[0]) for q in asked], decode),
             [q.shape[0] - 1 for q in asked], [()] * len(asked))
    if templated:  # the written and derived questions, and the messages, as chat turns
        asked = ([(t, ("chat_turns",)) for t in questions] + [(question_of(t), ("chat_turns",)) for t in derived
                                                               if is_plain_question(t)]
                 + [(t, ("chat_turns",)) for t in messages])
        chat = _chat_turns(model, prompt, [t for t, _ in asked], room, codec, options.chat_answer_tokens) if asked else []
        kept = [(turn, tags) for turn, (_, tags) in zip(chat, asked) if turn is not None]
        keep([t for t, _ in kept], [t[0].shape[0] - t[1].shape[0] for t, _ in kept], [tags for _, tags in kept])
    return sequences, counts


def top_k_targets(sequences: list, k: int) -> list:
    """Each (ids, teacher log-probs (n, V)) as (ids, top-k log-probs (n, k), their token ids (n, k)): the student
    sees the teacher's distribution where it holds its mass (Cartridges keeps k = 20), at k / V of the memory. An
    item already in that form (teacher_sequences' top_k) passes as it is."""
    return [_cut(item, k) for item in sequences]


def _cut(item: tuple, k: int | None) -> tuple:
    """One (ids, log-probs (n, V)) as its top-k targets (ids, values, token ids); k None or an item cut already: as it is."""
    if k is None or len(item) == 3:
        return item
    ids, logp = item
    values, index = logp.topk(min(k, logp.shape[-1]), dim=-1)
    return ids, values, index


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
                                          writer, top_k=options.top_k)
    if options.top_k is not None:
        sequences = top_k_targets(sequences, options.top_k)
    if key is not None:
        save_stage(options.cache, key, sequences, counts, settings)
    return sequences, {**counts, "cached": False}


def _recall_windows(model, cache, prompt, width, starts: list[int] | None = None, top_k: int | None = None):
    """The prompt in windows of `width` tokens (at `starts`; None: window_starts, a stride of width // 2, the last one
    flush with the end): the teacher reads the cached prompt and then the window, the student the window alone
    (`top_k`: each cut to its top-k targets as its batch of 16 is read)."""
    starts = window_starts(prompt.shape[0], width) if starts is None else starts
    if not starts:
        return []
    windows = torch.stack([prompt[s: s + width] for s in starts])
    out = []
    for chunk in windows.split(16):
        logits = model(chunk, cache=_copy(cache, chunk.shape[0]))
        out += [_cut((w, _log_probs(x)), top_k) for w, x in zip(chunk, logits)]
    return out
