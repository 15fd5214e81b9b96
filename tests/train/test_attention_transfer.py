"""Learned (Hedgehog-style) feature maps: the kernel and loss against plain references, attention transfer on a
tiny random softmax model (loss and conversion error fall below FAVOR+ at equal feature count), resuming,
and exact ICLCA on the linearized model in float64."""

import dataclasses

import pytest
import torch

from conftest import rel_error
from incontext.absorb import ICLCA, AdaptedModel, ICLCAApprox, SoftmaxFeaturePrefix, convert_approximately
from incontext.models import Cache, Transformer, TransformerConfig
from incontext.ops.feature_maps import LearnedFeatures, attention_distillation_loss, attention_distillation_losses, log_kernel
from incontext.train.attention_transfer import (
    TransferConfig, capture_queries_keys, conversion_kl, fit_feature_maps, linearize, load_feature_maps, load_finished_maps,
    model_scale, read_options, save_feature_maps, tune_maps_for_conversion,
)


def softmax_llama(seed=0, sharpen=4.0, **options):
    """A tiny random Llama-like model (RoPE, RMSNorm, SwiGLU, GQA) with sharper attention than the init gives."""
    torch.manual_seed(seed)
    config = {"vocab_size": 61, "n_layer": 2, "d_model": 48, "n_head": 4, "n_kv_head": 2, "positions": "rope",
              "norm": "rmsnorm", "mlp": "swiglu", "bias": False, **options}
    model = Transformer(TransformerConfig(**config)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(sharpen)
    return model


def tokens(seed, batch, length, vocab=61):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def perturbed_maps_and_qk(seed, n_head, batch):
    """float64 maps moved off their init, and large-norm q, k (batch, n_head, 9, 8)."""
    g = torch.Generator().manual_seed(seed)
    maps = LearnedFeatures(n_head, 8, 12, scale=0.3, seed=2).double()
    with torch.no_grad():
        for p in maps.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    q, k = (3 * torch.randn(batch, n_head, 9, 8, generator=g, dtype=torch.float64) for _ in range(2))
    return maps, q, k


def test_log_kernel_and_loss_match_plain_references():
    maps, q, k = perturbed_maps_and_qk(1, 3, 2)
    lq, lk = maps.log_q(q), maps.log_k(k)
    plain = torch.logsumexp(lq[..., :, None, :] + lk[..., None, :, :], dim=-1)
    assert rel_error(log_kernel(lq, lk), plain) < 1e-12
    scores = (q @ k.transpose(-2, -1)) * 0.3
    for split in (None, 4):
        mixed = plain if split is None else torch.where(torch.arange(9) < split, plain, scores)
        loss, rows = 0.0, range(0 if split is None else split, 9)
        for i in rows:  # row by row: KL(softmax of the exact scores || softmax of the mixed ones) over keys <= i
            p = torch.softmax(scores[..., i, : i + 1], -1)
            loss = loss + (p * (torch.log(p) - torch.log_softmax(mixed[..., i, : i + 1], -1))).sum(-1)
        assert abs(attention_distillation_loss(maps, q, k, 0.3, split=split).item() - (loss / len(rows)).mean().item()) < 1e-12


def test_per_window_splits_average_every_windows_own_rows():
    maps, q, k = perturbed_maps_and_qk(5, 2, 3)
    splits = [2, 7, 4]
    total, rows = 0.0, 0
    for b, split in enumerate(splits):  # window by window, through the one-split form: a plain weighted mean
        n = 2 * (9 - split)  # heads x rows
        total += attention_distillation_loss(maps, q[b:b + 1], k[b:b + 1], 0.3, split=split).item() * n
        rows += n
    (loss,) = attention_distillation_losses(maps, q, k, 0.3, (torch.tensor(splits),))
    assert abs(loss.item() - total / rows) < 1e-12
    (same,) = attention_distillation_losses(maps, q, k, 0.3, (torch.tensor([4, 4, 4]),))
    assert abs(same.item() - attention_distillation_loss(maps, q, k, 0.3, split=4).item()) < 1e-12


def test_the_untrained_map_estimates_exp_of_the_scaled_dot_product():
    # at init, phi(q) . phi(k) is the antithetic FAVOR+ estimate of exp(q.k * scale): unbiased, error ~ 1/sqrt(m)
    g = torch.Generator().manual_seed(0)
    q, k = (0.5 * torch.randn(1, 1, 6, 16, generator=g, dtype=torch.float64) for _ in range(2))
    exact = (q @ k.transpose(-2, -1)) * 0.25
    errors = []
    for features in (16, 4096):
        maps = LearnedFeatures(1, 16, features, scale=0.25, seed=3).double()
        errors.append(rel_error(torch.exp(log_kernel(maps.log_q(q), maps.log_k(k))), torch.exp(exact)))
    assert errors[1] < errors[0] / 4 and errors[1] < 0.05


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(ValueError, match="even"):
        LearnedFeatures(2, 8, 7, scale=1.0)
    with pytest.raises(ValueError, match="expect"):
        LearnedFeatures(2, 8, 8, scale=1.0).log_q(torch.zeros(1, 3, 4, 8))
    with pytest.raises(ValueError, match="n_features"):
        TransferConfig(n_features=9)
    with pytest.raises(FileNotFoundError, match="no learned feature maps"):
        load_feature_maps(tmp_path)
    with pytest.raises(FileNotFoundError, match="no learned feature maps"):
        ICLCAApprox(features=str(tmp_path))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Maps trained on a tiny random model's training windows (never the prompts/queries tested below)."""
    torch.manual_seed(0)
    model = softmax_llama()
    folder = tmp_path_factory.mktemp("maps")
    captures = capture_queries_keys(model, tokens(100, 12, 48))
    config = TransferConfig(n_features=16, steps=150, lr=0.02, batch=4)
    maps = fit_feature_maps(captures, config, scale=model_scale(model), folder=folder, progress=False)
    return model, captures, config, folder, maps


def test_training_lowers_the_distillation_loss(trained):
    model, captures, _, folder, _ = trained
    losses = read_options(folder)["losses"]
    assert len(losses) == model.config.n_layer
    for layer in losses:
        assert layer["after"]["linear"] < 0.6 * layer["before"]["linear"]
        assert layer["after"]["converted"] < 0.6 * layer["before"]["converted"]


def test_learned_conversion_beats_favor_at_equal_feature_count(trained):
    model, _, config, folder, _ = trained
    model = model.double()
    prompt, query = tokens(7, 6, 40), tokens(8, 6, 12)
    reference = model(torch.cat([prompt, query], 1))[:, 40:]
    learned = rel_error(ICLCAApprox(features=str(folder)).absorb(model, prompt)(query), reference)
    favor = [rel_error(ICLCAApprox(n_features=config.n_features, seed=s).absorb(model, prompt)(query), reference) for s in range(3)]
    without = rel_error(model(query, position_offset=40), reference)
    assert learned < min(favor) and learned < without
    model.float()


def test_resuming_trains_as_an_uninterrupted_run(trained, tmp_path):
    model, captures, config, folder, maps = trained
    options = read_options(folder)
    save_feature_maps(maps[:1], tmp_path, {**options, "losses": options["losses"][:1]})  # stopped after layer 0
    with pytest.raises(ValueError, match="only 1 of 2"):
        load_feature_maps(tmp_path)
    resumed = fit_feature_maps(captures, config, scale=model_scale(model), folder=tmp_path, progress=False)
    for a, b in zip(resumed, maps):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), name
    with pytest.raises(ValueError, match="other options"):
        fit_feature_maps(captures, TransferConfig(n_features=8), scale=1.0, folder=tmp_path, progress=False)
    with pytest.raises(ValueError, match="other options .*splits"):  # fixed splits are part of the options
        fit_feature_maps(captures, config, scale=model_scale(model), folder=tmp_path, progress=False, splits=[20] * 12)


