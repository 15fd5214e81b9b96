"""`incontext chat` and `incontext generate --prompts-file`: one model load, many answers.

    incontext chat --model smollm2 --adapted adapted/            # a conversation; /reset, /adapted DIR, /exit
    printf 'Where was Alia born?\\n/reset\\nAnd Ben?\\n' | incontext chat --model smollm2 --adapted adapted/
    incontext generate --model smollm2 --adapted adapted/ --chat --prompts-file questions.txt --jsonl

A model with a chat template converses through it (the whole conversation re-read each turn, answers stop at the
end of the assistant's turn); one without (a base model) in plain "Q: ...\\nA:" turns, each answer ending at its
line's end. cli/commands.py imports this module only when one of the two commands runs (it imports torch).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..absorb.decode import context_room, stop_tokens, stream_tokens
from ..absorb.folder import adapted_placement, composed_folders
from ..interop.models import load_model
from ..runtime import Runtime, device_of, generator_for
from ..tasks.placement import chat_turn, conversation_after
from ..absorb.job import codec_of as _codec
from .generate import check_generation_options
from ..tasks.queries import plain_question

COMMANDS = "/reset (forget the conversation), /adapted DIR [DIR ...] (answer from absorb folders, composed), " \
           "/base (the model alone), /exit"


@dataclass
class Sampling:
    max_new_tokens: int
    greedy: bool = True
    temperature: float = 1.0
    top_k: int | None = None
    seed: int = 0


def has_template(codec) -> bool:
    """Whether the codec renders chat turns (a Hugging Face tokenizer with a chat template)."""
    if not hasattr(codec, "chat"):
        return False
    try:
        return bool(getattr(codec.tokenizer, "chat_template", None))
    except (OSError, ValueError):
        return False


def stream_answer(runner, codec, ids: list[int], sampling: Sampling, stop: set[int], generator, out: TextIO | None,
                  line_end: bool = False, escape: bool = False) -> tuple[str, int]:
    """Generate after `ids`, writing the text to `out` as it comes (a character split across tokens waits for the
    rest); `line_end`: the answer ends before its first line break after some text (plain Q/A turns); `escape`:
    line breaks written as the two characters \\n (one output line per answer). (text, tokens produced)."""
    room = context_room(runner, len(ids))
    new_tokens = sampling.max_new_tokens if room is None else min(sampling.max_new_tokens, room)
    produced, shown, text = [], "", ""

    def show(piece: str) -> None:
        out.write(piece.replace("\r", "\\r").replace("\n", "\\n") if escape else piece)
        out.flush()

    for token in stream_tokens(runner, ids, new_tokens, greedy=sampling.greedy, temperature=sampling.temperature,
                               top_k=sampling.top_k, stop_ids=stop, generator=generator):
        produced.append(token)
        text = codec.decode(produced)
        if line_end:  # a plain turn's answer: from its first character to the end of its line
            text = text.lstrip()
            if "\n" in text:
                text = text.split("\n", 1)[0]
                break
        if not text.endswith("\ufffd") and out is not None:
            show(text[len(shown):])
            shown = text
    if out is not None and text.startswith(shown):
        show(text[len(shown):])
    return text, len(produced)


# ----------------------------------------------------------------------------- chat


@dataclass
class Conversation:
    """The turns so far and how they become the model's text: the chat template, or plain Q/A lines."""
    codec: object
    template: bool
    turns: list[tuple[str, str]] = field(default_factory=list)  # (user, assistant)
    placement: str = "raw"  # where the absorbed documents were placed (absorb --placement): the text after them

    def text(self, question: str) -> str:
        if self.template:
            messages = []
            for user, answer in self.turns:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            messages.append({"role": "user", "content": question})
            return conversation_after(self.codec, messages, self.placement)
        return "".join(f"{plain_question(user)} {answer.strip()}\n" for user, answer in self.turns) + plain_question(question)


