"""Where a document goes for a chat model: as its chat template places one, or raw before the conversation.

    text = placed_document(codec, document, "system")   # the tokens a method absorbs
    query = chat_turn(codec, "Where was Ada born?", "system")   # what follows them: the user's turn, the reply's start

"system": the document is the conversation's system turn (a template without a system role folds it into the first
user turn, as Gemma's does); the absorbed text runs up to where the first user message begins, so the user's
question, its end of turn and the assistant's start follow it exactly as they would in one rendered conversation.
"raw": the document as it is, then the conversation as the template renders it alone (with the template's default
system prompt, SmolLM2's "You are a helpful AI assistant named SmolLM..."): the placement before this option existed.
"""

from __future__ import annotations

PLACEMENTS = ("auto", "system", "raw")
_MARK = "\u2063incontext-mark\u2063"  # stands for the user's message while the template renders around it
# A document or a message is data: text the chat template's special tokens may never come from (a document that holds
# "<|im_end|><|im_start|>user" must not open a turn). A codec that `reads_data_marks` (interop.models' codecs) encodes
# what lies between these two marks as plain text (a special token's text as its characters) and the rest (the
# template's own text) with its special tokens; other codecs get the text unmarked.
DATA_OPEN, DATA_CLOSE = "\ue000", "\ue001"


def as_data(codec, text: str) -> str:
    """`text` marked as data for a codec that reads the marks (as it is for one that does not); the marks' own
    characters (Unicode private use) are dropped from it."""
    if not getattr(codec, "reads_data_marks", False):
        return text
    return DATA_OPEN + text.replace(DATA_OPEN, "").replace(DATA_CLOSE, "") + DATA_CLOSE


def unmarked(text: str) -> str:
    """`text` without as_data's marks (what it reads as)."""
    return text.replace(DATA_OPEN, "").replace(DATA_CLOSE, "")


def data_segments(text: str) -> list[tuple[str, bool]]:
    """(segment, is_data) pieces of a text marked by as_data, in order (empty pieces left out)."""
    out, rest = [], text
    while rest:
        before, opened, after = rest.partition(DATA_OPEN)
        if before:
            out.append((before, False))
        if not opened:
            break
        inside, _, rest = after.partition(DATA_CLOSE)
        if inside:
            out.append((inside, True))
    return out


def has_chat_template(codec) -> bool:
    tokenizer = getattr(codec, "tokenizer", None)
    return hasattr(codec, "chat") and bool(getattr(tokenizer, "chat_template", None) if tokenizer is not None else True)


def resolve_placement(placement: str, codec) -> str:
    """auto: system for a tokenizer with a chat template, raw otherwise; system without a template is refused."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; placements: {', '.join(PLACEMENTS)}")
    if placement == "auto":
        return "system" if has_chat_template(codec) else "raw"
    if placement == "system" and not has_chat_template(codec):
        raise ValueError("placement system needs a tokenizer with a chat template; this one has none (use raw)")
    return placement


def _head(codec, system: str) -> tuple[str, str]:
    """(the conversation rendered up to the first user message's text, the rest after it) for a system turn."""
    full = codec.chat([{"role": "system", "content": system}, {"role": "user", "content": _MARK}],
                      add_generation_prompt=True)
    if full.count(_MARK) != 1:
        raise ValueError("the chat template does not render the user's message once, as given")
    head, _, tail = full.partition(_MARK)
    return head, tail


def placed_document(codec, document: str, placement: str) -> str:
    """The text a method absorbs for `document` (placement system or raw; see the module docstring)."""
    document = as_data(codec, document)
    if placement == "raw":
        return document
    head, _ = _head(codec, document)
    if document not in head:
        raise ValueError("the chat template does not render the system turn's text as given")
    return head


def chat_turn(codec, message: str, placement: str) -> str:
    """The text that follows an absorbed document for one user message and the assistant's reply to start: after a
    system-placed document, the message, its end of turn and the generation prompt (the same for any document);
    after a raw one, the whole conversation as the template renders it alone."""
    return conversation_after(codec, [{"role": "user", "content": message}], placement)


def conversation_after(codec, messages: list[dict[str, str]], placement: str) -> str:
    """chat_turn for a conversation of several turns (user and assistant messages, the last a user's)."""
    messages = [{**m, "content": as_data(codec, m["content"])} for m in messages]
    if placement == "raw":
        return codec.chat(messages, add_generation_prompt=True)
    head, tail = _head(codec, "D")
    full = codec.chat([{"role": "system", "content": "D"}, *messages], add_generation_prompt=True)
    if not full.startswith(head) or not full.endswith(tail):
        raise ValueError("the chat template renders a user's message differently from one conversation to the next")
    return full[len(head):]
