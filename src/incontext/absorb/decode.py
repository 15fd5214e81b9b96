"""Token-by-token generation from a model or from a model with a prompt absorbed, for streaming to a terminal.

    for token in stream_tokens(adapted, query_ids, max_new_tokens=32, stop_ids={eos}):
        print(codec.decode([token]), end="")

An adapted model continues from its `query_cache()` (one base pass per new token; the positions go on after
the absorbed prompt exactly as in its forward); one without a cache re-runs on the growing sequence.
`greedy_answers` answers the harness's text queries this way, for the metric that scores generated answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from ..models import Cache
from ..models.lm import is_causal_lm
from ..models.transformer import pick_next_token
from .protocol import AdaptedModel


def start_position(model: nn.Module) -> int:
    """The position id the first query token gets (0 for a plain model; after the prompt for most adapted ones)."""
    cache = model.query_cache() if isinstance(model, AdaptedModel) else None
    return cache.position if cache is not None else 0


def context_room(model: nn.Module, n_query: int) -> int | None:
    """How many tokens can still follow a query of n_query tokens within the model's context (None: no limit)."""
    base = model.base if isinstance(model, AdaptedModel) else model
    limit = getattr(getattr(base, "config", None), "max_seq_len", None)
    return None if limit is None else limit - start_position(model) - n_query


@torch.no_grad()
def stream_tokens(model: nn.Module, ids: list[int], max_new_tokens: int, *, greedy: bool = True,
                  temperature: float = 1.0, top_k: int | None = None, stop_ids: Iterable[int] = (),
                  generator: torch.Generator | None = None) -> Iterator[int]:
    """Yields up to max_new_tokens tokens continuing `ids` (a causal LM of either backend or an AdaptedModel), one at a time;
    stops before yielding a token of `stop_ids`."""
    if not ids:
        raise ValueError("generation needs at least one token to continue")
    stop = set(stop_ids)
    if isinstance(model, AdaptedModel):
        cache, run = model.query_cache(), model.base
    elif is_causal_lm(model):
        cache, run = Cache.empty(model.config.n_layer), model
    else:
        raise TypeError(f"stream_tokens needs a causal LM or an AdaptedModel, got {type(model).__name__}")
    sequence = torch.tensor([ids], device=next(model.parameters()).device)
    logits = (run(sequence, cache=cache) if cache is not None else model(sequence))[:, -1]
    for step in range(max_new_tokens):
        token = pick_next_token(logits, greedy, temperature, top_k, generator)
        if int(token) in stop:
            return
        yield int(token)
        if step + 1 == max_new_tokens:
            return
        if cache is not None:
            logits = run(token[:, None], cache=cache)[:, -1]
        else:  # no cache: the adapted model reads the whole continuation again
            sequence = torch.cat([sequence, token[:, None]], dim=1)
            logits = model(sequence)[:, -1]


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")  # chat templates' end-of-turn tokens


def stop_tokens(codec, chat: bool = True) -> set[int]:
    """The token ids an answer stops before, the one set every caller uses (generate, chat, the harness): the codec's
    end of sequence, and for a chat answer (`chat`) the end-of-turn tokens its vocabulary has."""
    stop = set()
    if getattr(codec, "eos_token_id", None) is not None:
        stop.add(codec.eos_token_id)
    if not chat:
        return stop
    vocab = getattr(getattr(codec, "tokenizer", None), "get_vocab", dict)()
    return stop | {vocab[token] for token in END_OF_TURN if token in vocab}


def greedy_answers(model: nn.Module, queries, codec) -> list[str]:
    """Each teacher-forced query's greedy answer (metrics that generate): the model continues the query's question
    (its inputs up to the first scored position) for at most `query.max_answer_tokens` tokens (fewer where the
    model's context ends), stopping at the end of sequence or turn; decoded, and cut at the first newline after
    its text (leading blank lines skipped)."""
    if codec is None or not hasattr(codec, "decode"):
        raise ValueError("a metric that generates answers needs the model's tokenizer (encode and decode)")
    stop, answers = stop_tokens(codec), []
    for query in queries:
        ids = query.inputs[: int(query.mask.nonzero()[0]) + 1].tolist()
        room = context_room(model, len(ids))
        budget = query.max_answer_tokens if room is None else min(query.max_answer_tokens, room)
        produced: list[int] = []
        if budget > 0:
            for token in stream_tokens(model, ids, budget, stop_ids=stop):
                produced.append(token)
                if getattr(query, "one_line", True) and "\n" in codec.decode(produced).lstrip():
                    break
        text = codec.decode(produced).lstrip()
        answers.append(text.split("\n", 1)[0] if getattr(query, "one_line", True) else text.strip())
    return answers