def _text(line: str) -> str | None:
    """`line` if it is text (encodes as UTF-8), else None: bytes that were not UTF-8 come in as lone surrogates."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return line


def _lines(stream: TextIO, interactive: bool):
    """The input's lines without their ends; None for a line that is not UTF-8 text (the session goes on)."""
    raw = None if interactive else getattr(stream, "buffer", None)  # bytes, decoded here: a bad line is one line
    while True:
        if interactive:
            try:
                line = input("> ")
            except EOFError:
                print(file=sys.stderr)
                return
        elif raw is not None:
            data = raw.readline()
            if not data:
                return
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError:
                yield None
                continue
        else:
            line = stream.readline()
            if not line:
                return
        text = _text(line)
        yield None if text is None else text.rstrip("\r\n")


def _say(message: str) -> None:
    print("incontext: " + " ".join(message.split()), file=sys.stderr)


def chat(args, runtime: Runtime, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """An interactive conversation with the model (and --adapted folders) on the command's Runtime (its --device /
    --dtype, resolved once by cli/commands.py); reads lines from stdin (a prompt on a terminal), answers on stdout (read from a
    pipe: one line each, line breaks in an answer written as \\n); notes and one-line complaints on stderr."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout
    check_generation_options(args, runtime.dtype)
    placement = adapted_placement(args.adapted or [])
    loaded = load_model(args.model, runtime=runtime)
    codec = _codec(loaded, args.model)
    runner = loaded.model if not args.adapted else composed_folders(args.adapted, loaded.model, args.model)
    template = has_template(codec)
    stop = stop_tokens(codec, template)
    conversation = Conversation(codec, template, placement=placement)
    sampling = Sampling(args.max_new_tokens, not args.sample, args.temperature or 1.0, args.top_k, args.seed)
    generator = generator_for(device_of(loaded.model), args.seed)
    interactive = stdin.isatty() if stdin is sys.stdin else False
    where = f" with {', '.join(map(str, args.adapted))}" if args.adapted else ""
    if interactive:
        print(f"chatting with {loaded.description}{where} ({'chat template' if template else 'plain Q/A turns'}); "
              f"commands: {COMMANDS}", file=sys.stderr)
    skipped = refused = answered = 0
    for line in _lines(stdin, interactive):
        if line is None:
            skipped += 1
            _say("a line that is not UTF-8 text was skipped; the conversation goes on")
            continue
        question = line.strip()
        if not question:
            continue
        if question.startswith("/"):
            command, _, rest = question.partition(" ")
            if command in ("/exit", "/quit"):
                break
            if command == "/reset":
                conversation.turns.clear()
                _say("(the conversation starts over)")
            elif command == "/base":
                runner = loaded.model
                conversation.turns.clear()
                conversation.placement = "raw"
                _say(f"(answering from {loaded.description} alone; the conversation starts over)")
            elif command == "/adapted":
                folders = [Path(p) for p in rest.split()]
                if not folders:
                    _say("/adapted needs one or more absorb folders (/base: the model alone)")
                    continue
                try:
                    placement = adapted_placement(folders)
                    runner = composed_folders(folders, loaded.model, args.model)
                    conversation.placement = placement
                except (ValueError, OSError, KeyError) as error:
                    message = error.args[0] if isinstance(error, KeyError) and error.args else error
                    _say(f"{str(message).replace('absorb folder', '/adapted', 1)}; still answering as before")
                    continue
                conversation.turns.clear()
                _say(f"(answering from {', '.join(map(str, folders))}; the conversation starts over)")
            elif command == "/help":
                _say(f"commands: {COMMANDS}")
            else:
                _say(f"unknown command {command}: {COMMANDS}")
            continue
        ids = codec.encode(conversation.text(question))
        while conversation.turns and _no_room(runner, ids):  # forget the oldest turns until the question fits
            conversation.turns.pop(0)
            ids = codec.encode(conversation.text(question))
        if _no_room(runner, ids):
            refused += 1
            _say(f"the question has {len(ids)} tokens: no room is left in the model's context for an answer")
            continue
        try:
            answer, _ = stream_answer(runner, codec, ids, sampling, stop, generator, stdout, line_end=not template,
                                      escape=not interactive)  # scripted: one output line per answer
        except KeyboardInterrupt:  # Ctrl-C stops this answer; the conversation goes on without it
            stdout.write("\n")
            stdout.flush()
            _say("(interrupted: the answer stopped; ask again, or /exit)")
            continue
        stdout.write("\n")
        stdout.flush()
        answered += 1
        conversation.turns.append((question, answer))
    # bad input was seen (each line said so on stderr), or every question was refused for lack of room
    return 2 if skipped or (refused and not answered) else 0


def _no_room(runner, ids: list[int]) -> bool:
    room = context_room(runner, len(ids))
    return room is not None and room < 1


# ----------------------------------------------------------------------------- generate --prompts-file


def read_prompts(file: Path) -> list[tuple[int, str]]:
    """--prompts-file FILE: one prompt a line, the two characters \\n standing for a line break inside one; blank
    lines skipped. (line number, prompt) pairs."""
    if file.is_dir():
        raise ValueError(f"--prompts-file {file} is a folder, not a file (one prompt a line)")
    if not file.is_file():
        raise FileNotFoundError(f"--prompts-file {file}: no such file")
    try:
        lines = file.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"--prompts-file {file} is not UTF-8 text") from None
    prompts = [(number, line.replace("\\n", "\n")) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts-file {file} holds no prompts (one a line)")
    return prompts


def generate_many(args, runtime: Runtime, stdout: TextIO | None = None) -> int:
    """Answer every prompt of --prompts-file with one model load (on the command's Runtime): one output line per prompt
    (line breaks in an answer written as \\n), or with --jsonl one JSON record ({"line", "prompt", "output",
    "tokens"}). Every prompt is checked to fit the context before the first answer."""
    stdout = stdout or sys.stdout
    if args.text:
        raise ValueError("give the text with exactly one of TEXT and --prompts-file")
    check_generation_options(args, runtime.dtype)
    prompts = read_prompts(args.prompts_file)
    loaded = load_model(args.model, runtime=runtime)
    codec = _codec(loaded, args.model)
    runner = loaded.model if not args.adapted else composed_folders(args.adapted, loaded.model, args.model)
    if args.chat and not hasattr(codec, "chat"):
        raise ValueError(f"--chat: model {args.model!r} has no chat template")
    stop = stop_tokens(codec, bool(args.chat))
    placement = adapted_placement(args.adapted or []) if args.chat else "raw"
    encoded = []
    for number, prompt in prompts:  # as generate reads TEXT: a user turn of the template with --chat
        text = chat_turn(codec, prompt, placement) if args.chat else prompt
        ids = codec.encode(text)
        if not ids or _no_room(runner, ids):
            raise ValueError(f"--prompts-file {args.prompts_file} line {number}: the prompt has {len(ids)} tokens: "
                             + ("no room is left in the model's context" if ids else "nothing to continue"))
        encoded.append((number, prompt, ids))
    sampling = Sampling(args.max_new_tokens, not args.sample, args.temperature or 1.0, args.top_k, args.seed)
    for number, prompt, ids in encoded:
        generator = generator_for(device_of(loaded.model), args.seed)  # each prompt as its own generate run
        if args.jsonl:
            text, tokens = stream_answer(runner, codec, ids, sampling, stop, generator, None)
            stdout.write(json.dumps({"line": number, "prompt": prompt, "output": text, "tokens": tokens},
                                    ensure_ascii=False) + "\n")
        else:
            stream_answer(runner, codec, ids, sampling, stop, generator, stdout, escape=True)
            stdout.write("\n")
        stdout.flush()
    return 0
