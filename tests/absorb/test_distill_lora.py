"""distill-lora: context distillation into a peft LoRA on tiny Llama-style Transformers (RMSNorm, SwiGLU, RoPE, GQA)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_error

pytest.importorskip("peft")

from incontext.absorb import AdaptedModel, DistilledLoRA, get_absorb_method  # noqa: E402
from incontext.absorb.study import stage as study_stage, writers as study_writers  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402
from incontext.models.cgt import CGT, CGTConfig  # noqa: E402

VOCAB = 64


def llama_like(dtype=torch.float32, seed=0, **options) -> Transformer:
    config = dict(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=48, vocab_size=VOCAB, positions="rope",
                  norm="rmsnorm", mlp="swiglu", bias=False, max_seq_len=96, init_std=0.2)  # large init: the prompt matters
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(**{**config, **options})).to(dtype).eval()


def ids(n, seed, low=0):
    return torch.randint(low, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def method(**options):
    return get_absorb_method("distill-lora", **{"steps": 6, "passes": 0, "study.n_continuations": 2, "study.continuation_tokens": 8,
                                                 "study.window_tokens": 16, "progress": False, **options})


def kl(model, adapted, prompt, text):
    """Mean KL(model reading prompt + text || adapted reading text alone), over the positions of text (B, N)."""
    m = prompt.shape[0]
    with torch.no_grad():
        teacher = F.log_softmax(model(torch.cat([prompt.expand(len(text), m), text], 1)), -1)[:, m:]
        student = F.log_softmax(adapted(text), -1)
    return float(F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1).mean())


def recall_kl(model, adapted, prompt, width=16):
    """Mean KL on the prompt cut into windows: the teacher reads the whole prompt and then the window again,
    the student the window alone."""
    windows = torch.stack([prompt[s: s + width] for s in range(0, len(prompt) - width + 1, width)])
    return kl(model, adapted, prompt, windows)


def test_kl_to_the_prompted_model_decreases():
    model, prompt = llama_like(), ids(40, 1)
    untrained = method(steps=0).absorb(model, prompt)
    adapted = method(steps=40, patience=40, argmax_weight=0).absorb(model, prompt)  # the KL alone is trained
    assert recall_kl(model, adapted, prompt) < 0.8 * recall_kl(model, untrained, prompt)
    # held out: continuations the model samples with another seed than the method's
    samples = model.generate(prompt[None].expand(4, 40), 12, greedy=False, generator=torch.Generator().manual_seed(99))
    held_out = samples[:, 40:]
    assert kl(model, adapted, prompt, held_out) < 0.92 * kl(model, untrained, prompt, held_out)
    losses = adapted.history["loss"]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.6 * sum(losses[:5])


def test_early_stop_on_a_kl_plateau():
    model, prompt = llama_like(), ids(30, 1)
    adapted = method(steps=50, patience=2, min_improvement=1.0).absorb(model, prompt)  # any loss is a plateau
    assert adapted.history["stopped_early"] and adapted.history["steps"] == len(adapted.history["loss"]) == 4
    adapted = method(steps=3, patience=2, min_improvement=1.0, progress=True).absorb(model, prompt)
    assert not adapted.history["stopped_early"] and adapted.history["steps"] == 3


def test_passes_over_a_large_data_stage_lengthen_training_and_the_plateau_window():
    """max(steps, passes * sequences / batch_size) steps; the plateau test's window is at least one pass."""
    model, prompt = llama_like(), ids(30, 1)
    queries = [ids(5, 10 + i) for i in range(10)]
    adapted = method(steps=2, passes=2, batch_size=3, patience=1000).absorb(model, prompt, train_queries=queries)
    n = sum(adapted.history["pool"][k] for k in ("recall_windows", "continuations", "train_queries"))
    assert n == 15 and adapted.history["steps"] == 10 and not adapted.history["stopped_early"]
    adapted = method(steps=50, batch_size=3, patience=1, min_improvement=1.0).absorb(model, prompt, train_queries=queries)
    assert adapted.history["stopped_early"] and adapted.history["steps"] == 2 * 5  # windows of one pass (5 steps)


def test_zero_steps_is_the_base_model_at_positions_after_the_prompt():
    model, prompt, query = llama_like(torch.float64), ids(20, 1), ids(7, 2)[None]
    adapted = method(steps=0).absorb(model, prompt)
    with torch.no_grad():
        assert torch.equal(adapted(query), model(query, position_offset=20))


def test_same_seed_gives_bit_identical_weights():
    model, prompt, queries = llama_like(), ids(30, 1), [ids(6, 3), ids(9, 4)]
    first = method(seed=5).absorb(model, prompt, train_queries=queries).state_dict()
    second = method(seed=5).absorb(model, prompt, train_queries=queries).state_dict()
    other = method(seed=6).absorb(model, prompt, train_queries=queries).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("tied", [False, True])
