"""The device check: every absorb method through the harness on a GPU (both backends), training with a checkpoint
and a bit-identical resume, bfloat16, and the absorb/generate commands, on tiny random models (nothing to
download). Needs only torch, transformers and peft (PYTHONPATH=src, no install). Writes a JSON record.

    PYTHONPATH=src python3 scripts/device_check.py --device cuda --out benchmarks/results/device_check.json
    PYTHONPATH=src python3 scripts/device_check.py --device cpu --out device_check_cpu.json   # dry run

tests/test_cuda.py runs the same checks under pytest (marked `cuda`, skipped without a GPU). Speed switches (CUDA
graph, TF32, static decode, casts made once, fixed shapes) are passed as `speed=Speed(...)`, not as options.

Dropped with the features the methods no longer have: kv-prefix's next-token objective and the data stage's
n_foreign (their rows in the composition check).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

SENTENCES = ["Ada Lovelace was born in London.", "Q: Where was Ada born?\nA: London", "Alan Turing works as a "
             "mathematician and has a pet cat named Mat.", "What is the name of the pet? Born in the year 1815."]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
FAST = {"distill-lora": {"steps": 4, "study.n_continuations": 1, "study.continuation_tokens": 8, "progress": False},
        "dynamic-eval": {"learning_rate": 1e-3}, "iclca-approx": {"n_features": 32}, "tint": {"rows_per_prefix": 4},
        "kv-press": {"press": "knorm", "ratio": 0.5}}  # KVzip needs the tokenizer, which compare is not given here
CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def tiny_hf_folder(folder: Path, model_type: str = "llama") -> Path:
    """A random 2-layer model of the family with a byte-level BPE tokenizer and a chat template."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|im_start|>", "<|im_end|>"],
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", bos_token="<|im_start|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    ids = {"eos_token_id": tok.eos_token_id, "bos_token_id": tok.bos_token_id}
    common = dict(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True, **ids)
    config = {"llama": lambda: transformers.LlamaConfig(**common),
              "gemma3_text": lambda: transformers.Gemma3TextConfig(**common, head_dim=12, sliding_window=32)}[model_type]()
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return folder


def _compare_rows(folder: Path, device: str, dtype: str, backend: str, methods: list[str]) -> dict:
    from incontext.harness.compare import compare
    from incontext.interop.models import load_model
    from incontext.tasks.episodes import get_episode_source

    loaded = load_model(str(folder), device, dtype)
    model = loaded.model if backend == "hf" else loaded.model.as_transformer()
    source = get_episode_source("facts", people=1)
    episodes = source.episodes(2, 0, tokenizer=loaded.tokenizer, task=None)
    rows = compare(model, source, episodes, {m: FAST.get(m, {}) for m in methods}, progress=False)
    return {row["method"]: row for row in rows}


@check
def every_method_through_the_harness(device: str, work: Path) -> dict:
    """All registered methods, both backends, on `device` and on the CPU: the same status, keep-prompt's
    score equal, every applicable method ok."""
    from incontext.absorb import absorb_methods

    methods = [m for m in absorb_methods() if m != "cgt-fold"]  # cgt-fold: its own check (needs a CGT)
    folder = tiny_hf_folder(work / "llama")
    out = {}
    for backend in ("incontext", "hf"):
        here = _compare_rows(folder, device, "float32", backend, methods)
        cpu = _compare_rows(folder, "cpu", "float32", backend, methods)
        for name in methods:
            status = here[name]["status"]
            assert status == cpu[name]["status"], (backend, name, here[name].get("reason"), cpu[name].get("reason"))
            assert status in ("ok", "n/a"), (backend, name, here[name].get("reason"))
        keep_here, keep_cpu = here["keep-prompt"]["answer_logprob"]["mean"], cpu["keep-prompt"]["answer_logprob"]["mean"]
        assert abs(keep_here - keep_cpu) < 1e-3 * max(1.0, abs(keep_cpu)), (keep_here, keep_cpu)
        out[backend] = {name: here[name]["status"] if here[name]["status"] == "ok" else f"n/a: {here[name]['reason'][:80]}"
                        for name in methods}
    return out


