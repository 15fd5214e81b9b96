"""Context distillation ("prompt baking") into a LoRA adapter: the practical baseline the other methods are
weighed against. A peft LoRA on a copy of the frozen base (the student, without the prompt) is trained to match
the next-token distributions of the base with the prompt (the teacher), by KL(teacher || student), on:

- windows of the prompt's own text: the student reads the window alone, the teacher the full prefix;
- continuations the teacher samples from the prompt (seeded);
- `train_queries`, when the task gives some (never evaluation queries): teacher prompt + query, student query.

The student always runs as it will at query time: inputs start at position M (the prompt's length), as for
dynamic evaluation (`UpdatedWeights`). Nothing else reaches the method: it reads the model, the prompt and the
training queries, and draws all randomness from its own seeded generator.

    adapted = get_absorb_method("distill-lora", rank=8, steps=40).absorb(model, prompt, train_queries=[q1, q2])
    logits = adapted(query)        # the LoRA merged into a copy of the base: base speed
    interop.lora_export.save_peft_adapter(adapted, to_hf_llama(model), folder)  # the adapter alone, for peft
"""

from __future__ import annotations

import copy
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..models import Cache
from ..models.lm import CausalLM, copy_cache, is_causal_lm
from .base import AbsorbMethod, AdaptedModel

# linear layers of a Transformer block a LoRA can target (fused qkv and, for SwiGLU, fused gate/up)
LORA_TARGETS = ("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")


@dataclass(frozen=True)
class LoRASpec:
    rank: int
    alpha: float
    modules: tuple[str, ...]  # full module names in the CausalLM, e.g. "blocks.0.attn.qkv"

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def _factor_key(module: str, factor: str) -> str:
    return f"{module.replace('.', '_')}_{factor}"  # buffer names may not contain dots


class DistilledLoRA(AdaptedModel):
    """The base with a LoRA adapter W + (alpha / r) B A on `spec.modules`; queries start at position `offset`.

    merged: B A is added into the base's weights (queries at base speed) and the factors are kept as buffers
    (for export). Unmerged: the base carries peft's LoRA layers, which compute W x + (alpha / r) B A x."""

    method = "distill-lora"

    def __init__(self, base: CausalLM, spec: LoRASpec, offset: int, merged: bool):
        super().__init__(base)
        self.spec, self.offset, self.merged = spec, offset, merged
        self.history: dict[str, Any] = {}  # training record of absorb(); not saved
        if merged:
            self.factors = nn.Module()
            for name in spec.modules:
                linear = base.get_submodule(name)
                n_in, n_out = linear_shape(linear)
                self.factors.register_buffer(_factor_key(name, "A"), linear.weight.new_zeros(spec.rank, n_in))
                self.factors.register_buffer(_factor_key(name, "B"), linear.weight.new_zeros(n_out, spec.rank))
        else:
            inject_lora(base, spec, None)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.base(query, position_offset=self.offset)

    def query_cache(self) -> Cache:
        return Cache.empty(self.base.config.n_layer, position=self.offset)

    def lora_factors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Module name -> (A (r, in), B (out, r)); the update of each module's weight is spec.scaling * B @ A."""
        if self.merged:
            return {name: (getattr(self.factors, _factor_key(name, "A")), getattr(self.factors, _factor_key(name, "B")))
                    for name in self.spec.modules}
        return injected_factors(self.base, self.spec)

    @torch.no_grad()
    def merged_model(self) -> "DistilledLoRA":
        """A merged copy (W <- W + scaling B A in each target); `self` is left as it is."""
        if self.merged:
            return copy.deepcopy(self)
        base = copy.deepcopy(self.base)
        factors = {name: (a.detach().clone(), b.detach().clone()) for name, (a, b) in self.lora_factors().items()}
        merge_lora(base, self.spec)
        merged = DistilledLoRA(base, self.spec, self.offset, merged=True)
        for name, (a, b) in factors.items():
            getattr(merged.factors, _factor_key(name, "A")).copy_(a)
            getattr(merged.factors, _factor_key(name, "B")).copy_(b)
        merged.history = self.history
        return merged.eval()

    def extra_state(self) -> dict[str, Any]:
        return {"offset": self.offset, "merged": self.merged, "rank": self.spec.rank, "alpha": self.spec.alpha,
                "modules": list(self.spec.modules)}

    @classmethod
    def empty(cls, base, extra):
        spec = LoRASpec(extra["rank"], extra["alpha"], tuple(extra["modules"]))
        return cls(base, spec, extra["offset"], extra["merged"])


