"""The data stage's options (`--set study.OPTION=VALUE`) and the kinds they name."""

from __future__ import annotations

from dataclasses import dataclass

from ...config import limit, option


@dataclass
class StudyOptions:
    """The data stage's options (`--set study.OPTION=VALUE`)."""

    window_tokens: int = limit(24, min=1, help="recall windows of this many tokens (stride half a window)")
    n_continuations: int = limit(2, min=0, help="continuations the teacher samples after the document")
    continuation_tokens: int = limit(32, min=1, help="tokens per continuation")
    answer_tokens: int = limit(8, min=0, help="the teacher's greedy answer tokens after each training query")
    n_questions: int = limit(0, min=0, help="questions the model writes about the document's sentences")
    n_conversations: int = limit(0, min=0, help="self-study: messages the model writes from the seed prompts")
    seed_prompts: str | tuple[str, ...] = option("structuring,summarization,question,use-case,creative", "their kinds")
    derived: int = limit(0, min=0, help="queries derived from the document's text by rules (no writer model)")
    reconstruction: int = limit(0, min=0,
        help="reconstruction pieces: after an instruction to repeat the document, the teacher repeats this many of "
             "its pieces (KVzip's signal; 0: none)")
    reconstruction_tokens: int = limit(64, min=1, help="tokens per reconstruction piece")
    derived_kinds: str | tuple[str, ...] = option("prefix,about,qa", "their kinds (derived_queries)")
    grounded: bool = option(False,
        "keep only questions and messages whose answers use the document's words, surer with it")
    message_tokens: int = limit(32, min=1, help="tokens per written message")
    chat_answer_tokens: int = limit(24, min=1, help="the teacher's answer tokens in a chat turn")
    temperature: float = limit(1.0, gt=0, help="of the sampled continuations and messages")
    chunk_tokens: int = limit(0, min=0, help="the teacher reads the document in chunks of this many tokens (0: whole)")
    wording_ensemble: bool = option(False, "one target for the wordings of one training question")
    top_k: int | None = limit(20, min=1, help="the teacher's top-k log-probs per taught position (null: all)")
    cache: str = option("", "a folder where the stage is kept and reused for the same model, document and options")

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

# The reconstruction instruction (KVzip's repeat prompt, Kim et al. 2025): after the document, then the document again.
REPEAT = "Repeat the previous context exactly."


def seed_kinds(value, known=SEED_PROMPTS, name: str = "seed_prompts") -> tuple[str, ...]:
    """seed_prompts (or derived_kinds) as given to a method (a comma string or a sequence of kinds), checked."""

    kinds = tuple(k.strip() for k in value.split(",")) if isinstance(value, str) else tuple(value)
    unknown = sorted(set(kinds) - set(known))
    if not kinds or unknown:
        raise ValueError(f"{name} must be a comma-separated subset of {','.join(known)}, got {value!r}")
    return kinds