def test_autocast_on_the_frozen_weights_cast_once_equals_autocasts_own_casts(monkeypatch, tied):
    """autocast=True trains in bf16 matmuls (the factors move off the float32 run's) and reads bf16 copies of the
    frozen weights made once (runtime.frozen_casts): the same factors, bit for bit, as autocast's cast at every
    step (Speed(cast_once=False))."""
    from incontext import runtime
    from incontext.absorb import distill

    model, prompt, queries = llama_like(seed=3, tie_embeddings=tied), ids(30, 1), [ids(6, 3), ids(9, 4)]
    made = []
    monkeypatch.setattr(distill, "frozen_casts", lambda *a, **k: (made.append(runtime.frozen_casts(*a, **k)), made[-1])[1])
    once = method(autocast="bfloat16", merge=False).absorb(model, prompt, train_queries=queries).lora_factors()
    assert made and any(name.endswith("base_layer.weight") for name in made[0])  # the LoRA layers' frozen weights
    each_step = method(autocast="bfloat16", merge=False, speed=distill.Speed(cast_once=False)).absorb(model, prompt, train_queries=queries).lora_factors()
    plain = method(merge=False).absorb(model, prompt, train_queries=queries).lora_factors()
    assert once.keys() == each_step.keys() == plain.keys()
    for name in once:
        assert all(torch.equal(a, b) for a, b in zip(once[name], each_step[name]))
    assert any(not torch.equal(once[name][1], plain[name][1]) for name in once)  # bf16 matmuls did run


def test_the_method_sees_only_the_prompt_its_own_samples_and_the_train_queries():
    """The training/evaluation split: every token sequence the teacher or the student reads is the prompt, a
    window of it, a continuation sampled by the teacher, or a training query; the evaluation query never is.
    The model, its mode and the global random state are left as they were."""
    model = llama_like()
    prompt, train_queries, eval_query = ids(30, 1, low=1), [ids(6, 3, low=1), ids(9, 4, low=1)], ids(12, 5, low=1)
    seen = []
    hook = model.tok_emb.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    model.train()
    # heldout=0: the held-out continuations are the teacher's own samples too (tests/absorb/test_heldout_kl.py)
    adapted = method(steps=8, study=dict(n_continuations=3), heldout=0).absorb(model, prompt, train_queries=train_queries)
    hook.remove()
    assert model.training and torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    steps = [x for x in seen if x.shape == (3, 1)]  # the teacher's sampling, one token per continuation per step
    continuations = torch.cat(steps, 1)
    assert continuations.shape == (3, 8)
    # the teacher's greedy answers to the training queries: one token per query per step, all queries in one batch
    answers = [x for x in seen if x.shape == (len(train_queries), 1)]
    assert len(answers) == method().options.study.answer_tokens - 1

    def contains(whole, part):
        return any(torch.equal(whole[i: i + len(part)], part) for i in range(len(whole) - len(part) + 1))

    def allowed(row):
        row = row[: int(row.nonzero().max()) + 1] if row.any() else row[:0]  # drop the right padding (0 ids)
        if len(row) == 0:
            return False
        return (contains(prompt, row) or any(torch.equal(c[: len(row)], row) for c in continuations)
                or any(torch.equal(row[: len(q)], q) or torch.equal(q[: len(row)], row) for q in train_queries))

    rows = [row for x in seen if x.shape not in ((3, 1), (len(train_queries), 1)) for row in x]
    assert all(allowed(row) for row in rows)
    assert not any(contains(row, eval_query[:4]) for row in rows + list(continuations))
    assert any(torch.equal(row[:9], train_queries[1]) for row in rows)  # the training queries were used
    with torch.no_grad():
        adapted(eval_query[None])  # (the adapted model's own reads are not part of absorbing)


def test_train_queries_change_the_adapter():
    model, prompt = llama_like(), ids(30, 1)
    plain = method().absorb(model, prompt).state_dict()
    with_queries = method().absorb(model, prompt, train_queries=[ids(6, 3)]).state_dict()
    assert not all(torch.equal(plain[k], with_queries[k]) for k in plain)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_merged_equals_unmerged_equals_a_plain_reference(dtype, tol):
    model, prompt = llama_like(dtype), ids(24, 1)
    unmerged = method(merge=False, target_modules=("attn.qkv", "attn.out", "mlp.fc_in", "mlp.fc_out")).absorb(model, prompt)
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():  # large factors not representable in float32, so the check does not pass by accident
        for a, b in unmerged.lora_factors().values():
            a.copy_(torch.randn(a.shape, generator=g, dtype=torch.float64) * 0.3)
            b.copy_(torch.randn(b.shape, generator=g, dtype=torch.float64) * 0.3)
    merged = unmerged.merged_model()
    reference = llama_like(dtype)  # W + (alpha / r) B A by hand
    with torch.no_grad():
        for name, (a, b) in unmerged.lora_factors().items():
            reference.get_submodule(name).weight += (16.0 / 8) * b @ a
    query = torch.randint(0, VOCAB, (3, 11), generator=g)
    with torch.no_grad():
        expected = reference(query, position_offset=24)
        assert rel_error(unmerged(query), expected) < tol
        assert rel_error(merged(query), expected) < tol
        assert rel_error(merged(query), model(query, position_offset=24)) > 1e-2  # the adapter does something


