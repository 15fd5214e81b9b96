"""The teacher's answers: sampled continuations, greedy answers to many queries after one cached document (`_answered`
is the plain reference, one query at a time; `_answered_batched`, `_answered_full_passes` and `_answered_static` the
batched backends, equal to it up to float rounding), the wording ensemble and the recall windows."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models import Cache
from ...models.lm import copy_cache
from ...models.static_decode import StaticDecoder, bytes_per_row, supported
from ...runtime import device_of

STATIC_BYTES = 1 << 30  # the static cache's buffers for the answers: fewer rows at a time for a long document


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