def lora_spec(model: CausalLM, rank: int, alpha: float, targets: tuple[str, ...], layers: range | None = None) -> LoRASpec:
    """A LoRA on the `targets` (roles, see LORA_TARGETS) of the given blocks (all by default); the backend names
    the modules (our fused linears, or the family's own modules from the families table)."""
    return LoRASpec(int(rank), float(alpha), model.lora_modules(tuple(targets), layers))


def linear_shape(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of a linear layer: nn.Linear, or transformers' Conv1D (weight stored (in, out))."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    weight = module.weight
    return weight.shape[0], weight.shape[1]


def inject_lora(model: CausalLM, spec: LoRASpec, generator: torch.Generator | None) -> list[nn.Parameter]:
    """peft LoRA layers (dropout 0) on the named linears of `model`, in place, everything else frozen;
    initialised as peft does (A ~ kaiming-uniform(a=sqrt(5)), B = 0), from `generator` when given. Returns the
    factors."""
    from peft import LoraConfig, inject_adapter_in_model

    conv1d = any(not isinstance(model.get_submodule(name), nn.Linear) for name in spec.modules)  # GPT-2: (in, out)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=0.0, target_modules=list(spec.modules),
                        fan_in_fan_out=conv1d)
    with torch.random.fork_rng(devices=[]):  # peft initialises from the global generator; leave it untouched
        inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    if generator is not None:
        init_lora_factors(injected_factors(model, spec).values(), generator)
    return [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def init_lora_factors(factors, generator: torch.Generator) -> None:
    """peft's initialisation (A ~ kaiming-uniform(a=sqrt(5)), B = 0) from our seeded generator."""
    for a, b in factors:
        bound = 1.0 / math.sqrt(a.shape[1])
        a.copy_(torch.empty(a.shape, dtype=torch.float64).uniform_(-bound, bound, generator=generator))
        b.zero_()


def injected_factors(model: CausalLM, spec: LoRASpec) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    layers = {name: model.get_submodule(name) for name in spec.modules}
    return {name: (layer.lora_A["default"].weight, layer.lora_B["default"].weight) for name, layer in layers.items()}


@torch.no_grad()
def merge_lora(model: CausalLM, spec: LoRASpec) -> None:
    """W <- W + scaling B A in each of spec's modules, and peft's layers replaced by the plain linears, in place."""
    for name in spec.modules:
        parent_name, child = name.rsplit(".", 1)
        parent = model.get_submodule(parent_name)
        layer = getattr(parent, child)
        layer.merge()  # peft: base weight += scaling * B @ A
        setattr(parent, child, layer.base_layer)


# ----------------------------------------------------------------------------- the method

# A generic few-shot prompt that turns a sentence into a question about it (for a bare passage: the questions a
# user may ask are not given, so the base model writes some; nothing here comes from a task's queries)
QUESTION_WRITER = ("Sentence: The Eiffel Tower was completed in 1889.\nQuestion: When was the Eiffel Tower completed?\n\n"
                   "Sentence: Marie Curie worked as a physicist.\nQuestion: What was Marie Curie's job?\n\n"
                   "Sentence: The river Thames flows through London.\nQuestion: Which city does the Thames flow through?\n\n"
                   "Sentence: Ada Lovelace was born in London.\nQuestion: Where was Ada Lovelace born?\n\n")


class DistillLoRA(AbsorbMethod):
    """Distil the prompted model into a LoRA on the model without the prompt (see the module docstring).

    Training sequences (each: what the student reads, and the teacher's next-token log-probabilities for its
    last positions), built once before training:

    - recall windows: the prompt cut into windows of `window_tokens` (stride half a window); the teacher reads
      the whole prompt and then the window again, the student the window alone, so the student learns to
      continue the prompt's text as the teacher does when it can look the text up (a teacher that reads only
      the prefix before the window knows no fact stated in the window: nothing to learn);
    - `n_continuations` continuations of `continuation_tokens` the teacher samples after the prompt;
    - each training query (never an evaluation query), followed by `answer_tokens` the teacher answers greedily;
    - with a tokenizer (`use_codec`; `incontext absorb` gives the model's): up to `n_questions` questions
      the base model writes about the prompt's sentences (QUESTION_WRITER), each as "Q: ...\\nA:" plus the
      teacher's answer, and, where the codec has a chat template, as a chat turn: the teacher reads the prompt
      and the question in the user turn, the student the question alone, and the student learns the teacher's
      answer (up to `chat_answer_tokens`, to its end of turn); with `contrast`, each question that names one of
      the passage's subjects (`subjects`) is also asked about every other subject (up to `n_questions` more), so
      that the same question about two people gets two different answers (facts bound to their own person).

    Each epoch visits every sequence once in a seeded random order, `batch_size` per AdamW step. Training stops
    after `steps` steps, or earlier when the mean KL of the last `patience` steps is not `min_improvement`
    (relative) below the mean of the `patience` steps before. `autocast=True` runs the student's forward and
    backward in bfloat16 autocast on CPU (faster matmuls; the LoRA factors and the loss stay float32).
    Randomness comes from one generator seeded with `seed` (CPU). The defaults (steps, batch_size, window_tokens)
    were chosen on validation episodes of the `facts` task on SmolLM2 (seed 10000, never the test episodes). On the
    chat path (benchmarks/distill_lora_facts.py, same validation episodes) contrast, MLP targets, 96 steps and bf16
    autocast changed the count of right answers by no more than noise, so they stay off."""

    name = "distill-lora"
    needs = "a token-input causal LM"

    def __init__(
        self,
        rank: int = 8,
        alpha: float = 16.0,
        target_modules: tuple[str, ...] | list[str] = ("attn.qkv", "attn.out"),
        steps: int = 48,
        learning_rate: float = 3e-3,
        n_continuations: int = 2,
        continuation_tokens: int = 32,
        window_tokens: int = 24,
        answer_tokens: int = 8,
        n_questions: int = 16,
        contrast: bool = False,
        chat_answer_tokens: int = 24,
        batch_size: int = 4,
        temperature: float = 1.0,
        patience: int = 8,
        min_improvement: float = 0.01,
        autocast: bool = False,
        merge: bool = True,
        seed: int = 0,
        progress: bool = True,
    ):
        positive = {"rank": rank, "alpha": alpha, "learning_rate": learning_rate, "continuation_tokens": continuation_tokens,
                    "window_tokens": window_tokens, "batch_size": batch_size, "temperature": temperature,
                    "patience": patience, "chat_answer_tokens": chat_answer_tokens}
        for key, value in positive.items():
            if not value > 0:
                raise ValueError(f"distill-lora: {key} must be > 0, got {value}")
        counts = {"steps": steps, "n_continuations": n_continuations, "answer_tokens": answer_tokens,
                  "n_questions": n_questions, "min_improvement": min_improvement}
        for key, value in counts.items():
            if not value >= 0:
                raise ValueError(f"distill-lora: {key} must be >= 0, got {value}")
        if isinstance(target_modules, str):  # --set target_modules=attn.qkv,mlp.fc_in
            target_modules = tuple(t.strip() for t in target_modules.split(","))
        target_modules = tuple(target_modules)
        unknown = sorted(set(target_modules) - set(LORA_TARGETS))
        if not target_modules or unknown:
            raise ValueError(f"distill-lora: target_modules must be a non-empty subset of {LORA_TARGETS}, "
                             f"got {target_modules}")
        self.rank, self.alpha, self.target_modules = int(rank), float(alpha), target_modules
        self.steps, self.learning_rate, self.batch_size = steps, learning_rate, batch_size
        self.n_continuations, self.continuation_tokens = n_continuations, continuation_tokens
        self.window_tokens, self.answer_tokens = window_tokens, answer_tokens
        self.n_questions, self.chat_answer_tokens, self.contrast = n_questions, chat_answer_tokens, contrast
        self.temperature, self.patience, self.min_improvement = temperature, patience, min_improvement
        self.autocast, self.merge, self.seed, self.progress = autocast, merge, seed, progress
        self.codec = None

    def use_codec(self, codec) -> "DistillLoRA":
        """Gives the method the model's tokenizer (encode, decode; chat for chat turns): it then also trains on
        questions about the prompt (see the class docstring). Not an option: a tokenizer is no --set value."""
        if not (hasattr(codec, "encode") and hasattr(codec, "decode")):
            raise ValueError("distill-lora: the codec must be a tokenizer with encode and decode")
        self.codec = codec
        return self

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model):
            return f"needs a token-input causal LM, got {type(model).__name__}"
        if not model.config.tokens:
            return "needs a token-input causal LM; this model reads vectors"
        return None

    def _absorb(self, model: CausalLM, prompt: torch.Tensor, loss_mask: torch.Tensor | None,
                train_queries: list[torch.Tensor] | None) -> DistilledLoRA:
        """`loss_mask` is ignored (the student matches the teacher everywhere); `train_queries` must never be
        evaluation queries."""
        max_len = model.config.max_seq_len
        prompt = _prompt_ids(prompt, max_len)
        m = prompt.shape[0]
        queries = _query_ids(train_queries, m, max_len)
        generator = torch.Generator().manual_seed(self.seed)

        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            sequences, counts = self._teacher_targets(model, prompt, queries, generator)
            spec = lora_spec(model, self.rank, self.alpha, self.target_modules)
            adapted = DistilledLoRA(copy.deepcopy(model), spec, offset=m, merged=False).eval()
        finally:
            model.train(was_training)
        init_lora_factors(adapted.lora_factors().values(), generator)
        teacher_seconds = time.perf_counter() - start
        adapted.history = self._train(adapted, sequences, generator)
        adapted.history.update(pool=counts, teacher_seconds=teacher_seconds,
                               train_seconds=time.perf_counter() - start - teacher_seconds)
        return adapted.merged_model() if self.merge else adapted

    @torch.no_grad()
    def _teacher_targets(self, model, prompt, queries, generator):
        """The training sequences as (student tokens (L,), teacher log-probs (n, V) for the last n <= L
        positions) pairs, and how many of each kind."""
        m, max_len = prompt.shape[0], model.config.max_seq_len
        cache = Cache.empty(model.config.n_layer)
        prompt_logits = model(prompt[None], cache=cache)[0]
        room = max_len - m
        sequences, counts = [], {}
        windows = _recall_windows(model, cache, prompt, min(self.window_tokens, m, room))
        sequences += windows
        counts["recall_windows"] = len(windows)
        if self.n_continuations:
            tokens, logits = _sample(model, cache, prompt_logits[-1], self.n_continuations,
                                     min(self.continuation_tokens, room), self.temperature, generator)
            sequences += [(t, _log_probs(x)) for t, x in zip(tokens, logits)]
        counts["continuations"] = self.n_continuations
        questions = self._questions(model, prompt) if self.codec is not None and self.n_questions else []
        if self.contrast and questions:
            questions += contrastive_questions(questions, subjects(self.codec.decode(prompt.tolist())), self.n_questions)
        device = prompt.device  # every tensor made here follows the model (a CUDA model gets CUDA ids)
        plain = queries + [q for q in (torch.tensor(self.codec.encode(f"Q: {text}\nA:"), device=device) for text in questions)
                           if q.shape[0] + self.answer_tokens < room]
        for query in plain:
            sequences.append(_answered(model, _copy(cache), query, min(self.answer_tokens, room - query.shape[0])))
        counts["train_queries"], counts["questions"] = len(queries), len(plain) - len(queries)
        chat = self._chat_turns(model, prompt, questions, room) if questions and hasattr(self.codec, "chat") else []
        sequences += chat
        counts["chat_turns"] = len(chat)
        return sequences, counts

    def _questions(self, model, prompt) -> list[str]:
        """Questions the base model (without the prompt) writes about up to n_questions of the prompt's
        sentences, spread evenly over the prompt."""
        sentences = [s for s in _sentences(self.codec.decode(prompt.tolist())) if len(s.split()) >= 3]
        if len(sentences) > self.n_questions:
            sentences = [sentences[round(i * len(sentences) / self.n_questions)] for i in range(self.n_questions)]
        questions = []
        for sentence in sentences:
            ids = torch.tensor(self.codec.encode(f"{QUESTION_WRITER}Sentence: {sentence}\nQuestion:"), device=prompt.device)
            if ids.shape[0] + 24 > model.config.max_seq_len:
                continue
            cache = Cache.empty(model.config.n_layer)
            logits = model(ids[None], cache=cache)[0, -1]
            out = []
            for _ in range(24):  # greedy, to the end of the line
                token = int(logits.argmax())
                if "\n" in self.codec.decode([token]):
                    break
                out.append(token)
                logits = model(torch.tensor([[token]], device=prompt.device), cache=cache)[0, -1]
            question = self.codec.decode(out).strip()
            if question.endswith("?") and question not in questions:
                questions.append(question)
        return questions

    def _chat_turns(self, model, prompt, questions, room) -> list:
        """Each question as a chat turn: the teacher reads the prompt and the question in the user turn and
        answers greedily (to its end of turn); the student reads the question alone and learns the answer."""
        codec, eos = self.codec, getattr(self.codec, "eos_token_id", None)
        marker = "\u0000QUESTION\u0000"
        template = codec.chat([{"role": "user", "content": f"{codec.decode(prompt.tolist()).strip()}\n\n{marker}"}],
                              add_generation_prompt=True)
        head, tail = template.split(marker)
        head_ids = torch.tensor(codec.encode(head), device=prompt.device)
        if head_ids.shape[0] + 64 > model.config.max_seq_len:
            return []
        head_cache = Cache.empty(model.config.n_layer)
        model(head_ids[None], cache=head_cache)
        out = []
        for question in questions:
            student = torch.tensor(codec.encode(codec.chat([{"role": "user", "content": question}], add_generation_prompt=True)),
                                   device=prompt.device)
            teacher = torch.tensor(codec.encode(question + tail), device=prompt.device)
            n = min(self.chat_answer_tokens, room - student.shape[0],
                    model.config.max_seq_len - head_ids.shape[0] - teacher.shape[0])
            if n < 1:
                continue
            cache = _copy(head_cache)
            first = model(teacher[None], cache=cache)[0, -1]
            tokens, logits = _greedy(model, cache, first, n, eos)
            out.append((torch.cat([student, tokens[:-1]]), _log_probs(logits)))
        return out

    @torch.enable_grad()  # trains even when the caller runs under torch.no_grad()
    def _train(self, adapted: DistilledLoRA, sequences, generator) -> dict[str, Any]:
        params = [p for p in adapted.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        losses: list[float] = []
        stopped_early = False
        order: list[int] = []
        bar = tqdm(total=self.steps, desc="distill-lora", unit="step", disable=not self.progress, leave=False)
        for _ in range(self.steps if sequences else 0):
            if len(order) < self.batch_size:
                order += torch.randperm(len(sequences), generator=generator).tolist()
            picked, order = order[: self.batch_size], order[self.batch_size:]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss = _kl_loss(adapted, [sequences[i] for i in picked])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(kl=f"{losses[-1]:.4f}")
            if _plateau(losses, self.patience, self.min_improvement):
                stopped_early = True
                break
        bar.close()
        for p in params:
            p.requires_grad_(False)
        return {"kl": losses, "steps": len(losses), "stopped_early": stopped_early}


# ----------------------------------------------------------------------------- helpers


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text) if s.strip()]