def test_finished_maps_are_reused_only_when_fitted_alike(trained, tmp_path):
    model, _, config, folder, maps = trained
    training = dataclasses.asdict(config)
    loaded = load_finished_maps(folder, 2, {"training": training, "splits": None})
    assert all(torch.equal(a.weight_q, b.weight_q) for a, b in zip(loaded, maps))
    assert load_finished_maps(folder, 3, {"training": training}) is None  # not finished for a 3-layer model
    assert load_finished_maps(tmp_path, 2, {"training": training}) is None  # nothing there
    with pytest.raises(ValueError, match="other settings \\(training, splits\\)"):
        load_finished_maps(folder, 2, {"training": {**training, "steps": 1}, "splits": [3] * 12})


def test_fixed_splits_are_checked_and_used(trained, tmp_path):
    model, captures, _, _, _ = trained
    config = TransferConfig(n_features=16, steps=5, lr=0.02, batch=4)
    for bad in ([20] * 11, [0] * 12, [48] * 12):
        with pytest.raises(ValueError, match="splits must"):
            fit_feature_maps(captures, config, scale=model_scale(model), progress=False, splits=bad)
    fixed = fit_feature_maps(captures, config, scale=model_scale(model), folder=tmp_path, progress=False,
                             splits=[20, None] * 6)
    assert read_options(tmp_path)["splits"] == [20, None] * 6
    drawn = fit_feature_maps(captures, config, scale=model_scale(model), progress=False)
    assert not torch.equal(fixed[0].weight_q, drawn[0].weight_q)


def test_approximate_conversion_with_learned_maps_saves_and_loads(trained, tmp_path):
    model, _, _, folder, _ = trained
    adapted = ICLCAApprox(features=str(folder), exact_sinks=1).absorb(model, tokens(3, 1, 14))
    adapted.save(tmp_path / "adapted")
    loaded = AdaptedModel.load(tmp_path / "adapted")
    assert isinstance(loaded, SoftmaxFeaturePrefix) and loaded.maps is not None
    query = tokens(4, 1, 6)
    assert torch.equal(loaded(query), adapted(query))
    last = model.config.n_layer - 1  # a hybrid keeps only its converted layers' maps
    hybrid = ICLCAApprox(features=str(folder), layers=str(last)).absorb(model, tokens(3, 1, 14))
    assert list(hybrid.maps) == [str(last)]
    hybrid.save(tmp_path / "hybrid")
    assert torch.equal(AdaptedModel.load(tmp_path / "hybrid")(query), hybrid(query))


