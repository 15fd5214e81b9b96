import torch
from conftest import rel_error

from incontext.absorb import AdaptedModel, get_absorb_method
from incontext.models import Transformer, TransformerConfig
from incontext.tint import TintConfig, sgd_reference


def small_model():
    torch.manual_seed(0)
    return Transformer(TransformerConfig(n_layer=2, n_head=2, d_model=12, vocab_size=30, max_seq_len=32)).double().eval()


def test_dynamic_eval_absorb_updates_and_roundtrips(tmp_path):
    model = small_model()
    prompt = torch.randint(0, 30, (8,), generator=torch.Generator().manual_seed(1))
    query = torch.randint(0, 30, (1, 4), generator=torch.Generator().manual_seed(2))
    adapted = get_absorb_method("dynamic-eval", learning_rate=0.05).absorb(model, prompt)
    with torch.no_grad():
        logits = adapted(query)
        assert not torch.allclose(logits, model(query, position_offset=8))
        loaded = AdaptedModel.load(adapted.save(tmp_path / "dyn"))
        assert torch.equal(loaded(query), logits)


def test_tint_absorb_equals_r_approx():
    model = small_model()
    prompt = torch.randint(0, 30, (8,), generator=torch.Generator().manual_seed(3))
    query = torch.randint(0, 30, (1, 4), generator=torch.Generator().manual_seed(4))
    adapted = get_absorb_method("tint", learning_rate=0.05).absorb(model, prompt)
    _, state, _ = sgd_reference(model, prompt, 8, TintConfig(learning_rate=0.05))
    reference = Transformer(model.config).double().eval()
    reference.load_state_dict(state)
    with torch.no_grad():
        assert rel_error(adapted(query), reference(query, position_offset=8)) < 1e-9


def plain_sgd(model, documents, learning_rate):
    """One SGD step on all parameters, exact gradient of the cross-entropy summed over the (ids, targets)
    documents (targets: bool over positions, the tokens predicted), each document from position 0."""
    import copy

    import torch.nn.functional as F

    updated = copy.deepcopy(model).requires_grad_(True)
    loss = sum(F.cross_entropy(updated(ids[None])[0][:-1][keep[1:]], ids[1:][keep[1:]], reduction="sum") for ids, keep in documents)
    grads = torch.autograd.grad(loss, list(updated.parameters()))
    with torch.no_grad():
        for p, g in zip(updated.parameters(), grads):
            p -= learning_rate * g
    return updated.requires_grad_(False)


def test_dynamic_eval_keep_prompt_reads_the_prompt_with_updated_weights(tmp_path):
    model = small_model()
    g = torch.Generator().manual_seed(5)
    prompt, query = torch.randint(0, 30, (9,), generator=g), torch.randint(0, 30, (1, 5), generator=g)
    adapted = get_absorb_method("dynamic-eval", learning_rate=0.05, keep_prompt=True).absorb(model, prompt)
    keep = torch.ones(9, dtype=torch.bool)
    keep[0] = False
    reference = plain_sgd(model, [(prompt, keep)], 0.05)
    with torch.no_grad():
        expected = reference(torch.cat([prompt[None], query], 1))[:, 9:]
        assert rel_error(adapted(query), expected) < 1e-12
        assert rel_error(adapted(query), reference(query, position_offset=9)) > 1e-3  # the prompt is in the context
        assert adapted.kept_bytes(model) > sum(p.numel() * 8 for p in model.parameters())  # weights + cache
        assert torch.equal(AdaptedModel.load(adapted.save(tmp_path / "kept"))(query), adapted(query))


def test_dynamic_eval_separator_trains_on_each_document_with_its_loss_mask():
    """separator: documents trained on separately (summed loss), labels only; the query starts at position 0."""
    model = small_model()
    g = torch.Generator().manual_seed(6)
    docs = [torch.randint(2, 30, (int(n),), generator=g) for n in (5, 7, 4)]
    sep = [0, 1]
    prompt = torch.cat([torch.cat([d, torch.tensor(sep)]) for d in docs])
    mask = torch.cat([torch.cat([torch.arange(len(d)) == len(d) - 1, torch.zeros(2, dtype=torch.bool)]) for d in docs])
    query = torch.randint(2, 30, (1, 6), generator=g)
    adapted = get_absorb_method("dynamic-eval", learning_rate=0.1, separator=sep).absorb(model, prompt, loss_mask=mask)
    reference = plain_sgd(model, [(d, torch.arange(len(d)) == len(d) - 1) for d in docs], 0.1)
    with torch.no_grad():
        assert rel_error(adapted(query), reference(query)) < 1e-12
        assert rel_error(reference(query), model(query)) > 1e-4