def subjects(text: str) -> list[str]:
    """The names a passage is about: runs of two or more capitalised words that open at least two of its sentences
    (in a facts passage, the people), in order of first appearance."""
    opening = [m.group(0) for s in _sentences(text) if (m := re.match(r"(?:[A-Z][\w-]*[ ]+)+[A-Z][\w-]*", s))]
    return [name for i, name in enumerate(opening) if opening.count(name) >= 2 and name not in opening[:i]]


def contrastive_questions(questions: list[str], names: list[str], limit: int) -> list[str]:
    """Each question that names one of `names` asked about each other name instead (up to `limit` new ones): the
    same question with different answers per person, so the student binds each fact to its own person (the teacher,
    reading the passage, answers every variant)."""
    out = []
    for question in questions:
        for name in (n for n in names if n in question):
            out += [question.replace(name, other) for other in names if other != name]
    return list(dict.fromkeys(q for q in out if q not in questions))[:limit]


def _prompt_ids(prompt: torch.Tensor, max_len: int) -> torch.Tensor:
    if not isinstance(prompt, torch.Tensor) or prompt.dtype not in (torch.int64, torch.int32):
        raise ValueError("distill-lora: the prompt must be a tensor of token ids")
    if prompt.dim() == 2:
        if prompt.shape[0] != 1:
            raise ValueError(f"distill-lora: absorb one prompt at a time; got a batch of shape {tuple(prompt.shape)}")
        prompt = prompt[0]
    if prompt.dim() != 1 or prompt.shape[0] == 0:
        raise ValueError(f"distill-lora: the prompt must be a non-empty 1-D sequence of token ids, "
                         f"got shape {tuple(prompt.shape)}")
    if prompt.shape[0] >= max_len:
        raise ValueError(f"distill-lora: a prompt of {prompt.shape[0]} tokens leaves no room for queries within "
                         f"max_seq_len={max_len}")
    return prompt.long()