@check
def composition_and_argmax_weight(device: str, work: Path) -> dict:
    """Two documents absorbed apart and composed (kv-prefix's prefixes, distill-lora's adapters; plain and trained
    with compose_steps) and distill-lora with argmax_weight, on both backends on `device`: every row ok, the composed
    rows with a score per document."""
    from incontext.harness.compare import compare
    from incontext.interop.models import load_model
    from incontext.tasks.episodes import get_episode_source

    folder = tiny_hf_folder(work / "llama-compose")
    fast = {"steps": 2, "study.n_continuations": 1, "study.continuation_tokens": 8, "progress": False}
    out = {}
    for backend in ("incontext", "hf"):
        loaded = load_model(str(folder), device, "float32")
        model = loaded.model if backend == "hf" else loaded.model.as_transformer()
        source = get_episode_source("facts", people=2, documents=2)
        episodes = source.episodes(1, 0, tokenizer=loaded.tokenizer, task=None)
        trained = {**fast, "compose_steps": 3}
        rows = compare(model, source, episodes, {"kv-prefix": fast,
                                                 "distill-lora": fast, "kv-prefix:co": trained, "distill-lora:co": trained,
                                                 "distill-lora:am": {**fast, "argmax_weight": 1.0}},
                       progress=False, codec=loaded.tokenizer)
        rows = {row["method"]: row for row in rows}
        assert all(row["status"] == "ok" for row in rows.values()), {k: r.get("reason") for k, r in rows.items()}
        for name in ("kv-prefix (composed)", "distill-lora (composed)", "kv-prefix:co (composed)",
                     "distill-lora:co (composed)"):
            assert len(rows[name]["composition"]["composed"]) == 2, rows[name]
        out[backend] = sorted(rows)
    return out


def _tiny_transformer(device: str, sharpen: bool = False):
    """A random 2-layer float64 Transformer of ours (seed 0); `sharpen`: matrices drawn N(0, 0.3^2), so that a prefix
    has something to learn in a few dozen steps."""
    from incontext.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=128,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False)
    model = Transformer(config).to(torch.float64).eval()
    if sharpen:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.3)
    return model.to(device)


@check
def kv_prefix_cuda_graph_equals_eager(device: str, work: Path) -> dict:
    """kv-prefix's training step replayed as a CUDA graph (its default on a GPU, Speed(cuda_graph=True)) trains the
    same prefix as the same fixed-shape steps never captured (distill._Steps.warmup past the last step: the same
    capturable AdamW, eager on the side stream) and close to the eager step (Speed(cuda_graph=False)), in float64 on
    our Transformer, with several sequence lengths per batch and the argmax term in the loss (argmax_weight); on a CPU
    all three are eager."""
    from incontext.absorb import distill, get_absorb_method
    from incontext.absorb.distill import Speed

    model = _tiny_transformer(device)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 61, (16,), generator=g).to(device)
    queries = [torch.randint(0, 61, (1, n), generator=g).to(device) for n in (3, 5, 9, 2)]
    options = {"prefix_tokens": 4, "steps": 12, "learning_rate": 0.05, "patience": 50, "progress": False,
               "study.n_continuations": 1, "study.continuation_tokens": 6, "study.window_tokens": 6, "study.answer_tokens": 2,
               "argmax_weight": 0.5, "autocast": "none"}

    def absorb(speed: Speed):
        return get_absorb_method("kv-prefix", speed=speed, **options).absorb(model, prompt, train_queries=queries)

    def gap(a, b) -> float:
        return max(float((x - y).abs().max()) for (x, _), (y, _) in zip(a._tensors(), b._tensors()))

    graphed, eager = absorb(Speed(cuda_graph=True)), absorb(Speed(cuda_graph=False))
    warmup = distill._Steps.warmup
    distill._Steps.warmup = 10**9  # the same fixed-shape steps, never captured: eager on the side stream
    try:
        fixed = absorb(Speed(cuda_graph=True))
    finally:
        distill._Steps.warmup = warmup
    assert not eager.history["cuda_graph"], eager.history["cuda_graph"]
    assert graphed.history["cuda_graph"] == device.startswith("cuda"), graphed.history["cuda_graph"]
    out = {"graphed": graphed.history["cuda_graph"], "steps": graphed.history["steps"],
           "replayed_vs_same_step_eager": gap(graphed, fixed), "replayed_vs_eager_step": gap(graphed, eager)}
    # replay runs the same kernels as the fixed-shape eager step: equal to float64 rounding; the eager step pads each
    # batch to its own longest sequence, so other kernels (and Adam's normalised steps amplify their rounding)
    assert out["replayed_vs_same_step_eager"] < 1e-10, out
    assert out["replayed_vs_eager_step"] < 1e-4, out
    return out


