"""lm-evaluation-harness on any absorb folder: the `incontext` model of lm-eval, and its command line.

    python -m incontext.cli.lm_eval --model incontext --model_args absorbed=runs/absorbed-facts \\
        --include_path tests/data/lm_eval --tasks incontext_facts_tiny --device cpu

The command is lm-eval's own (`lm_eval ...`, every option the same) with the `incontext` model registered first:
lm-eval finds models by name in its registry, and nothing registers this one in a bare `lm_eval`. In Python,
importing this module registers it (`simple_evaluate(model="incontext", ...)`).

The model loads the folder as `incontext generate --adapted` does (absorb.folder.load_adapted: the base model named in
absorb.json, the folder checked against it, then the adapted model of any method: a PEFT adapter, a K/V prefix, a
kept prompt, ...) and scores with it: the absorbed document precedes every request, and a request's text is the query
after it (positions continue after the document). Without `absorbed`, `model=SPEC` scores the base model alone.
With lm-eval's --apply_chat_template a request is the conversation after the document as absorb placed it (the user's
turn after a document absorbed as the system turn; the whole conversation after a raw one), as `generate --chat`.

model_args: absorbed=DIR (an absorb folder), model=SPEC (the base: default the model absorb.json names; any name
`incontext absorb --model` takes), dtype=float32|bfloat16|float16|float64. --device cpu|cuda|cuda:N (lm-eval's
command line passes cuda:0 when not told: the CPU where there is no CUDA device, as lm-eval's hf model does).
lm-eval's --batch_size is accepted and ignored (one request at a time). Needs lm-eval (`pip install lm-eval==0.4.13`;
scripts/env.sh installs it); the rest of the package never imports this module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import lm_eval.models  # noqa: F401  lm-eval's own models (hf, ...) first: it adds them to an empty registry only
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as error:  # pragma: no cover - the module is only imported to use lm-eval
    raise ImportError("incontext.cli.lm_eval needs lm-evaluation-harness: pip install lm-eval==0.4.13 "
                      f"(bash scripts/env.sh installs it) ({error})") from None

from ..absorb.decode import context_room, stream_tokens
from ..absorb.folder import ABSORB_RECORD, adapted_placement, load_adapted
from ..interop.models import load_model
from ..tasks.placement import conversation_after, unmarked

NAME = "incontext"
LM_EVAL_DEFAULT_DEVICE = "cuda:0"  # lm-eval's command line passes it when --device is not given
DEFAULT_MAX_LENGTH = 2048  # the query's room for a model without a configured context


def base_spec(folder: Path) -> str:
    """The model an absorb folder was absorbed into, as absorb.json names it."""
    record_file = folder / ABSORB_RECORD
    if not record_file.is_file():
        raise FileNotFoundError(f"absorbed={folder}: no {ABSORB_RECORD} (not a finished absorb folder); "
                                "or give the base with model=SPEC")
    try:
        spec = json.loads(record_file.read_text())["model"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ValueError(f"absorbed={folder}: {ABSORB_RECORD} is corrupt (no model)") from None
    if not isinstance(spec, str):
        raise ValueError(f"absorbed={folder}: {ABSORB_RECORD} is corrupt (model is not a name)")
    return spec


class ModelArgsError(ValueError):
    """The incontext model's --model_args do not make a model (a folder that is not an absorb folder, an unknown
    argument): main() prints it as one line and exits with status 2."""


class RequestError(ValueError):
    """A request the incontext model cannot serve (a system instruction after a system-turn document, a continuation
    longer than the room left): main() prints it as one line and exits with status 2."""


@register_model(NAME)
class IncontextLM(TemplateLM):
    """An absorb folder (or a base model) of incontext as an lm-eval model: loglikelihood, loglikelihood_rolling
    and generate_until, one request at a time, with the document absorbed before every request."""

    def __init__(self, absorbed: str | None = None, model: str | None = None, device: str | None = None,
                 dtype: str = "float32", batch_size=None, max_batch_size=None, **unknown):
        super().__init__()
        try:
            self._setup(absorbed, model, device, dtype, unknown)
        except (ValueError, OSError, KeyError) as error:  # our model's arguments: one line from main(), no traceback
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            message = " ".join(str(message).split()).replace("--adapted ", "absorbed=")  # the folder as given here
            raise ModelArgsError(message) from None

    def _setup(self, absorbed, model, device, dtype, unknown) -> None:
        if unknown:
            raise ValueError(f"model_args {', '.join(sorted(unknown))}: unknown to the incontext model "
                             "(it takes absorbed=DIR, model=SPEC, dtype=...)")
        if absorbed is None and model is None:
            raise ValueError("give model_args absorbed=DIR (an absorb folder) or model=SPEC (the base model alone)")
        if absorbed is not None and not str(absorbed).strip():
            raise ValueError("model_args absorbed= is empty: give the absorb folder (absorbed=DIR)")
        folder = None if absorbed is None else Path(str(absorbed))
        spec = str(model) if model is not None else base_spec(folder)
        if device is None or device == LM_EVAL_DEFAULT_DEVICE and not torch.cuda.is_available():
            device = "cpu"  # lm-eval's command line asks for cuda:0 unless told; its hf model falls back to the CPU too
        loaded = load_model(spec, device, dtype)
        if loaded.tokenizer is None or not hasattr(loaded.tokenizer, "encode"):
            raise ValueError(f"model {spec!r} has no tokenizer: lm-eval's tasks are text")
        self.codec = loaded.tokenizer
        self.placement = "raw" if folder is None else adapted_placement([folder])  # where the document sits
        self.runner = loaded.model if folder is None else load_adapted(folder, loaded.model, spec)
        self.runner.eval()
        self._device = next(self.runner.parameters()).device
        room = context_room(self.runner, 0)  # tokens a query may have after the absorbed document
        if room is not None and room < 2:
            raise ValueError(f"absorbed={folder}: the absorbed document leaves {room} token(s) of the model's context; "
                             "lm-eval's requests need at least a question and an answer token after it")
        self._max_length = DEFAULT_MAX_LENGTH if room is None else room
        hf_tokenizer = getattr(self.codec, "tokenizer", None)
        bos = getattr(hf_tokenizer, "bos_token_id", None)
        self._eot = self.codec.eos_token_id
        self._prefix = bos if bos is not None else self._eot  # as lm-eval's hf model: BOS, else EOS
        if self._eot is None and self._prefix is None:
            raise ValueError(f"model {spec!r}: its tokenizer has neither BOS nor EOS (lm-eval's empty-context prefix)")

    # ------------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        return self._prefix

    @property
    def max_length(self) -> int:
        return self._max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # never special tokens: a model whose tokenizer starts texts with BOS reads it first by itself (hf_backend)
        return self.codec.encode(string)

    def tok_decode(self, ids) -> str:
        return self.codec.decode(ids)

    # ------------------------------------------------------------------ chat (lm-eval's --apply_chat_template)

    @property
    def tokenizer_name(self) -> str:
        name = getattr(getattr(self.codec, "tokenizer", None), "name_or_path", None) or "incontext"
        return str(name).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        template = getattr(getattr(self.codec, "tokenizer", None), "chat_template", None)
        return template if chat_template and isinstance(template, str) else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the text that follows the absorbed document, as `incontext generate --chat` renders
        it: after a document absorbed as the system turn (absorb --placement system) the user's turns, their ends and
        the assistant's start; after a raw one (or with no folder) the whole conversation as the template renders
        it."""
        if not hasattr(self.codec, "chat") or not getattr(getattr(self.codec, "tokenizer", None), "chat_template", None):
            raise ValueError("--apply_chat_template: this model's tokenizer has no chat template")
        if not add_generation_prompt:
            raise ValueError("--apply_chat_template: a task that prefills the assistant's answer (gen_prefix) is not "
                             "supported by the incontext model")
        if self.placement == "system" and any(m.get("role") == "system" for m in chat_history):
            raise RequestError("--apply_chat_template: the absorbed document is the conversation's system turn; "
                             "a system instruction (--system_instruction, a task's description) cannot follow it")
        # lm-eval records and re-tokenizes this string whole, as its own Hugging Face model does: returned unmarked
        return unmarked(conversation_after(self.codec, chat_history, self.placement))

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        """log p(continuation | document, context) and whether greedy decoding gives it; the context loses its
        oldest tokens where the two do not fit the model's room."""
        if not continuation:
            return 0.0, True
        inputs = (context + continuation)[:-1][-self._max_length:]
        if len(inputs) < len(continuation):
            raise RequestError(f"a continuation of {len(continuation)} tokens does not fit the model's room "
                             f"({self._max_length} tokens after the absorbed document)")
        logits = self.runner(torch.tensor([inputs], device=self._device))[0, -len(continuation):]
        logprobs = F.log_softmax(logits.double(), dim=-1)
        target = torch.tensor(continuation, device=logits.device)
        total = float(logprobs.gather(-1, target[:, None]).sum())
        return total, bool((logprobs.argmax(-1) == target).all())

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        from tqdm import tqdm

        results = []
        for key, context, continuation in tqdm(requests, disable=disable_tqdm, desc="incontext loglikelihood"):
            result = self._score(list(context), list(continuation))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, result)
            results.append(result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        from tqdm import tqdm

        results = []
        for (string,) in tqdm([r.args for r in requests], disable=disable_tqdm, desc="incontext rolling"):
            windows = map(lm_utils.make_disjoint_window,
                          lm_utils.get_rolling_token_windows(token_list=self.tok_encode(string),
                                                             prefix_token=self.prefix_token_id,
                                                             max_seq_len=self.max_length, context_len=1))
            total = sum(self._score(list(context), list(prediction))[0] for context, prediction in windows)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            results.append(total)
        return results

    # ------------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or, with do_sample and a temperature > 0, seeded sampling) until a stop string of `until`, the EOS
        token or max_gen_toks (default 256); the context loses its oldest tokens to leave room for the answer."""
        from tqdm import tqdm

        from ..runtime import generator_for

        results = []
        for context, gen_kwargs in tqdm([r.args for r in requests], disable=disable_tqdm, desc="incontext generate"):
            options = dict(gen_kwargs or {})
            until = options.get("until")
            until = [until] if isinstance(until, str) else list(until or [])
            if self._eot is not None:
                until.append(self.tok_decode([self._eot]))
            until = [s for s in until if s]
            max_new = int(options.get("max_gen_toks", 256))
            temperature = float(options.get("temperature") or 0.0)
            sample = bool(options.get("do_sample")) and temperature > 0
            ids = self.tok_encode(context)[-max(1, self._max_length - max_new):]
            room = context_room(self.runner, len(ids))
            new_tokens = max_new if room is None else max(0, min(max_new, room))
            produced, text = [], ""
            if new_tokens:
                tokens = stream_tokens(self.runner, ids, new_tokens, greedy=not sample,
                                       temperature=temperature if sample else 1.0, top_k=options.get("top_k"),
                                       stop_ids=set() if self._eot is None else {self._eot},
                                       generator=generator_for(self._device, 1234) if sample else None)
                for token in tokens:
                    produced.append(token)
                    text = self.tok_decode(produced)
                    if any(s in text for s in until):
                        break
            for s in until:  # the text before the first stop string, as lm-eval's models return it
                text = text.split(s)[0]
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            results.append(text)
        return results


def main(argv: list[str] | None = None) -> None:
    """lm-eval's command line with the `incontext` model registered (this module's import did it)."""
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        cli_evaluate()
    except (ModelArgsError, RequestError) as error:  # lm-eval's own errors (an unknown task) stay lm-eval's
        print(f"incontext: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
