"""What a writer model writes about the document (the questions of a few-shot question writer, self-study messages
from seed prompts), the chat turns they become, and the grounding check of their answers."""

from __future__ import annotations

import torch

from ...models import Cache
from ...runtime import device_of
from ..decode import END_OF_TURN
from .answer import _copy, _greedy, _log_probs
from .derived import _sentences, grounded
from .options import SEED_PROMPTS, StudyOptions

GROUNDED_MARGIN = 1.0  # nats: a grounded answer's first token is this much likelier with the document than without


# A generic few-shot prompt that turns a sentence into a question about it (for a bare passage: the questions a
# user may ask are not given, so the base model writes some; nothing here comes from a task's queries)
QUESTION_WRITER = ("Sentence: The Eiffel Tower was completed in 1889.\nQuestion: When was the Eiffel Tower completed?\n\n"
                   "Sentence: Marie Curie worked as a physicist.\nQuestion: What was Marie Curie's job?\n\n"
                   "Sentence: The river Thames flows through London.\nQuestion: Which city does the Thames flow through?\n\n"
                   "Sentence: Ada Lovelace was born in London.\nQuestion: Where was Ada Lovelace born?\n\n")


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