@pytest.mark.parametrize("merge", [True, False])
def test_save_and_load_roundtrip(tmp_path, merge):
    model, prompt, query = llama_like(), ids(24, 1), ids(9, 2)[None]
    adapted = method(merge=merge).absorb(model, prompt)
    loaded = AdaptedModel.load(adapted.save(tmp_path / "adapted"))
    assert isinstance(loaded, DistilledLoRA) and loaded.merged == merge and loaded.offset == 24
    with torch.no_grad():
        assert torch.equal(loaded(query), adapted(query))
    for (a, b), (a2, b2) in zip(adapted.lora_factors().values(), loaded.lora_factors().values()):
        assert torch.equal(a, a2) and torch.equal(b, b2)


def test_linear_attention_and_learned_positions():
    for options in (dict(attention="linear", feature_map="elu"), dict(positions="learned", norm="layernorm", mlp="gelu")):
        model, prompt = llama_like(**options), ids(20, 1)
        assert method().unsupported(model) is None
        adapted = method(steps=4).absorb(model, prompt)
        assert adapted(ids(5, 2)[None]).shape == (1, 5, VOCAB)


def test_unsupported_models():
    cgt = CGT(CGTConfig(n_layer=2, split_layer=1, d_x=16, n_head_x=2, d_y=8, n_head_y=2, rank=2, vocab_size=16,
                        max_seq_len=32))
    vectors = Transformer(TransformerConfig(n_layer=1, n_head=2, d_model=8, d_input=3, d_output=2))
    assert "token-input" in method().unsupported(cgt)
    assert "token-input" in method().unsupported(vectors)
    with pytest.raises(ValueError, match="token-input"):
        method().absorb(vectors, ids(5, 1))


@pytest.mark.parametrize("options, match", [
    (dict(rank=0), "rank must be an integer >= 1"), (dict(rank=-2), "rank must be an integer >= 1"), (dict(learning_rate=0.0), "learning_rate"),
    (dict(target_modules=("attn.q",)), "target_modules"), (dict(target_modules=()), "target_modules"),
    (dict(steps=-1), "steps"), (dict(n_foreign=-1), "unknown option 'n_foreign'"), (dict(autocast=True), "autocast must be one of"),
    (dict(study=dict(n_conversations=-1)), "n_conversations must be an integer >= 0"), (dict(study=dict(message_tokens=0)), "message_tokens"),
    (dict(study=dict(seed_prompts="poetry")), "seed_prompts must be"),
])
def test_bad_options(options, match):
    from incontext.absorb.methods.distill_lora import DistillLoRA

    for make in (lambda: method(**options), lambda: DistillLoRA(**options)):  # the registry and Python: one check
        with pytest.raises(ValueError, match=match) as error:
            make()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("prompt, queries, match", [
    (torch.zeros(0, dtype=torch.long), None, "empty"),
    (ids(97, 1), None, "context holds 96"),
    (ids(96, 1), None, "context holds 96 .and the query needs room"),
    (ids(8, 1).float(), None, "token ids"),
    (ids(90, 1), [ids(7, 2)], "exceeds max_seq_len"),
    (ids(8, 1), [torch.zeros(0, dtype=torch.long)], "non-empty"),
])
def test_bad_inputs(prompt, queries, match):
    with pytest.raises(ValueError, match=match) as error:
        method().absorb(llama_like(), prompt, train_queries=queries)
    assert "\n" not in str(error.value)


class CharCodec:
    """A toy tokenizer for the tiny models: one id per character of a 64-character alphabet, and a chat template."""

    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ .?\n:<>|0123"

    def encode(self, text):
        return [self.alphabet.index(ch) for ch in text if ch in self.alphabet]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)

    def chat(self, messages, add_generation_prompt=False):
        text = "".join(f"<{m['role'][0]}>{m['content']}|" for m in messages)
        return text + ("<a>" if add_generation_prompt else "")

    eos_token_id = alphabet.index("|")


