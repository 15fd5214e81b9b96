"""Dynamic evaluation on a parameter subset (`params=`) against a plain float64 autograd SGD written here: the
selected entries move by -lr * (their exact gradient), every other entry keeps its value bit for bit."""

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_error

from incontext.absorb import AdaptedModel, get_absorb_method
from incontext.absorb.methods.dynamic_eval import prompt_sgd
from incontext.models import Transformer, TransformerConfig
from incontext.tint import TintConfig, sgd_reference

GROUP_NAMES = ["q", "k", "v", "attn_out", "mlp", "ln_gain", "ln_bias", "input_embedding", "head", "positions"]


def random_model(seed: int, **overrides) -> Transformer:
    """A small float64 model of random shape; weights perturbed off the float32 grid."""
    rng = random.Random(seed)
    n_head = rng.choice([2, 4])
    config = dict(n_layer=rng.choice([1, 2, 3]), n_head=n_head, n_kv_head=rng.choice([n_head, n_head // 2]),
                  d_model=4 * n_head, vocab_size=rng.randint(17, 31), max_seq_len=24,
                  positions=rng.choice(["learned", "rope"]), norm=rng.choice(["layernorm", "rmsnorm"]),
                  bias=rng.choice([True, False]), tie_embeddings=rng.choice([True, False]), mlp=rng.choice(["gelu", "relu"]))
    config.update(overrides)
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(**config)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p) + 1e-9 * torch.rand_like(p))
    return model


def moving_entries(model: Transformer, name: str, groups: set[str], n_top: int | None) -> torch.Tensor:
    """Bool mask of the entries of parameter `name` that the groups select (the test's own reading of the
    group definitions)."""
    c = model.config
    shape = model.get_parameter(name).shape
    parts = name.split(".")
    if parts[0] == "blocks":
        if n_top is not None and int(parts[1]) < c.n_layer - n_top:
            return torch.zeros(shape, dtype=torch.bool)
        module = parts[2] + "." + parts[3] if parts[2] == "attn" else parts[2]
        if module == "attn.qkv":
            q, kv = c.n_head * c.dim_head, c.kv_heads * c.dim_head
            rows = torch.zeros(shape[0], dtype=torch.bool)
            rows[:q] = "q" in groups
            rows[q:q + kv] = "k" in groups
            rows[q + kv:] = "v" in groups
            return rows.view(-1, *[1] * (len(shape) - 1)).expand(shape)
        group = {"attn.out": "attn_out", "mlp": "mlp"}.get(module) or ("ln_gain" if parts[-1] == "weight" else "ln_bias")
    else:
        group = {"tok_emb": "input_embedding", "lm_head": "head", "pos_emb": "positions"}.get(parts[0])
        group = group or ("ln_gain" if parts[-1] == "weight" else "ln_bias")  # norm_f
    return torch.full(shape, group in groups, dtype=torch.bool)


def plain_subset_sgd(model: Transformer, sequences, groups: set[str], lr: float, n_steps: int, n_top=None) -> dict:
    """n_steps of SGD on the summed cross-entropy of the sequences; the head and the input embedding are two
    leaves (a tied matrix: one update with the sum of both gradients when both uses are selected, else each use
    moves alone). Returns the new value of every parameter name, lm_head.weight included."""
    tied = model.config.tie_embeddings
    values = {n: p.detach().clone() for n, p in model.named_parameters()}
    values["lm_head.weight"] = model.lm_head.weight.detach().clone()
    masks = {n: moving_entries(model, n, groups, n_top) for n in values}
    for _ in range(n_steps):
        leaves = {n: v.clone().requires_grad_(True) for n, v in values.items()}
        loss = sum(F.cross_entropy(torch.func.functional_call(model, leaves, (ids[None],), tie_weights=False)[0][:-1],
                                   ids[1:], reduction="sum") for ids in sequences)
        grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
        if tied and {"input_embedding", "head"} <= groups:
            grads["tok_emb.weight"] = grads["lm_head.weight"] = grads["tok_emb.weight"] + grads["lm_head.weight"]
        values = {n: torch.where(masks[n], v - lr * grads[n], v) for n, v in values.items()}
    return values