@check
def data_stage_static_decode_graph(device: str, work: Path) -> dict:
    """The data stage's continuations and answers decoded on a static cache, the decode step replayed as a CUDA graph
    (the default on a GPU with our Transformer), against the same steps eager and against the plain decode
    (study(..., static_decode="never"), what Speed(static_decode="never") gives), in float64 (1e-10); on a CPU all
    three are eager."""
    from incontext.absorb.study import answer as study_answer
    from incontext.absorb.study import StudyOptions, study
    from incontext.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=128,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    model = Transformer(config).to(device, torch.float64).eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 61, (20,), generator=g).to(device)
    queries = [torch.randint(0, 61, (n,), generator=g).to(device) for n in (3, 5, 9, 2, 4)]
    options = StudyOptions(window_tokens=6, n_continuations=3, continuation_tokens=9, answer_tokens=5, top_k=None)

    def stage(mode: str, capture: bool = True):
        captured = study_answer.StaticDecoder.warmup
        if not capture:
            study_answer.StaticDecoder.warmup = 10**9  # the same static steps, never captured
        try:
            return study(model, prompt, queries, options, None, torch.Generator().manual_seed(0), static_decode=mode)[0]
        finally:
            study_answer.StaticDecoder.warmup = captured

    def gap(a, b) -> float:
        assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b)), "the decoded tokens differ"
        return max(float((x - y).abs().max()) for (_, x), (_, y) in zip(a, b))

    replayed, eager, plain = stage("always"), stage("always", capture=False), stage("never")
    out = {"sequences": len(replayed), "replayed_vs_same_steps_eager": gap(replayed, eager),
           "replayed_vs_plain_decode": gap(replayed, plain)}
    assert out["replayed_vs_same_steps_eager"] < 1e-10 and out["replayed_vs_plain_decode"] < 1e-10, out
    return out


@check
def wording_ensemble_stage_on_device(device: str, work: Path) -> dict:
    """The data stage with wording_ensemble (consensus answers forced, the wordings' targets averaged; on a GPU the
    answers decode on the static cache replayed as a CUDA graph) on `device` equals the same stage on the CPU, in
    float64 on our Transformer (ids equal, targets to 1e-8); the ensemble changes some answer."""
    from dataclasses import replace

    from incontext.absorb.study import StudyOptions, study

    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 61, (20,), generator=g)
    queries = [torch.randint(0, 61, (n,), generator=g) for n in (3, 5, 4, 2, 6, 3, 4)]
    groups = [0, 0, 0, 1, 1, 2, 1]
    options = StudyOptions(window_tokens=6, n_continuations=1, continuation_tokens=5, answer_tokens=3,
                           wording_ensemble=True, top_k=None)

    def stage(where: str, chosen: StudyOptions = options):
        model = _tiny_transformer(where, sharpen=True)
        return study(model, prompt.to(where), [q.to(where) for q in queries], chosen, None,
                     torch.Generator().manual_seed(0), groups=groups)

    (here, counts), (cpu, _), (plain, _) = stage(device), stage("cpu"), stage("cpu", replace(options, wording_ensemble=False))
    assert counts["ensembled"] == 2 and len(here) == len(cpu), counts
    assert all(torch.equal(x.cpu(), y) for (x, _), (y, _) in zip(here, cpu)), "the stage's tokens differ from the CPU's"
    out = {"sequences": len(here), "ensembled": counts["ensembled"],
           "device_vs_cpu": max(float((x.cpu() - y).abs().max()) for (_, x), (_, y) in zip(here, cpu)),
           "answers_changed": sum(not torch.equal(x, y) for (x, _), (y, _) in zip(cpu, plain))}
    assert out["device_vs_cpu"] < 1e-8 and out["answers_changed"] > 0, out
    return out


