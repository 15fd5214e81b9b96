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
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call
from tqdm.auto import tqdm

from ..config import limit
from ..models import Cache
from ..models.lm import CausalLM, is_causal_lm
from ..runtime import device_of, frozen_casts, resolve_runtime
from .base import AbsorbMethod, AdaptedModel, tensor_bytes
from .self_study import StudyOptions, distillation_kl, seed_kinds, study

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

    def kept_bytes(self, base: nn.Module) -> int:
        """The adapter's factors: all a prompt needs kept (merged weights are the base's plus scaling B A, rebuilt
        from them; the copy a merged model holds is the price of base-speed queries, not of the prompt)."""
        return tensor_bytes(t for pair in self.lora_factors().values() for t in pair)

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


@torch.no_grad()
def compose_loras(*adapted: DistilledLoRA) -> DistilledLoRA:
    """Several documents distilled one by one, answered together: the adapters added (W + s B1 A1 + s B2 A2 + ...),
    kept as one adapter of the summed rank (A stacked by rows, B by columns) so it exports as a plain LoRA. Every
    adapter must be merged, on the same modules with the same scaling; queries start after the sum of the
    adapters' offsets (as after the documents concatenated)."""
    if len(adapted) < 2:
        raise ValueError("compose at least two adapters")
    first = adapted[0]
    for other in adapted[1:]:
        if not (other.merged and first.merged):
            raise ValueError("compose merged adapters (distill-lora merge=true)")
        if other.spec.modules != first.spec.modules or not math.isclose(other.spec.scaling, first.spec.scaling):
            raise ValueError("the adapters differ in their modules or scaling; compose adapters of one setting")
    rank = sum(a.spec.rank for a in adapted)
    spec = LoRASpec(rank, first.spec.scaling * rank, first.spec.modules)
    base = copy.deepcopy(first.base)  # already W + s B1 A1
    out = DistilledLoRA(base, spec, sum(a.offset for a in adapted), merged=True)
    factors = [a.lora_factors() for a in adapted]
    for name in spec.modules:
        weight = base.get_submodule(name).weight
        for f in factors[1:]:
            a, b = f[name]
            delta = spec.scaling * (b.to(torch.float64) @ a.to(torch.float64))  # (out, in)
            weight += (delta if isinstance(base.get_submodule(name), nn.Linear) else delta.T).to(weight.dtype)
        getattr(out.factors, _factor_key(name, "A")).copy_(torch.cat([f[name][0] for f in factors], 0))
        getattr(out.factors, _factor_key(name, "B")).copy_(torch.cat([f[name][1] for f in factors], 1))
    return out.eval()


# ----------------------------------------------------------------------------- the method

@dataclass
class DataStageOptions:
    """The options of the distillation data stage (self_study.StudyOptions) that distill-lora and kv-prefix share."""

    window_tokens: int = limit(24, min=1)
    n_continuations: int = limit(2, min=0)
    continuation_tokens: int = limit(32, min=1)
    answer_tokens: int = limit(8, min=0)
    n_questions: int = limit(0, min=0)
    contrast: bool = False
    n_foreign: int = limit(0, min=0)
    chat_answer_tokens: int = limit(24, min=1)
    temperature: float = limit(1.0, gt=0)
    n_conversations: int = limit(0, min=0)
    seed_prompts: str | tuple[str, ...] = "structuring,summarization,question,use-case,creative"
    message_tokens: int = limit(32, min=1)
    chunk_tokens: int = limit(0, min=0)  # the teacher's window on a long document (self_study.chunk_spans); 0: whole
    wording_ensemble: bool = False  # one target for a question's wordings (self_study.wording_ensemble)

    def __post_init__(self):
        self.seed_prompts = seed_kinds(self.seed_prompts)  # a comma string from --set, or a sequence from Python


