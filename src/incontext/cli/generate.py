"""`incontext generate TEXT`: the model, or an absorb folder on it (--adapted, several composed), continues a text;
--chat asks it as the chat template's user turn after the absorbed document's placement."""

from __future__ import annotations
import math
import sys
import torch
from ..absorb.decode import context_room, stop_tokens, stream_tokens
from ..absorb.folder import (
    adapted_placement,
    composed_folders,
)
from ..interop.models import load_model
from ..runtime import Runtime, device_of, generator_for
from ..tasks.placement import chat_turn
from ..absorb.job import codec_of as _codec


def check_generation_options(args, dtype: torch.dtype) -> None:
    """--max-new-tokens, --sample, --temperature and --top-k checked (generate, generate --prompts-file, chat); `dtype`:
    the model's (the command's Runtime)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if not args.sample and (args.temperature is not None or args.top_k is not None):
        raise ValueError("--temperature and --top-k only apply with --sample")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ValueError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.temperature is not None:
        tiny = torch.finfo(dtype).tiny
        if args.temperature < tiny:
            raise ValueError(f"--temperature {args.temperature:g} underflows {args.dtype} (its smallest normal number is "
                             f"{tiny:g}): logits / temperature would overflow")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")


def generate(args, runtime: Runtime) -> int:
    """`incontext generate TEXT`, on the command's Runtime (its --device / --dtype, resolved once by cli/commands.py)."""
    check_generation_options(args, runtime.dtype)
    if not args.text:
        raise ValueError("TEXT is empty: give the text to continue")
    placement = adapted_placement(args.adapted or []) if args.chat else "raw"  # before the model loads
    loaded = load_model(args.model, runtime=runtime)
    codec = _codec(loaded, args.model)
    runner = loaded.model if not args.adapted else composed_folders(args.adapted, loaded.model, args.model)
    stop = stop_tokens(codec, chat=args.chat)
    text = args.text
    if args.chat:
        if not hasattr(codec, "chat"):
            raise ValueError(f"--chat: model {args.model!r} has no chat template")
        text = chat_turn(codec, args.text, placement)
    ids = codec.encode(text)
    room = context_room(runner, len(ids))
    if room is not None and room < 1:
        raise ValueError(f"the text has {len(ids)} tokens: no room is left in the model's context")
    new_tokens = args.max_new_tokens if room is None else min(args.max_new_tokens, room)
    generator = generator_for(device_of(loaded.model), args.seed)  # same seed, same device: same sample
    produced, shown = [], ""
    for token in stream_tokens(runner, ids, new_tokens, greedy=not args.sample,
                               temperature=args.temperature or 1.0, top_k=args.top_k, stop_ids=stop,
                               generator=generator):
        produced.append(token)
        text_so_far = codec.decode(produced)
        if not text_so_far.endswith("\ufffd"):  # wait for the rest of a character split across tokens
            sys.stdout.write(text_so_far[len(shown):])
            sys.stdout.flush()
            shown = text_so_far
    sys.stdout.write(codec.decode(produced)[len(shown):] + "\n")
    if new_tokens < args.max_new_tokens and len(produced) == new_tokens:
        print(f"(stopped after {new_tokens} tokens: the model's context is full)", file=sys.stderr)
    return 0