def _tiny_prefix_run(device: str):
    """A tiny random RoPE Transformer on `device`, a 16-token prompt and kv-prefix options for 8 short steps."""
    from incontext.models import Transformer, TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_mlp=64, vocab_size=61, max_seq_len=128,
                               positions="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    model = Transformer(config).to(device).eval()
    prompt = torch.randint(0, 61, (16,), generator=torch.Generator().manual_seed(1)).to(device)
    options = {"prefix_tokens": 4, "steps": 8, "patience": 50, "progress": False, "study.n_continuations": 1,
               "study.continuation_tokens": 4, "study.window_tokens": 6, "autocast": "none"}  # float32 training unless a check asks
    return model, prompt, options


@check
def kv_prefix_rollback_recaptures(device: str, work: Path) -> dict:
    """kv-prefix's divergence guard on the CUDA-graph step: a prefix blown up 50-fold after step 30 is rolled back
    (in-place copies into the graph's tensors), the graph is captured again at the halved rate, and training ends
    finite and near its best window (float64, our Transformer; Speed(fixed_shapes=True): on a CPU the same
    fixed-shape steps run eagerly)."""
    from incontext.absorb import distill, get_absorb_method
    from incontext.absorb.distill import Speed

    model = _tiny_transformer(device, sharpen=True)
    prompt = torch.randint(0, 61, (20,), generator=torch.Generator().manual_seed(1)).to(device)
    options = {"prefix_tokens": 5, "steps": 48, "learning_rate": 0.2, "patience": 4, "progress": False,
               "study.n_continuations": 1, "study.continuation_tokens": 6, "study.window_tokens": 8, "passes": 0}
    calls, resets = {"n": 0}, []
    real_call, real_reset, real_plateau = distill._Steps.__call__, distill._Steps.reset, distill.plateau

    def call(self, batch):
        out = real_call(self, batch)
        calls["n"] += 1
        if calls["n"] == 30:
            with torch.no_grad():
                for t in self.params:
                    t.mul_(50.0)
        return out

    def reset(self):
        resets.append(calls["n"])
        real_reset(self)

    distill._Steps.__call__, distill._Steps.reset = call, reset
    distill.plateau = lambda *args: False  # all 48 steps
    try:  # the fixed-shape step on a CPU too
        trained = get_absorb_method("kv-prefix", speed=Speed(fixed_shapes=True), **options).absorb(model, prompt)
    finally:
        distill._Steps.__call__, distill._Steps.reset, distill.plateau = real_call, real_reset, real_plateau
    history = trained.history
    kl = history["loss"]
    out = {"graphed": history["cuda_graph"], "rollbacks": history["rollbacks"], "resets_after_step": resets,
           "best_window_kl": history["best_window_loss"], "max_kl_after_blow_up": max(kl[30:]),
           "last_window_kl": sum(kl[-4:]) / 4}
    assert history["cuda_graph"] == device.startswith("cuda"), out
    assert history["rollbacks"] >= 1 and len(resets) == history["rollbacks"] and history["steps"] == 48, out
    assert out["max_kl_after_blow_up"] > 2 * out["best_window_kl"], out  # the blow-up happened
    assert out["last_window_kl"] < 2 * out["best_window_kl"] + 0.25, out  # and training recovered from it
    assert all(bool(torch.isfinite(k).all() and torch.isfinite(v).all()) for k, v in trained._tensors()), out
    return out