def test_recall_windows_are_the_prompted_models_distributions():
    """Each recall window's targets: the model reading the prompt and then the window (float64 reference)."""
    from incontext.absorb.study.stage import _recall_windows
    from incontext.models import Cache

    model, prompt = llama_like(torch.float64, seed=3), ids(37, 2)
    cache = Cache.empty(model.config.n_layer)
    with torch.no_grad():
        model(prompt[None], cache=cache)
        windows = _recall_windows(model, cache, prompt, 10)
    starts = [0, 5, 10, 15, 20, 25, 27]  # stride 5, the last window flush with the end
    assert [int((w[None] == prompt.unfold(0, 10, 1)).all(1).nonzero()[0]) for w, _ in windows] == starts
    for (window, logp), start in zip(windows, starts):
        with torch.no_grad():
            reference = F.log_softmax(model(torch.cat([prompt, window])[None]), -1)[0, 37:]
        assert torch.equal(window, prompt[start: start + 10])
        assert (logp - reference).abs().max() < 1e-12


def test_chat_turns_teach_the_answer_given_with_the_prompt_in_the_user_turn():
    """A question as a chat turn: the student reads chat(question) + the teacher's greedy answer, and its targets
    are the distributions of the model that read the prompt and the question in the user turn (float64)."""
    model, codec = llama_like(torch.float64, seed=4, max_seq_len=160), CharCodec()
    prompt = torch.tensor(codec.encode("Abe was born in Rome.\nAbe is a baker."))
    method_ = method(study=dict(chat_answer_tokens=6))
    with torch.no_grad():
        (student, logp), = study_writers._chat_turns(model, prompt, ["Where was Abe born?"], 100, codec,
                                                  method_.options.study.chat_answer_tokens)
    question = codec.encode(codec.chat([{"role": "user", "content": "Where was Abe born?"}], add_generation_prompt=True))
    assert student[: len(question)].tolist() == question
    answer = student[len(question):].tolist()
    teacher = codec.encode(codec.chat([{"role": "user", "content": "Abe was born in Rome.\nAbe is a baker.\n\nWhere was Abe born?"}],
                                      add_generation_prompt=True))
    with torch.no_grad():
        reference = F.log_softmax(model(torch.tensor([teacher + answer])), -1)[0, len(teacher) - 1:]
    n = logp.shape[0]
    assert n == len(answer) + 1 and n <= 6
    assert (logp - reference[:n]).abs().max() < 1e-12
    assert answer == reference[: n - 1].argmax(-1).tolist()  # greedy


def test_a_codec_adds_questions_and_chat_turns(monkeypatch):
    model, codec = llama_like(seed=4, max_seq_len=400), CharCodec()
    prompt = torch.tensor(codec.encode("Abe was born in Rome.\nAbe is a baker.\nBea has a cat named Tom."))
    questions = []
    original = study_writers._questions
    monkeypatch.setattr(study_stage, "_questions", lambda model, prompt, codec, n: questions or original(model, prompt, codec, n))
    plain = method(steps=2, study=dict(n_questions=16)).absorb(model, prompt, codec=codec).history["pool"]
    questions += ["Where was Abe born?", "What is Bea's pet called?"]
    asked = method(steps=2, study=dict(n_questions=16)).absorb(model, prompt, codec=codec).history["pool"]
    assert asked["questions"] == asked["chat_turns"] == 2 and asked["recall_windows"] == plain["recall_windows"] > 0
    assert method(steps=2, study=dict(n_questions=16)).absorb(model, prompt).history["pool"]["chat_turns"] == 0  # no codec: none
    assert method(steps=2).absorb(model, prompt, codec=codec).history["pool"]["questions"] == 0  # the default: 0


@pytest.mark.parametrize("merge", [True, False])
def test_kept_bytes_are_the_adapters_factors(merge):
    model, prompt = llama_like(), ids(24, 1)
    adapted = method(merge=merge, steps=0, rank=3).absorb(model, prompt)
    expected = sum(3 * (linear.in_features + linear.out_features) * 4 for linear in
                   (model.get_submodule(name) for name in adapted.spec.modules))  # the base is left as it was
    assert adapted.kept_bytes(model) == expected > 0


def test_autocast_on_a_device_without_bf16_fails_before_the_data_stage(monkeypatch):
    """autocast="bfloat16" where the device has no bf16: a one-line error before the data stage's teacher decodes run."""
    from incontext import runtime
    from incontext.absorb import distill

    monkeypatch.setattr(runtime, "_supported", lambda device, dtype: "no bfloat16 here" if dtype == torch.bfloat16 else None)
    monkeypatch.setattr(distill, "study", lambda *a, **k: pytest.fail("the data stage ran before the dtype check"))
    with pytest.raises(ValueError, match="dtype bfloat16 is not supported on cpu: no bfloat16 here"):
        method(autocast="bfloat16").absorb(llama_like(seed=3), ids(30, 1), train_queries=[ids(6, 3)])