def test_tint_separator_sums_the_documents_updates():
    """TinT's single mode: the update of several documents is the sum of each one's R-approx update."""
    model = small_model()
    g = torch.Generator().manual_seed(7)
    docs = [torch.randint(2, 30, (int(n),), generator=g) for n in (6, 8)]
    prompt = torch.cat([docs[0], torch.tensor([1]), docs[1]])
    adapted = get_absorb_method("tint", learning_rate=0.05, separator=[1]).absorb(model, prompt)
    base = model.state_dict()
    total = {name: value.clone() for name, value in base.items()}
    for d in docs:
        _, state, _ = sgd_reference(model, d, len(d), TintConfig(learning_rate=0.05))
        for name, value in state.items():
            total[name] += value - base[name]
    reference = Transformer(model.config).double().eval()
    reference.load_state_dict(total)
    query = torch.randint(2, 30, (1, 5), generator=g)
    with torch.no_grad():
        assert rel_error(adapted(query), reference(query)) < 1e-9


def test_separator_and_options_are_checked_by_name():
    import pytest

    for name in ("dynamic-eval", "tint"):
        assert get_absorb_method(name, keep_prompt=True, separator=[3, 4]).options.separator == [3, 4]
        with pytest.raises(ValueError, match="separator must be a non-empty list of token ids"):
            get_absorb_method(name, separator=[])
        with pytest.raises(ValueError, match="separator"):
            get_absorb_method(name, separator="\n\n")
    model = small_model()
    with pytest.raises(ValueError, match="no document of at least 2 tokens"):
        get_absorb_method("dynamic-eval", separator=[5]).absorb(model, torch.tensor([5, 1, 5, 2, 5]))


def test_dynamic_eval_lora_step_is_the_projected_gradient_step():
    """One SGD step of a LoRA (B = 0, A drawn from the seed) changes each targeted weight by
    -lr s^2 G A^T A (G: the weight's gradient, s = alpha / r) and nothing else (float64, plain reference)."""
    import math

    import pytest
    import torch.nn.functional as F

    model = small_model()
    prompt = torch.randint(0, 30, (10,), generator=torch.Generator().manual_seed(7))
    lr, rank, alpha = 0.05, 3, 5.0
    adapted = get_absorb_method("dynamic-eval", learning_rate=lr, lora_rank=rank, lora_alpha=alpha, seed=4,
                                n_top_layers=1).absorb(model, prompt)
    plain = {k: v.clone() for k, v in model.named_parameters()}
    reference = model.requires_grad_(True)
    loss = F.cross_entropy(reference(prompt[None])[0][:-1], prompt[1:], reduction="sum")
    names = ["blocks.1.attn.qkv", "blocks.1.attn.out"]  # the top block's default targets, in the LoRA's order
    grads = dict(zip(names, torch.autograd.grad(loss, [model.get_submodule(n).weight for n in names])))
    model.requires_grad_(False)
    generator, s = torch.Generator().manual_seed(4), alpha / rank
    expected = dict(plain)
    for name in names:
        weight = plain[f"{name}.weight"]
        bound = 1.0 / math.sqrt(weight.shape[1])
        a = torch.empty(rank, weight.shape[1], dtype=torch.float64).uniform_(-bound, bound, generator=generator)
        expected[f"{name}.weight"] = weight - lr * s * s * grads[name] @ a.T @ a
    got = dict(adapted.base.named_parameters())
    assert got.keys() == expected.keys()
    for key in expected:
        assert rel_error(got[key], expected[key]) < 1e-12, key
    assert any(not torch.equal(got[f"{n}.weight"], plain[f"{n}.weight"]) for n in names)
    with pytest.raises(ValueError, match="lora_rank must be an integer >= 1"):
        get_absorb_method("dynamic-eval", lora_rank=0)
    with pytest.raises(ValueError, match="lora_targets must be a non-empty subset"):
        get_absorb_method("dynamic-eval", lora_rank=2, lora_targets=["attn.q"])