@check
def kv_prefix_tf32(device: str, work: Path) -> dict:
    """kv-prefix with Speed(tf32=True) (float32 matmuls in TF32 on CUDA; nothing changes elsewhere) trains a finite
    prefix close to the float32 one, and the matmul precision is the caller's again afterwards."""
    from incontext.absorb import get_absorb_method
    from incontext.absorb.distill import Speed

    model, prompt, options = _tiny_prefix_run(device)
    before = torch.get_float32_matmul_precision()
    tf32, plain = (get_absorb_method("kv-prefix", speed=Speed(tf32=flag), **options).absorb(model, prompt)
                   for flag in (True, False))
    gap = max(float((x - y).abs().max()) for (x, _), (y, _) in zip(tf32._tensors(), plain._tensors()))
    scale = max(float(y.abs().max()) for y, _ in plain._tensors())
    out = {"relative_gap": gap / scale, "precision_after": torch.get_float32_matmul_precision()}
    assert all(torch.isfinite(x).all() for pair in tf32._tensors() for x in pair), out
    assert out["precision_after"] == before and out["relative_gap"] < 0.05, out
    if not device.startswith("cuda"):
        assert gap == 0.0, out  # off CUDA the switch changes nothing
    return out


@check
def distill_lora_autocast(device: str, work: Path) -> dict:
    """distill-lora with autocast=bfloat16 autocasts on the model's device (bf16 matmuls there; before, it named the
    CPU) and trains the same finite LoRA factors on the frozen weights cast once (Speed(cast_once=True), the default)
    as on autocast's own per-step casts (Speed(cast_once=False))."""
    from incontext.absorb import get_absorb_method
    from incontext.absorb.distill import Speed

    model, prompt, _ = _tiny_prefix_run(device)
    options = {"steps": 6, "passes": 0, "study.n_continuations": 1, "study.continuation_tokens": 4, "study.window_tokens": 6,
               "progress": False, "merge": False}
    runs = {}
    for name, cast_once, autocast in (("once", True, "bfloat16"), ("per_step", False, "bfloat16"), ("plain", True, "none")):
        runs[name] = get_absorb_method("distill-lora", speed=Speed(cast_once=cast_once), autocast=autocast,
                                       **options).absorb(model, prompt).lora_factors()

    def gap(a, b) -> float:
        return max(float((x - y).abs().max()) for key in runs[a] for x, y in zip(runs[a][key], runs[b][key]))

    out = {"gap_cast_once_vs_per_step": gap("once", "per_step"), "gap_autocast_vs_float32": gap("once", "plain")}
    assert all(torch.isfinite(t).all() for pair in runs["once"].values() for t in pair), out
    assert out["gap_cast_once_vs_per_step"] < 1e-6 and out["gap_autocast_vs_float32"] > 0, out
    return out