@pytest.mark.parametrize("seed", range(8))
def test_subset_sgd_equals_plain_autograd_and_freezes_the_rest(seed):
    rng = random.Random(100 + seed)
    model = random_model(seed, **({"tie_embeddings": True} if seed < 2 else {}))
    groups = set(rng.sample(GROUP_NAMES, rng.randint(1, 5)))
    if seed < 2:  # the tied embedding with both uses, and with one
        groups |= {"input_embedding", "head"} if seed == 0 else {"head"}
        groups -= set() if seed == 0 else {"input_embedding"}
    n_top = rng.choice([None, 1])
    g = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(0, model.config.vocab_size, (int(n),), generator=g) for n in torch.randint(4, 12, (2,), generator=g)]
    lr, n_steps = 0.3 / (1 + seed), 1 + seed % 3
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    before["lm_head.weight"] = model.lm_head.weight.detach().clone()
    try:
        updated, _ = prompt_sgd(model, sequences, learning_rate=lr, n_steps=n_steps, params=sorted(groups), n_top_layers=n_top)
    except ValueError as error:  # e.g. only positions on a RoPE model, only biases on a bias-free one
        assert "select no parameter" in str(error)
        assert not any(moving_entries(model, n, groups, n_top).any() for n in before)
        return
    expected = plain_subset_sgd(model, sequences, groups, lr, n_steps, n_top)
    got = {n: p for n, p in updated.named_parameters()}
    got["lm_head.weight"] = updated.lm_head.weight
    assert got.keys() == expected.keys()
    moved = False
    for name in expected:
        mask = moving_entries(model, name, groups, n_top)
        assert torch.equal(got[name][~mask], before[name][~mask]), name  # frozen: bit for bit
        if mask.any():
            assert rel_error(got[name][mask], expected[name][mask]) < 1e-12, name
            moved |= not torch.equal(got[name][mask], before[name][mask])
    assert moved
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the base model is untouched


def test_adamw_subset_leaves_the_rest_bit_for_bit():
    model = random_model(3, bias=True, norm="layernorm", tie_embeddings=True)
    ids = torch.randint(0, model.config.vocab_size, (10,), generator=torch.Generator().manual_seed(1))
    updated, _ = prompt_sgd(model, [ids], learning_rate=1e-2, n_steps=3, optimizer="adamw", params="tint,input_embedding")
    groups = {"v", "attn_out", "mlp", "ln_bias", "input_embedding"}
    assert not torch.equal(updated.tok_emb.weight, updated.lm_head.weight)  # untied: only the input use moved
    assert torch.equal(updated.lm_head.weight, model.lm_head.weight)
    for name, p in updated.named_parameters():
        mask = moving_entries(model, name, groups, None)
        assert torch.equal(p[~mask], model.get_parameter(name)[~mask]), name
        assert not mask.any() or not torch.equal(p[mask], model.get_parameter(name)[mask]), name


@pytest.mark.parametrize("n_top", [None, 1])
def test_tint_preset_is_tints_parameter_subset(n_top):
    """params="tint" is R-exact: exact SGD on exactly the parameters TinT's step updates."""
    model = random_model(11, n_layer=2, bias=True, norm="layernorm", positions="learned", tie_embeddings=True)
    ids = torch.randint(0, model.config.vocab_size, (12,), generator=torch.Generator().manual_seed(2))
    config = TintConfig(learning_rate=0.2, n_simulation_layers=n_top)
    _, state, _ = sgd_reference(model, ids, 12, config, rules="exact")
    updated, _ = prompt_sgd(model, [ids], learning_rate=0.2, params="tint", n_top_layers=n_top)
    got, base = updated.state_dict(), model.state_dict()
    assert got.keys() == state.keys()
    changed = {n for n in state if not torch.equal(state[n], base[n])}
    assert changed == {n for n in got if not torch.equal(got[n], base[n])}
    assert len(changed) == 1 + 10 * (n_top or 2)  # per block: 4 linears x (W, b), 2 norm biases; the final norm bias
    for name, value in state.items():
        assert rel_error(got[name], value) < 1e-12, name


def test_all_preset_is_the_default_step():
    model = random_model(5)
    ids = torch.randint(0, model.config.vocab_size, (9,), generator=torch.Generator().manual_seed(3))
    default, _ = prompt_sgd(model, [ids], learning_rate=0.1, n_steps=2)
    every, _ = prompt_sgd(model, [ids], learning_rate=0.1, n_steps=2, params="all")
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), every.state_dict().values()))


def test_untied_adapted_model_roundtrips(tmp_path):
    model = random_model(7, tie_embeddings=True)
    prompt = torch.randint(0, model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(4))
    query = torch.randint(0, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(5))
    adapted = get_absorb_method("dynamic-eval", learning_rate=0.5, params=["head"]).absorb(model, prompt)
    assert model.config.tie_embeddings and model.lm_head.weight is model.tok_emb.weight  # the base stays tied
    assert torch.equal(adapted.base.tok_emb.weight, model.tok_emb.weight)
    with torch.no_grad():
        assert torch.equal(AdaptedModel.load(adapted.save(tmp_path / "head"))(query), adapted(query))


def test_bad_params_fail_with_one_line():
    model = random_model(1, positions="rope")
    ids = torch.arange(6)
    with pytest.raises(ValueError, match="unknown parameter group 'attn'"):
        get_absorb_method("dynamic-eval", params="attn,mlp")
    with pytest.raises(ValueError, match="params must be a string or a list of strings"):
        get_absorb_method("dynamic-eval", params=3)
    with pytest.raises(ValueError, match="cannot be combined"):
        get_absorb_method("dynamic-eval", params="tint", lora_rank=2)
    with pytest.raises(ValueError, match="select no parameter"):
        prompt_sgd(model, [ids], learning_rate=0.1, params="positions")