@dataclass
class DistillLoRAOptions(DataStageOptions):
    rank: int = limit(8, min=1)
    alpha: float = limit(16.0, gt=0)
    target_modules: tuple[str, ...] | str = ("attn.qkv", "attn.out")
    steps: int = limit(48, min=0)
    passes: int = limit(12, min=0)
    learning_rate: float = limit(3e-3, gt=0)
    batch_size: int = limit(4, min=1)
    patience: int = limit(8, min=1)
    min_improvement: float = limit(0.01, min=0)
    autocast: bool = False
    merge: bool = True
    seed: int = limit(0, min=0)
    progress: bool = True
    top_k: int | None = limit(20, min=1)
    argmax_weight: float = limit(1.0, min=0)
    data_cache: str = ""
    compose_steps: int = limit(0, min=0)

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.target_modules, str):  # --set target_modules=attn.qkv,mlp.fc_in
            self.target_modules = tuple(t.strip() for t in self.target_modules.split(","))
        self.target_modules = tuple(self.target_modules)
        unknown = sorted(set(self.target_modules) - set(LORA_TARGETS))
        if not self.target_modules or unknown:
            raise ValueError(f"target_modules must be a non-empty subset of {LORA_TARGETS}, got {self.target_modules}")


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
    - with a tokenizer (`absorb(..., codec=tokenizer)`; `incontext absorb` and the harness give the model's):
      up to `n_questions` questions the base model writes about the prompt's sentences (QUESTION_WRITER), each
      as "Q: ...\\nA:" plus the teacher's answer, and, where the codec has a chat template, as a chat turn: the teacher reads the prompt
      and the question in the user turn, the student the question alone, and the student learns the teacher's
      answer (up to `chat_answer_tokens`, to its end of turn); with `contrast`, each question that names one of
      the passage's subjects (`subjects`) is also asked about every other subject (up to `n_questions` more), so
      that the same question about two people gets two different answers (facts bound to their own person).
      With `n_foreign`, up to that many training queries (and written questions) that name a subject are asked
      again about an invented name (its letters shuffled), answered by the teacher: questions about people the
      document does not hold, as a composed adapter meets the other document's;
    - with a tokenizer and `n_conversations`: self-study messages the model writes from the seed prompts
      (`seed_prompts`, up to `message_tokens` each), answered by the teacher (the same stage as kv-prefix's);
    - with `chunk_tokens` below the document's length: the teacher reads it in chunks (self_study.chunk_spans; a
      document longer than the model's context is kv-prefix's: the adapter answers after the document's positions).
    - with `wording_ensemble`: the wordings of one training question (absorb's `train_groups`) taught one target,
      the teacher's log-probabilities averaged over them along their consensus answer (self_study.wording_ensemble).
    `compose_steps`: `compose` trains the summed adapter that many steps on the documents' data stages (0: the plain
    sum, the default).

    The sequences come from the data stage (absorb/self_study.py, shared with kv-prefix; `data_cache` keeps them on
    disk) with the teacher's top `top_k` log-probabilities per taught position (20, as Cartridges; unset: the whole
    distribution), and the loss is KL(teacher || student) over them; with `argmax_weight` w > 0, plus w times the
    cross-entropy of the teacher's most likely token at each taught position (what a greedy answer reads; 0: the KL
    alone, the default).

    Each epoch visits every sequence once in a seeded random order, `batch_size` per AdamW step. Training stops
    after max(steps, passes * sequences / batch_size) steps (48 for a 160-token document's ~30 sequences, about 290
    for a 1,000-token one's ~190), or earlier when the mean KL of the last `patience` steps (at least one pass) is
    not `min_improvement` (relative) below the mean of the `patience` steps before; where the windowed KL blows up,
    the divergence guard (Rollback) returns to the snapshot of its lowest window at half the rate. `autocast=True` runs the
    student's forward and backward in bfloat16 autocast on the model's device (faster matmuls; the LoRA factors and the
    loss stay float32; the frozen weights' bf16 casts are made once per absorb, runtime.frozen_casts).
    Randomness comes from one generator seeded with `seed` (CPU). The defaults (steps, batch_size, window_tokens,
    n_questions) were chosen on validation episodes of the `facts` task on SmolLM2 (seed 10000, never the test
    episodes); n_questions=0: without the 16 questions the 135M model writes, 21.4% exact match and KL 0.75 against
    17.9% and 0.82, at half the absorb time (results/kv-prefix-validation-sweep). On the
    chat path (benchmarks/distill_lora_facts.py, same validation episodes) contrast, MLP targets, 96 steps and bf16
    autocast changed the count of right answers by no more than noise, so they stay off."""

    name = "distill-lora"
    Options = DistillLoRAOptions
    needs = "a token-input causal LM"
    takes_codec = True  # with the tokenizer the data stage also writes questions about the prompt (and chat turns)
    summary = "context distillation into a LoRA adapter (a PEFT folder for the family's own transformers class)"

    def __init__(self, **options):
        """`options`: the fields of DistillLoRAOptions (their defaults where not given), checked there."""
        self._set_options(options)

    def stage_options(self) -> StudyOptions:
        return StudyOptions(**{name: getattr(self, name) for name in StudyOptions.__dataclass_fields__})

    def compose(self, adapted: list[DistilledLoRA]) -> DistilledLoRA:
        """Documents distilled one by one, answered together: the adapters added (compose_loras). With
        `compose_steps`, the summed adapter (one LoRA of the summed rank) is then trained for that many steps on the
        union of the documents' data stages, each sequence against its own document's teacher; it needs each
        adapter's data stage, which an absorb keeps in memory (`sequences`), not in its saved folder."""
        composed = compose_loras(*adapted)
        if not self.compose_steps:
            return composed
        trainer, sequences = composition_trainer(self, adapted, "adapter")
        spec, factors = composed.spec, composed.lora_factors()
        base = copy.deepcopy(composed.base)
        if hasattr(base, "peft_config"):  # left by the merged adapter's peft layers, which merging removed
            del base.peft_config
        with torch.no_grad():  # back to the base's own weights: W = (W + scaling B A) - scaling B A, in float64
            for name, (a, b) in factors.items():
                layer = base.get_submodule(name)
                delta = spec.scaling * (b.to(torch.float64) @ a.to(torch.float64))
                delta = delta if isinstance(layer, nn.Linear) else delta.T
                layer.weight.copy_((layer.weight.to(torch.float64) - delta).to(layer.weight.dtype))
        trainable = DistilledLoRA(base, spec, composed.offset, merged=False)
        with torch.no_grad():
            for name, (a, b) in trainable.lora_factors().items():
                a.copy_(factors[name][0])
                b.copy_(factors[name][1])
        history = trainer._train(trainable, sequences, torch.Generator().manual_seed(self.seed))
        out = trainable.merged_model()
        out.history = {"compose": history}
        return out

    def learns_nothing(self) -> str | None:
        if self.steps == 0:
            return ("steps=0 trains nothing: the adapter's B factors stay zero, so the adapted model is the base model "
                    "without the prompt (give steps >= 1)")
        return None

    def check_model(self, model) -> str | None:
        if not is_causal_lm(model):
            return f"needs a token-input causal LM, got {type(model).__name__}"
        if not model.config.tokens:
            return "needs a token-input causal LM; this model reads vectors"
        return None

    def _absorb(self, model: CausalLM, prompt: torch.Tensor, loss_mask: torch.Tensor | None,
                train_queries: list[torch.Tensor] | None, codec=None, train_groups=None) -> DistilledLoRA:
        """`loss_mask` is ignored (the student matches the teacher everywhere); `train_queries` must never be
        evaluation queries."""
        if self.autocast:  # a device without bf16 fails now, not after the data stage
            resolve_runtime(device_of(model), "bfloat16")
        max_len = model.config.max_seq_len
        prompt = _prompt_ids(prompt, max_len)
        m = prompt.shape[0]
        queries = _query_ids(train_queries, m, max_len)
        generator = torch.Generator().manual_seed(self.seed)

        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            sequences, counts = study(model, prompt, queries, self.stage_options(), codec, generator,
                                      top_k=self.top_k, cache_dir=self.data_cache or None, seed=self.seed,
                                      groups=train_groups)
            spec = lora_spec(model, self.rank, self.alpha, self.target_modules)
            adapted = DistilledLoRA(copy.deepcopy(model), spec, offset=m, merged=False).eval()
        finally:
            model.train(was_training)
        init_lora_factors(adapted.lora_factors().values(), generator)
        teacher_seconds = time.perf_counter() - start
        adapted.history = self._train(adapted, sequences, generator)
        adapted.history.update(pool=counts, teacher_seconds=teacher_seconds,
                               train_seconds=time.perf_counter() - start - teacher_seconds)
        out = adapted.merged_model() if self.merge else adapted
        out.sequences = sequences  # the data stage, for compose_steps (in memory only: never saved)
        return out

    @torch.enable_grad()  # trains even when the caller runs under torch.no_grad()
    def _train(self, adapted: DistilledLoRA, sequences, generator) -> dict[str, Any]:
        params = [p for p in adapted.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        losses: list[float] = []
        stopped_early = False
        order: list[int] = []
        total = training_steps(self.steps, self.passes, len(sequences), self.batch_size)
        patience = pass_patience(self.patience, len(sequences), self.batch_size)
        bar = tqdm(total=total, desc="distill-lora", unit="step", disable=not self.progress, leave=False)
        guard = Rollback(params, optimizer, patience)
        runtime = resolve_runtime(device_of(adapted), "bfloat16" if self.autocast else "float32")
        # under autocast, the frozen weights' bf16 casts made once, not at every step (the same numbers)
        casts = frozen_casts(adapted, torch.bfloat16) if self.autocast else {}
        student = (lambda tokens: functional_call(adapted, casts, (tokens,), tie_weights=False, strict=False)) if casts else adapted
        for _ in range(total):
            for group in optimizer.param_groups:
                group["lr"] = self.learning_rate * guard.scale
            if len(order) < self.batch_size:
                order += torch.randperm(len(sequences), generator=generator).tolist()
            picked, order = order[: self.batch_size], order[self.batch_size:]
            with runtime.autocast():  # autocast=True: bf16 matmuls on the model's device (else nothing)
                loss = distillation_kl(student, [sequences[i] for i in picked], self.argmax_weight)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.update(1)
            bar.set_postfix(kl=f"{losses[-1]:.4f}")
            if guard.update(losses):
                continue
            if _plateau(losses[guard.start:], patience, self.min_improvement):  # windows since the last rollback
                stopped_early = True
                break
        guard.finish(losses)
        bar.close()
        for p in params:
            p.requires_grad_(False)
        return {"kl": losses, "steps": len(losses), "stopped_early": stopped_early, **guard.record()}


# ----------------------------------------------------------------------------- helpers


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


def training_steps(steps: int, passes: int, n_sequences: int, batch_size: int) -> int:
    """Steps of training on a data stage of n sequences: `steps`, or more where `passes` passes over the sequences
    need more (a long document's stage holds hundreds); none when steps = 0 or there is nothing to learn."""
    return max(steps, -(-passes * n_sequences // batch_size)) if steps and n_sequences else 0


def composition_trainer(method, adapted: list, noun: str) -> tuple[Any, list]:
    """For `compose_steps`: a copy of `method` that trains compose_steps steps (no passes), and the union of the
    absorbs' data stages (`sequences`, kept in memory by an absorb; a folder loaded from disk keeps none)."""
    if any(getattr(a, "sequences", None) is None for a in adapted):
        article = "an" if noun[0] in "aeiou" else "a"
        raise ValueError(f"{method.name}: compose_steps trains on each {noun}'s data stage; {article} {noun} loaded "
                         "from a folder has none (absorb the documents in this process, or set compose_steps=0)")
    trainer = copy.copy(method)
    trainer.steps, trainer.passes = method.compose_steps, 0
    return trainer, [item for a in adapted for item in a.sequences]


def pass_patience(patience: int, n_sequences: int, batch_size: int) -> int:
    """The plateau test's window: `patience` steps, at least one pass over the sequences (shorter windows compare
    different sequences, whose noise looks like a plateau on a long document's stage)."""
    return max(patience, -(-n_sequences // batch_size))


def _plateau(losses: list[float], patience: int, min_improvement: float) -> bool:
    if len(losses) < 2 * patience:
        return False
    recent = sum(losses[-patience:]) / patience
    before = sum(losses[-2 * patience: -patience]) / patience
    return recent > (1.0 - min_improvement) * before


class Rollback:
    """The divergence guard of the kv-prefix and distill-lora training loops. After each step it takes the mean loss
    of the last `window` steps (distill-lora: its plateau test's window, at least one pass; kv-prefix: `patience`
    steps, so that a long stage's first pass is watched too); at each new lowest mean it snapshots
    the trained tensors and the optimizer's state (in place copies: a captured CUDA graph keeps its tensors). Where a
    later mean is more than `factor` times the lowest and `margin` nats above it, training has diverged (a step
    size that fits for hundreds of steps and then blows the loss up, as lr 0.1 did on a 1,000-token document's stage:
    KL from 0.3 to 6 after 110 steps): the snapshot comes back and the learning rate halves (`scale`), at most
    `max_rollbacks` times; after that, and when training ends diverged, the snapshot is what training returns
    (`finish`). A run that never diverges is untouched: the guard only copies."""

    def __init__(self, params: list[torch.Tensor], optimizer: torch.optim.Optimizer, window: int,
                 factor: float = 2.0, margin: float = 0.25, max_rollbacks: int = 3):
        self.params, self.optimizer, self.window = params, optimizer, max(1, int(window))
        self.factor, self.margin, self.max_rollbacks = factor, margin, max_rollbacks
        self.best, self.rollbacks, self.scale, self.start = math.inf, 0, 1.0, 0
        self.snapshot: list[torch.Tensor] | None = None
        self.state: list[dict[str, Any]] = []

    def _mean(self, losses: list[float]) -> float | None:
        if len(losses) - self.start < self.window:  # windows never reach back past a rollback
            return None
        return sum(losses[-self.window:]) / self.window

    def _diverged(self, mean: float) -> bool:
        return self.snapshot is not None and mean > self.factor * self.best and mean - self.best > self.margin

    @torch.no_grad()
    def _save(self) -> None:
        if self.snapshot is None:
            self.snapshot = [p.detach().clone() for p in self.params]
            self.state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in self.optimizer.state[p].items()}
                          for p in self.params]
            return
        for saved, p in zip(self.snapshot, self.params):
            saved.copy_(p)
        for saved, p in zip(self.state, self.params):
            for k, v in self.optimizer.state[p].items():
                if torch.is_tensor(v):
                    saved[k].copy_(v)
                else:
                    saved[k] = v

    @torch.no_grad()
    def _restore(self) -> None:
        for saved, p in zip(self.snapshot, self.params):
            p.copy_(saved)
        for saved, p in zip(self.state, self.params):
            for k, v in saved.items():
                if torch.is_tensor(v):
                    self.optimizer.state[p][k].copy_(v)
                else:
                    self.optimizer.state[p][k] = v

    def update(self, losses: list[float]) -> bool:
        """Call after each step with every loss so far; True when it rolled back (the caller's learning rate is its
        base rate times `scale`; a captured CUDA graph must be captured again to take the new rate)."""
        mean = self._mean(losses)
        if mean is None:
            return False
        if mean < self.best:
            self.best = mean
            self._save()
            return False
        if self._diverged(mean):
            return self.rollback(losses)
        return False

    def rollback(self, losses: list[float]) -> bool:
        """Restore the snapshot and halve the rate now (also for a step that left the tensors non-finite); False where
        there is no snapshot yet or the rollbacks are spent."""
        if self.snapshot is None or self.rollbacks >= self.max_rollbacks:
            return False
        self._restore()
        self.rollbacks += 1
        self.scale *= 0.5
        self.start = len(losses)
        return True

    def finish(self, losses: list[float]) -> bool:
        """At the end of training: True (and the snapshot restored) where the last window (since the last rollback)
        is still diverged."""
        recent = losses[max(self.start, len(losses) - self.window):]
        if recent and self._diverged(sum(recent) / len(recent)):
            self._restore()
            return True
        return False

    def record(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks, "best_window_loss": None if math.isinf(self.best) else self.best}