@check
def kv_prefix_autocast(device: str, work: Path) -> dict:
    """kv-prefix with autocast=bfloat16 (training's matmuls in bf16 under torch.autocast; on CUDA the step is then
    captured under autocast) trains a finite float32 prefix close to the float32 one; on CUDA the captured step and
    the eager one (Speed(cuda_graph=False)) land close to each other; the frozen weights cast once (runtime.frozen_casts,
    read through functional_call, also inside the captured step) train the same prefix as autocast's own casts
    (Speed(cast_once=False))."""
    from incontext.absorb import get_absorb_method
    from incontext.absorb.distill import Speed

    model, prompt, options = _tiny_prefix_run(device)
    options = {**options, "learning_rate": 0.02}
    runs = {name: get_absorb_method("kv-prefix", speed=speed, **{**options, **extra}).absorb(model, prompt)
            for name, extra, speed in (("plain", {}, Speed()), ("autocast", {"autocast": "bfloat16"}, Speed()),
                                       ("autocast_eager", {"autocast": "bfloat16"}, Speed(cuda_graph=False)),
                                       ("cast_per_step", {"autocast": "bfloat16"}, Speed(cast_once=False)))}
    scale = max(float(y.abs().max()) for y, _ in runs["plain"]._tensors())

    def gap(a, b) -> float:
        return max(float((x - y).abs().max()) for (x, _), (y, _) in zip(runs[a]._tensors(), runs[b]._tensors())) / scale

    out = {"relative_gap_to_float32": gap("autocast", "plain"), "relative_gap_graph_vs_eager": gap("autocast", "autocast_eager"),
           "relative_gap_cast_once_vs_per_step": gap("autocast", "cast_per_step"),
           "cuda_graph": runs["autocast"].history["cuda_graph"]}
    assert out["relative_gap_cast_once_vs_per_step"] < 1e-6, out  # the same rounding: equal up to kernel choice
    assert all(torch.isfinite(x).all() and x.dtype == torch.float32 for pair in runs["autocast"]._tensors() for x in pair), out
    # Adam's steps are about the learning rate whatever the gradient's size, so bf16's rounding moves the prefix by a
    # fraction of the 8 steps' travel: close, not equal
    assert 0 < out["relative_gap_to_float32"] < 0.25 and out["relative_gap_graph_vs_eager"] < 0.25, out
    return out


@check
def bfloat16_through_the_harness(device: str, work: Path) -> dict:
    methods = ["keep-prompt", "drop-prompt", "dynamic-eval", "distill-lora", "iclca-approx"]
    folder = tiny_hf_folder(work / "llama-bf16")
    out = {}
    for backend in ("incontext", "hf"):
        rows = _compare_rows(folder, device, "bfloat16", backend, methods)
        assert all(rows[m]["status"] == "ok" for m in methods), {m: rows[m].get("reason") for m in methods}
        out[backend] = {m: rows[m]["agreement"]["kl"] for m in methods}
    return {"kl_to_keep_prompt": out}


@check
def hf_only_family_on_device(device: str, work: Path) -> dict:
    """A family that does not convert (Gemma 3) runs keep/drop/dynamic-eval/distill-lora on the HF backend."""
    methods = ["keep-prompt", "drop-prompt", "dynamic-eval", "distill-lora", "iclca-approx"]
    rows = _compare_rows(tiny_hf_folder(work / "gemma3", "gemma3_text"), device, "float32", "hf", methods)
    assert all(rows[m]["status"] == "ok" for m in methods[:4]), {m: rows[m].get("reason") for m in methods}
    assert rows["iclca-approx"]["status"] == "n/a"
    return {m: rows[m]["status"] for m in methods}


@check
def training_resumes_bit_identically(device: str, work: Path) -> dict:
    from safetensors.torch import load_file

    from incontext.train import load_config, train

    tiny = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "task.name=linear_regression", "task.d_in=3",
            "task.n_points=6", "schedule.total_steps=8", "schedule.warmup_steps=2", "run.batch_size=8", "run.eval_every=4",
            "run.eval_sequences=16", "run.eval_batch_size=8", "run.checkpoint_every=4", "run.keep_checkpoints=3",
            "run.log_every=1", "run.tensorboard=false", f"run.device={device.split(':')[0]}"]
    out = {}
    for autocast in ("none", "bf16"):
        straight = work / f"train-{autocast}"
        train(load_config(None, tiny + [f"run.autocast={autocast}", f"run.out_dir={straight}"]), progress=False)
        resumed = work / f"resumed-{autocast}"
        shutil.copytree(straight, resumed)
        shutil.rmtree(resumed / "checkpoints" / "step_00000008")
        (resumed / "checkpoints" / "latest").write_text("step_00000004\n")
        train(load_config(None, tiny + [f"run.autocast={autocast}", f"run.out_dir={resumed}"]), resume=True, progress=False)
        tensors = []
        for run in (straight, resumed):
            folder = run / "checkpoints" / "step_00000008"
            tensors.append({**load_file(str(folder / "model.safetensors")), **{f"optim/{k}": v for k, v in
                            load_file(str(folder / "optimizer.safetensors")).items()}})
        assert tensors[0].keys() == tensors[1].keys()
        assert all(torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0]), f"resume differs ({autocast})"
        out[autocast] = f"{len(tensors[0])} tensors bit-identical after resume"
    return out