def _query_ids(queries, m: int, max_len: int) -> list[torch.Tensor]:
    if queries is None:
        return []
    out = []
    for i, query in enumerate(queries):
        if not isinstance(query, torch.Tensor) or query.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"distill-lora: train_queries[{i}] must be a tensor of token ids")
        query = query[0] if query.dim() == 2 and query.shape[0] == 1 else query
        if query.dim() != 1 or query.shape[0] == 0:
            raise ValueError(f"distill-lora: train_queries[{i}] must be a non-empty 1-D sequence, "
                             f"got shape {tuple(query.shape)}")
        if m + query.shape[0] > max_len:
            raise ValueError(f"distill-lora: train_queries[{i}] ({query.shape[0]} tokens) after the {m}-token prompt "
                             f"exceeds max_seq_len={max_len}")
        out.append(query.long())
    return out


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    """In float32 at least (half-precision logits lose the small probabilities), float64 kept."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1).to(logits.dtype)


def _copy(cache: Cache, batch: int = 1) -> Cache:
    """A cache of the same context that a forward pass can extend without touching `cache`, for `batch` rows."""
    return copy_cache(cache, batch)


def _sample(model, cache, last_logits, n, length, temperature, generator):
    """n continuations of `length` tokens sampled from the model after the cached prompt, and the model's
    logits after each sampled token (n, length, V): the teacher's targets come with the sampling."""
    cache = _copy(cache, n)
    logits = last_logits.expand(n, -1)
    tokens, targets = [], []
    for _ in range(length):
        # drawn on the CPU from the method's CPU generator: the same draws whatever device the model is on
        probs = torch.softmax(logits.float() / temperature, -1).cpu()
        token = torch.multinomial(probs, 1, generator=generator).to(logits.device)
        logits = model(token, cache=cache)[:, -1]
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


