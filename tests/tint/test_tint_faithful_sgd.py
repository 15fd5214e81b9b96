"""The simulator's step against SGD written here with plain autograd (not tint/reference.py), float64: exact
LayerNorm and activation derivatives, value-path attention backward (q, k detached), summed loss, and the
parameter subset of the paper's construction: W_V, b_V, the attention output, the MLP linears and every
LayerNorm bias, the final one included (bias-only LN update). With a small finite-difference eps the
simulator equals it up to O(eps)."""

import pytest
import torch
import torch.nn.functional as F
from conftest import rel_error

from incontext.models import Transformer, TransformerConfig
from incontext.tint import TinT, TintConfig

VOCAB = 40
ACTIVATION = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


def gpt2_like(seed: int, **options) -> Transformer:
    torch.manual_seed(seed)
    settings = {"n_layer": 2, "n_head": 2, "d_model": 12, "vocab_size": VOCAB, "max_seq_len": 32}
    model = Transformer(TransformerConfig(**{**settings, **options})).double().eval()
    with torch.no_grad():  # float64 noise: nontrivial gains and biases, weights not float32-representable
        for name, p in model.named_parameters():
            p.add_((0.2 if "norm" in name or name.endswith("bias") else 0.02) * torch.randn_like(p))
    return model


def forward(c: TransformerConfig, params: dict, ids: torch.Tensor) -> torch.Tensor:
    """GPT-2 forward on one sequence; the attention scores are detached (value-path backward)."""
    T, D, H = ids.shape[0], c.d_model, c.n_head
    x = params["tok_emb.weight"][ids] + params["pos_emb.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(c.n_layer):
        b = f"blocks.{i}."
        z = F.layer_norm(x, (D,), params[b + "norm1.weight"], params[b + "norm1.bias"], c.norm_eps)
        q, k, v = (F.linear(z, params[b + "attn.qkv.weight"], params[b + "attn.qkv.bias"])
                   .view(T, 3, H, D // H).permute(1, 2, 0, 3))
        scores = (q.detach() @ k.detach().transpose(-1, -2)) / (D // H) ** 0.5
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        x = x + F.linear((probs @ v).transpose(0, 1).reshape(T, D), params[b + "attn.out.weight"], params[b + "attn.out.bias"])
        z = F.layer_norm(x, (D,), params[b + "norm2.weight"], params[b + "norm2.bias"], c.norm_eps)
        h = ACTIVATION[c.mlp](F.linear(z, params[b + "mlp.fc_in.weight"], params[b + "mlp.fc_in.bias"]))
        x = x + F.linear(h, params[b + "mlp.fc_out.weight"], params[b + "mlp.fc_out.bias"])
    z = F.layer_norm(x, (D,), params["norm_f.weight"], params["norm_f.bias"], c.norm_eps)
    return z @ params["tok_emb.weight"].T


def sgd_step(model: Transformer, ids, n_train, lr, n_top, final_norm=True, mlp_out_bias_scale=1.0):
    """One SGD step of the summed loss; returns (logits after, updated parameters)."""
    c = model.config
    params = {n: p.detach().clone() for n, p in model.state_dict().items()}
    trainable = ["norm_f.bias"] if final_norm else []
    for i in range(c.n_layer - n_top, c.n_layer):
        trainable += [f"blocks.{i}.{n}" for n in ("norm1.bias", "norm2.bias", "attn.qkv.weight", "attn.qkv.bias",
                                                 "attn.out.weight", "attn.out.bias", "mlp.fc_in.weight",
                                                 "mlp.fc_in.bias", "mlp.fc_out.weight", "mlp.fc_out.bias")]
    leaves = {n: params[n].clone().requires_grad_(True) for n in trainable}
    logits = forward(c, {**params, **leaves}, ids)
    loss = F.cross_entropy(logits[: n_train - 1], ids[1:n_train], reduction="sum")
    for name, grad in zip(trainable, torch.autograd.grad(loss, list(leaves.values()))):
        scale = mlp_out_bias_scale if name.endswith("mlp.fc_out.bias") else 1.0
        params[name] = params[name] - lr * scale * grad  # W_Q, W_K rows get no gradient (detached scores)
    with torch.no_grad():
        return forward(c, params, ids), params


def test_plain_forward_is_the_model():
    model = gpt2_like(0)
    ids = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert rel_error(forward(model.config, dict(model.state_dict()), ids), model(ids[None])[0]) < 1e-13


CASES = [  # (seed, model options, n_simulation_layers)
    (0, {}, None),
    (1, {"mlp": "gelu_tanh", "n_layer": 3, "d_mlp": 24}, 2),
    (2, {"mlp": "relu", "n_layer": 3, "n_head": 3}, 1),
]


def check_step(model, config, n_top, **reference_options):
    ids = torch.randint(0, VOCAB, (13,), generator=torch.Generator().manual_seed(5))
    n_train = 9
    sim = TinT(model, config)
    logits, banks, _ = sim.simulate(ids, n_train)
    ref_logits, ref_params = sgd_step(model, ids, n_train, config.learning_rate, n_top, **reference_options)
    original = model.state_dict()
    assert rel_error(logits, ref_logits) < 1e-8
    for name, value in sim.read_weights(banks).items():
        delta, ref_delta = value - original[name], ref_params[name] - original[name]
        if torch.equal(ref_delta, torch.zeros_like(ref_delta)):
            assert torch.equal(delta, ref_delta), name
        else:
            assert rel_error(delta, ref_delta) < 1e-6, name  # the update itself, O(eps) off
    return sim, banks


@pytest.mark.parametrize("seed,options,n_top", CASES)
def test_step_is_sgd_on_the_paper_subset_final_norm_bias_included(seed, options, n_top):
    model = gpt2_like(seed, **options)
    config = TintConfig(learning_rate=1e-2, n_simulation_layers=n_top, ln_eps=1e-7, act_eps=1e-7)
    sim, banks = check_step(model, config, n_top or model.config.n_layer)
    assert not torch.equal(sim.read_weights(banks)["norm_f.bias"], model.norm_f.bias)


def test_frozen_final_norm_switch():
    model = gpt2_like(3)
    config = TintConfig(learning_rate=1e-2, ln_eps=1e-7, act_eps=1e-7, update_final_norm=False)
    sim, banks = check_step(model, config, 2, final_norm=False)
    assert torch.equal(sim.read_weights(banks)["norm_f.bias"], model.norm_f.bias)


def test_released_code_mlp_out_bias_option_steps_it_n_chunks_times():
    model = gpt2_like(4)  # d_mlp = 4 d_model: four sub-MLPs, as in the released code
    config = TintConfig(learning_rate=1e-2, ln_eps=1e-7, act_eps=1e-7, released_mlp_out_bias=True)
    sim, banks = check_step(model, config, 2, mlp_out_bias_scale=4.0)
    # the forward is unchanged: the four stored quarters add up to the bias
    initial = sim.read_weights(sim.initial_prefixes())
    for i, block in enumerate(model.blocks):
        assert rel_error(initial[f"blocks.{i}.mlp.fc_out.bias"], block.mlp.fc_out.bias) < 1e-15
