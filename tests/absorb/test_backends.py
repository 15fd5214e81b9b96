"""Every registered absorb method over both backends of the causal-LM protocol: our Transformer and the Hugging Face
wrapper around transformers' LlamaForCausalLM with the same weights. A method applies to both or says why not,
and where it applies both give the same adapted model (same logits). No method checks the model's class."""

import ast
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

import incontext.absorb as absorb_package  # noqa: E402
from incontext.absorb import absorb_methods, get_absorb_method  # noqa: E402
from incontext.interop.hf import to_hf_llama, wrap_hf  # noqa: E402
from incontext.models import Transformer, TransformerConfig  # noqa: E402
from incontext.models.lm import is_causal_lm  # noqa: E402

ABSORB = Path(absorb_package.__file__).parent
# a LoRA on our fused qkv shares one A across q, k and v; peft on the Hugging Face model puts one A on each
# module (its standard layout): the same method trains different parameterizations on the two backends
PARAMETERIZED_APART = {"distill-lora"}
FAST = {"distill-lora": {"steps": 2, "study.n_continuations": 1, "study.continuation_tokens": 4, "progress": False, "study.n_questions": 0},
        "dynamic-eval": {"learning_rate": 1e-2, "n_steps": 2}, "iclca-approx": {"n_features": 16},
        "tint": {"rows_per_prefix": 4},
        "kv-press": {"press": "knorm", "ratio": 0.5},
        "kv-prefix": {"autocast": "none", "progress": False}}  # the backends' equality in the model's own dtype


def llama_like(seed: int, d_model: int, d_mlp: int, dtype: torch.dtype = torch.float32) -> Transformer:
    """A random Llama-shaped Transformer (GQA, RoPE, RMSNorm, SwiGLU, tied embeddings), its matrices drawn at std
    0.3 in `dtype` (float64: weights not float32-exact)."""
    torch.manual_seed(seed)
    config = TransformerConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=d_model, d_mlp=d_mlp, vocab_size=61,
                               max_seq_len=64, positions="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                               tie_embeddings=True)
    model = Transformer(config).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def backends():
    ours = llama_like(0, 48, 96)
    theirs = wrap_hf(to_hf_llama(ours).eval()).eval()
    return ours, theirs


def test_both_backends_speak_the_protocol(backends):
    ours, theirs = backends
    assert is_causal_lm(ours) and is_causal_lm(theirs)
    assert ours.backend == "incontext" and theirs.backend == "hf"
    assert len(ours.lora_modules(("attn.qkv",))) == 2 and len(theirs.lora_modules(("attn.qkv",))) == 6  # q, k, v
    assert theirs.as_transformer().config.n_layer == 2


@pytest.mark.parametrize("name", absorb_methods())
def test_every_method_gives_the_same_adapted_model_on_both_backends(name, backends):
    ours, theirs = backends
    method = get_absorb_method(name, **FAST.get(name, {}))
    reasons = [method.unsupported(ours), method.unsupported(theirs)]
    assert (reasons[0] is None) == (reasons[1] is None), reasons  # the protocol decides, not the class
    if reasons[0] is not None:
        assert all(isinstance(r, str) and r for r in reasons)
        return
    prompt = torch.randint(0, 61, (12,), generator=torch.Generator().manual_seed(1))
    query = torch.randint(0, 61, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = method.absorb(ours, prompt)(query)
        b = method.absorb(theirs, prompt)(query)
        base = ours(query, position_offset=12)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    if name in PARAMETERIZED_APART:  # the same training, on different LoRA layouts: both must learn something
        assert (a - base).abs().max() > 1e-3 and (b - base).abs().max() > 1e-3, name
        return
    assert (a - b).abs().max() <= 1e-3 * a.abs().max(), name


def test_no_method_checks_the_model_class():
    """isinstance(..., Transformer) nowhere in absorb/; the protocol-only modules do not import the class at all."""
    for path in ABSORB.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
                assert "Transformer" not in ast.unparse(node.args[1]).split("CGT")[0].replace("CGTAdapter", ""), \
                    f"{path.name}:{node.lineno} checks the model class"
    for name in ("protocol.py", "methods/dynamic_eval.py", "methods/distill_lora/method.py", "../harness/compare.py",
                 "decode.py"):
        source = (ABSORB / name).read_text()
        runtime_imports = [line for line in source.splitlines() if line.startswith("from ..") and ".models" in line
                           and "Transformer" in line and "TransformerConfig" not in line]
        assert name == "protocol.py" or not runtime_imports, (name, runtime_imports)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_wording_ensemble_stage_is_the_same_on_both_backends(seed):
    """The data stage with `wording_ensemble` (train_groups read, consensus answers forced, the wordings' targets
    averaged) on our Transformer and on transformers' LlamaForCausalLM with the same weights, both in float64: the
    same sequences, and the same targets to 1e-5 (transformers computes RoPE's angles in float32 whatever the model's
    dtype: the stage without the ensemble differs by as much), and some answer changed by the ensemble."""
    from dataclasses import replace

    from incontext.absorb.study import StudyOptions, study

    ours = llama_like(seed, 32, 64, torch.float64)
    theirs = wrap_hf(to_hf_llama(ours).double().eval()).eval()
    g = torch.Generator().manual_seed(seed + 10)
    prompt = torch.randint(0, 61, (16,), generator=g)
    queries = [torch.randint(0, 61, (int(torch.randint(2, 6, (), generator=g)),), generator=g) for _ in range(6)]
    groups = [0, 1, 0, 1, 0, 2]
    options = StudyOptions(window_tokens=6, n_continuations=0, answer_tokens=3, wording_ensemble=True, top_k=None)
    stages = [study(model, prompt, queries, o, None, torch.Generator().manual_seed(0), groups=groups)
              for model in (ours, theirs) for o in (options, replace(options, wording_ensemble=False))]
    (a, counts_a), plain_a, (b, counts_b), plain_b = stages
    assert counts_a["ensembled"] == counts_b["ensembled"] == 2
    for ours_stage, theirs_stage in ((a, b), (plain_a[0], plain_b[0])):
        assert len(ours_stage) == len(theirs_stage)
        for (ids, logp), (ref_ids, ref_logp) in zip(ours_stage, theirs_stage):
            assert torch.equal(ids, ref_ids) and logp.shape == ref_logp.shape
            assert float((logp - ref_logp).abs().max()) < 1e-5
    assert not all(torch.equal(x[0], y[0]) for x, y in zip(a, plain_a[0]))  # the ensemble changed an answer