@check
def cgt_fold_on_device(device: str, work: Path) -> dict:
    from incontext.absorb import get_absorb_method
    from incontext.models import CGT, CGTConfig

    torch.manual_seed(0)
    model = CGT(CGTConfig(n_layer=3, split_layer=2, d_x=32, n_head_x=4, d_y=16, n_head_y=2, vocab_size=50,
                          max_seq_len=64)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (12,))
    query = torch.randint(0, model.config.vocab_size, (1, 6))
    method = get_absorb_method("cgt-fold")
    with torch.no_grad():
        cpu = method.absorb(model, prompt)(query)
        here = method.absorb(model.to(device), prompt.to(device))(query.to(device)).cpu()
    error = float((here - cpu).abs().max() / cpu.abs().max())
    assert error < 1e-4, error
    return {"relative_error_vs_cpu": error}


@check
def self_study_from_the_document(device: str, work: Path) -> dict:
    """kv-prefix's data stage from the document alone on `device`, both backends: queries derived from its text
    (the default), the grounding filter, questions written by a second model (a Gemma-3 folder, `writer`) and the
    tail-bucket objective; every stage tensor on the model's device, the training loss finite, the same counts of
    derived queries as on the CPU (they come from the text, not the model)."""
    from incontext.absorb import get_absorb_method
    from incontext.interop.models import load_model

    folder, writer_folder = tiny_hf_folder(work / "llama"), tiny_hf_folder(work / "gemma", "gemma3_text")
    document = "Ada Lovelace was born in London. Alan Turing works as a mathematician and has a pet cat named Mat."
    options = {"steps": 3, "progress": False, "tail": True, "study": {"n_continuations": 0, "grounded": True,
                                                                     "n_questions": 2, "answer_tokens": 3}}
    out = {}
    for backend in ("incontext", "hf"):
        counts = {}
        for where in (device, "cpu"):
            loaded, written_by = load_model(str(folder), where, "float32"), load_model(str(writer_folder), where, "float32")
            model = loaded.model if backend == "hf" else loaded.model.as_transformer()
            method = get_absorb_method("kv-prefix", writer=(written_by.model, written_by.tokenizer), **options)
            prompt = torch.tensor(loaded.tokenizer.encode(document), device=where)
            adapted = method.absorb(model, prompt, codec=loaded.tokenizer)
            kinds = {t.device.type for ids, logp, *rest in adapted.sequences for t in (ids, logp, *rest)}
            assert kinds == {torch.device(where).type}, (backend, where, kinds)
            assert all(math.isfinite(x) for x in adapted.history["loss"]), (backend, where, adapted.history["loss"])
            counts[where] = adapted.history["pool"]
        assert counts[device]["derived"] + counts[device].get("ungrounded", 0) >= 1, counts
        assert counts[device]["derived"] + counts[device]["ungrounded"] == counts["cpu"]["derived"] + counts["cpu"]["ungrounded"]
        out[backend] = counts[device]
    return out