def test_linearized_model_converts_exactly_in_float64(trained):
    model, _, _, _, maps = trained
    linear = linearize(model, maps).double()
    with torch.no_grad():  # weights that float32 cannot represent
        for p in linear.parameters():
            p.add_(1e-9 * torch.randn_like(p))
    prompt, query = tokens(11, 3, 37), tokens(12, 3, 10)
    prompted = linear(torch.cat([prompt, query], 1))[:, 37:]
    converted = ICLCA().absorb(linear, prompt)(query)
    assert rel_error(converted, prompted) < 1e-10
    assert rel_error(linear(query), prompted) > 1e-3  # the prompt matters (the test can fail)


@pytest.mark.parametrize("impl", ["recurrent", "parallel", "chunked"])
def test_learned_linear_attention_forms_and_decoding_agree(trained, impl):
    model, _, _, _, maps = trained
    linear = linearize(model, maps, linear_impl=impl).double()
    reference = linearize(model, maps, linear_impl="recurrent").double()
    x = tokens(13, 2, 30)
    full = linear(x)
    assert rel_error(full, reference(x)) < 1e-12
    cache = Cache.empty(linear.config.n_layer)
    pieces = [linear(x[:, :17], cache=cache), linear(x[:, 17:18], cache=cache), linear(x[:, 18:], cache=cache)]
    assert rel_error(torch.cat(pieces, 1), full) < 1e-12


def test_linearized_model_is_close_to_its_softmax_source(trained):
    model, _, _, _, maps = trained
    x = tokens(14, 2, 40)
    untrained = [LearnedFeatures(4, 12, 16, scale=model_scale(model), seed=i) for i in range(2)]
    reference = model(x)
    assert rel_error(linearize(model, maps)(x), reference) < rel_error(linearize(model, untrained)(x), reference)


def test_linearize_refuses_maps_that_do_not_fit(trained):
    model, _, _, _, maps = trained
    with pytest.raises(ValueError, match="do not fit"):
        linearize(model, maps[:1])
    linear = linearize(model, maps)
    with pytest.raises(ValueError, match="softmax"):
        linearize(linear, maps)
    with pytest.raises(ValueError, match="do not fit"):
        convert_approximately(model, tokens(1, 1, 4), maps=maps[:1])


def test_conversion_kl_is_the_kl_of_the_approximately_converted_model(trained):
    model, _, _, folder, _ = trained
    model = model.double()
    try:
        maps = [m.double() for m in load_feature_maps(folder)]
        prompt, query = tokens(40, 1, 19), tokens(41, 1, 7)
        converted = ICLCAApprox(features=str(folder), exact_sinks=0).absorb(model, prompt)  # as conversion_kl converts
        converted.maps.double()
        log_converted = torch.log_softmax(converted(query), -1)
        target = torch.log_softmax(model(torch.cat([prompt, query], 1))[:, 19:], -1)
        plain = (target.exp() * (target - log_converted)).sum(-1).mean()
        assert abs(conversion_kl(model, maps, prompt, query).item() - plain.item()) < 1e-12 * max(1.0, plain.item())
    finally:
        model.float()


def test_end_to_end_tuning_lowers_the_conversion_kl_and_leaves_the_model_alone(trained):
    model, _, _, folder, _ = trained
    weights = {name: p.clone() for name, p in model.state_dict().items()}
    pairs = [(w[:30], w[30:]) for w in tokens(200, 16, 44)]  # training pairs (other seeds than the fit's windows)
    held_out = [(w[:30], w[30:]) for w in tokens(300, 6, 44)]

    def mean_kl(maps, which):
        with torch.no_grad():
            return sum(conversion_kl(model, maps, p[None], q[None]).item() for p, q in which) / len(which)

    runs = []
    for _ in range(2):
        maps = load_feature_maps(folder)
        before = (mean_kl(maps, pairs), mean_kl(maps, held_out))
        losses = tune_maps_for_conversion(model, maps, pairs, steps=40, lr=0.01, batch=4, seed=1, progress=False)
        runs.append(maps)
    assert len(losses) == 40
    after = (mean_kl(maps, pairs), mean_kl(maps, held_out))
    assert after[0] < 0.8 * before[0] and after[1] < before[1], (before, after)
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0].state_dict().values(), runs[1][0].state_dict().values()))
    assert all(torch.equal(p, weights[name]) for name, p in model.state_dict().items())
    assert not any(p.requires_grad for p in model.parameters()) or all(p.requires_grad for p in model.parameters())
    assert not any(p.requires_grad for m in maps for p in m.parameters())
    with pytest.raises(ValueError, match="needs pairs"):
        tune_maps_for_conversion(model, maps, [], steps=1, lr=0.01, batch=1)
