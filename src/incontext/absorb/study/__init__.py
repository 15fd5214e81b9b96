"""The distillation data stage (Cartridges' synthesis): from a document and the model, the sequences a prompt-free
student learns and the teacher's next-token distributions on them (stage.study, cached with `study.cache`). Its rooms:
options (StudyOptions), derived (rules over the document's text), writers (what a writer model writes), answer (the
teacher's answers and continuations), cache (the disk cache) and stage (the sequences, chunked for a long document)."""

from .answer import STATIC_BYTES, wording_ensemble
from .cache import (
    FINGERPRINT_TEXT,
    load_stage,
    save_stage,
    stage_key,
    tokenizer_fingerprint,
)
from .derived import cloze, derived_queries, document_text, grounded
from .options import DERIVED_KINDS, SEED_PROMPTS, StudyOptions, seed_kinds
from .stage import (
    assign_chunks,
    chunk_spans,
    heldout_sequences,
    study,
    teacher_sequences,
    top_k_targets,
    window_starts,
)
from .writers import GROUNDED_MARGIN, QUESTION_WRITER

__all__ = ['DERIVED_KINDS', 'FINGERPRINT_TEXT', 'GROUNDED_MARGIN', 'QUESTION_WRITER', 'SEED_PROMPTS', 'STATIC_BYTES', 'StudyOptions', 'assign_chunks', 'chunk_spans', 'cloze', 'derived_queries', 'document_text', 'grounded', 'heldout_sequences', 'load_stage', 'save_stage', 'seed_kinds', 'stage_key', 'study', 'teacher_sequences', 'tokenizer_fingerprint', 'top_k_targets', 'window_starts', 'wording_ensemble']