@check
def kvzap_and_the_press_start_on_device(device: str, work: Path) -> dict:
    """Issue 79's paths on the device: KVzap's targets and fit (absorb/kvzap.py), kv-press with the scorer (kvpress's
    KVzapPress) keeping the same pairs as on the CPU, and kv-prefix's default start (init=auto: KVzip's kept pairs)."""
    from incontext.absorb import get_absorb_method
    from incontext.absorb.kvzap import KVzapFit, kvzip_targets
    from incontext.interop.models import load_model

    folder = tiny_hf_folder(work / "llama-kvzap")
    out = {}
    for where in (device, "cpu"):
        loaded = load_model(str(folder), where, "float32")
        codec = loaded.tokenizer
        prompts = [torch.tensor(codec.encode(codec.chat([{"role": "system", "content": text}])), device=where)
                   for text in SENTENCES[:3]]
        fit = KVzapFit.for_model(loaded.model)
        for prompt in prompts:
            fit.add(kvzip_targets(loaded.model, prompt, codec))
        fit.solve(1e-3).save_pretrained(work / f"kvzap-{where}")
        pressed = get_absorb_method("kv-press", press="kvzap", weights=str(work / f"kvzap-{where}"), ratio=0.5).absorb(
            loaded.model, prompts[0], codec=codec)
        prefix = get_absorb_method("kv-prefix", steps=2, passes=0, progress=False, **{"study.n_continuations": 1}).absorb(
            loaded.model, prompts[0], codec=codec)
        assert prefix.history["init"] == "press", prefix.history["init"]
        out[where] = {"kept_bytes": pressed.kept_bytes(loaded.model), "prefix_init": prefix.history["init"]}
    assert out[device]["kept_bytes"] == out["cpu"]["kept_bytes"], out
    return out


@check
def absorb_and_generate_commands(device: str, work: Path) -> dict:
    from incontext.cli import commands as cli

    folder = tiny_hf_folder(work / "llama-cli")
    questions = work / "questions.txt"  # --train-queries: the queries' ids follow the model onto the device
    questions.write_text("Ada Lovelace was born in\nWhere was Ada born?\n\nWhich town is Ada from?\n")
    out = {}
    for name, method, options in (("distill-lora", "distill-lora", ["steps=3", "progress=false"]),
                                  ("keep-prompt", "keep-prompt", []), ("dynamic-eval", "dynamic-eval", []),
                                  ("kv-prefix-train-queries", "kv-prefix",
                                   ["steps=3", "progress=false", "study.n_continuations=0", "study.wording_ensemble=true"])):
        target = work / f"absorb-{name}"
        args = ["absorb", "--model", str(folder), "--method", method, "--prompt", "Ada Lovelace was born in London.",
                "--out", str(target), "--device", device]
        for option in options:
            args += ["--set", option]
        if name.endswith("train-queries"):
            args += ["--train-queries", str(questions)]
        assert cli.main(args) == 0, name
        assert cli.main(["generate", "--model", str(folder), "--adapted", str(target), "--device", device,
                         "--max-new-tokens", "4", "--sample", "--seed", "1", "Q: Where was Ada born?\nA:"]) == 0
        out[name] = sorted(p.name for p in target.iterdir())
    return out


def run_checks(device: str, only: list[str] | None = None) -> dict:
    import transformers

    record = {"device": device, "device_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else platform.processor() or "cpu",
              "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
              "checks": {}}
    try:
        import peft

        record["peft"] = peft.__version__
    except ImportError:
        record["peft"] = None
    for fn in CHECKS:
        if only and fn.__name__ not in only:
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                details = fn(device, Path(tmp))
                entry = {"status": "ok", "details": details}
            except Exception as error:  # noqa: BLE001 - the record says what failed and goes on
                entry = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                         "traceback": traceback.format_exc(limit=4)}
        entry["seconds"] = round(time.perf_counter() - start, 2)
        record["checks"][fn.__name__] = entry
        print(f"{fn.__name__:40s} {entry['status']} ({entry['seconds']} s)", flush=True)
    record["passed"] = all(c["status"] == "ok" for c in record["checks"].values())
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (a dry run)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write (a new file)")
    parser.add_argument("--only", nargs="*", help="names of checks to run (default all)")
    args = parser.parse_args(argv)
    if args.out.exists():
        print(f"device_check: {args.out} exists; give a new file", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        record = {"device": args.device, "skipped": "no CUDA device here", "torch": torch.__version__}
        print("device_check: no CUDA device here: every check skipped")
    else:
        record = run_checks(args.device, args.only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2))
    print(f"wrote {args.out}")
    return 0 if record.get("passed", True) else 1


if __name__ == "__main__":
    sys.exit(main())