def _recall_windows(model, cache, prompt, width):
    """The prompt in windows of `width` tokens (stride width // 2, the last one flush with the end): the teacher
    reads the cached prompt and then the window, the student the window alone."""
    m = prompt.shape[0]
    stride = max(1, width // 2)
    starts = sorted(set(list(range(0, m - width + 1, stride)) + [m - width]))
    windows = torch.stack([prompt[s: s + width] for s in starts])
    logits = torch.cat([model(chunk, cache=_copy(cache, chunk.shape[0])) for chunk in windows.split(16)])
    return [(w, _log_probs(x)) for w, x in zip(windows, logits)]


def _kl_loss(adapted: DistilledLoRA, batch) -> torch.Tensor:
    """Mean over the taught positions of KL(teacher || student); sequences are right-padded (causal: padding is
    unseen) and each teaches its last n positions (n = rows of its teacher log-probs)."""
    length = max(tokens.shape[0] for tokens, _ in batch)
    tokens = batch[0][0].new_zeros(len(batch), length)
    vocab = batch[0][1].shape[-1]
    teacher = batch[0][1].new_zeros(len(batch), length, vocab)
    mask = torch.zeros(len(batch), length, dtype=torch.bool, device=tokens.device)
    for row, (ids, logp) in enumerate(batch):
        end = ids.shape[0]
        tokens[row, :end] = ids
        teacher[row, end - logp.shape[0]: end], mask[row, end - logp.shape[0]: end] = logp, True
    logits = adapted(tokens)
    student = F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
    kl = F.kl_div(student, teacher.to(student.dtype), log_target=True, reduction="none").sum(-1)
    return kl[mask].mean()


def _plateau(losses: list[float], patience: int, min_improvement: float) -> bool:
    if len(losses) < 2 * patience:
        return False
    recent = sum(losses[-patience:]) / patience
    before = sum(losses[-2 * patience: -patience]) / patience
    return recent > (1.0 - min_improvement) * before
