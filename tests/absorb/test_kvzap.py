"""KVzap trained here (absorb/kvzap.py): the captured hidden states are what the attention reads, the fit is least
squares (against torch.linalg.lstsq in float64, sums over documents equal to one pass over all), the one-pass press
(kvpress's own KVzapPress with our scorer) scores what the training-time forward scores, on both backends; the
experiment writes a scorer that kv-press reads; one-line errors."""

import pytest
import torch
from conftest import CHAT_TEMPLATE, SENTENCES, tiny_bpe_tokenizer, tiny_llama_backends

transformers = pytest.importorskip("transformers")
kvpress = pytest.importorskip("kvpress")

from incontext.absorb import get_absorb_method  # noqa: E402
from incontext.absorb.kvzap import KVzapFit, KVzipTargets, kvzip_targets, r2, scores_of  # noqa: E402
from incontext.absorb.presses import press_cache  # noqa: E402
from incontext.interop.hf import hf_twin  # noqa: E402
from incontext.interop.models import HFCodec  # noqa: E402

DOCUMENTS = ["Ada Lovelace was born in London. Alan Turing works as a mathematician and has a pet cat named Mat.",
             "Alan Turing has a pet cat named Mat. Ada Lovelace was born in the year 1815 in London.",
             "What is the name of the pet? Mat. Where was Ada born? London, in the year 1815."]


@pytest.fixture(scope="module")
def codec():
    return HFCodec(tiny_bpe_tokenizer(SENTENCES, 300, CHAT_TEMPLATE))


@pytest.fixture(scope="module")
def backends(codec):
    """(our Transformer, the Hugging Face backend) with the same weights: a tiny Llama with grouped K/V heads."""
    return tiny_llama_backends(len(codec.tokenizer))


def placed(codec, text: str) -> torch.Tensor:
    return torch.tensor(codec.encode(codec.chat([{"role": "system", "content": text}])))


@pytest.fixture(scope="module")
def scorer_folder(backends, codec, tmp_path_factory):
    fit = KVzapFit.for_model(backends[0])
    for text in DOCUMENTS:
        fit.add(kvzip_targets(backends[0], placed(codec, text), codec))
    folder = tmp_path_factory.mktemp("kvzap") / "kvzap"
    fit.solve(1e-3).save_pretrained(folder)
    return folder


def test_the_targets_hold_the_hidden_states_the_attention_reads_and_kvzips_scores(backends, codec):
    model = backends[0]
    prompt = placed(codec, DOCUMENTS[0])
    targets = kvzip_targets(model, prompt, codec)
    hf = hf_twin(model)
    first = prompt.shape[0] - targets.positions  # the template's head (and a BOS the backend reads first)
    assert 0 < first < prompt.shape[0]
    with torch.no_grad():
        embedded = hf.model.embed_tokens(prompt[None])
        expected = hf.model.layers[0].input_layernorm(embedded)[0, first:]
    assert (targets.hidden[0] - expected).abs().max() < 1e-5
    assert len(targets.scores) == 2 and targets.scores[0].shape == (targets.positions, 2)
    assert all(((s > 0) & (s <= 1)).all() for s in targets.scores)  # max attention probabilities


@pytest.mark.parametrize("seed", range(3))
def test_the_fit_is_least_squares_and_sums_over_documents(seed):
    g = torch.Generator().manual_seed(seed)
    layers, width, heads = 2, 5 + seed, 1 + seed % 2
    docs = []
    for n in (7, 11, 5):
        hidden = [torch.randn(n, width, generator=g) for _ in range(layers)]
        scores = [torch.rand(n, heads, generator=g) * 0.9 + 0.05 for _ in range(layers)]
        docs.append(KVzipTargets(hidden, scores))
    fit, whole = KVzapFit(layers, width, heads), KVzapFit(layers, width, heads)
    for d in docs:
        fit.add(d)
    whole.add(KVzipTargets([torch.cat([d.hidden[i] for d in docs]) for i in range(layers)],
                           [torch.cat([d.scores[i] for d in docs]) for i in range(layers)]))
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in ((fit.xx, whole.xx), (fit.xy, whole.xy)))
    scorer = fit.solve(ridge=0.0)
    for layer in range(layers):
        x = torch.cat([d.hidden[layer] for d in docs]).double()
        y = torch.cat([d.scores[layer] for d in docs]).double().log()
        design = torch.cat([x, torch.ones(x.shape[0], 1, dtype=torch.float64)], 1)
        solution = torch.linalg.lstsq(design, y, driver="gelsd").solution
        linear = scorer.layers[layer]
        assert torch.allclose(linear.weight.double(), solution[:-1].T, atol=1e-4, rtol=1e-4)
        assert torch.allclose(linear.bias.double(), solution[-1], atol=1e-4, rtol=1e-4)
    assert min(r2(scorer, docs)) > 0  # in-sample: least squares beats the mean


@pytest.mark.parametrize("backend", [0, 1])
@pytest.mark.parametrize("select", ["global", "kvpress"])
def test_the_one_pass_press_scores_what_the_training_forward_scores(backends, codec, scorer_folder, backend, select,
                                                                    monkeypatch):
    """The one-pass press (select=global: kvzap_cache's scores before KVzip's rule; select=kvpress: kvpress's own
    KVzapPress), run by kv-press with our scorer in one prefill, computes per layer the scores the scorer gives the
    captured hidden states (the forward it was fitted with)."""
    from kvpress.presses.kvzap_press import KVzapModel, KVzapPress

    import incontext.absorb.kvzap as kvzap

    model = backends[backend]
    prompt = placed(codec, DOCUMENTS[1])
    seen = {}
    if select == "kvpress":
        score = KVzapPress.score

        def recording(self, module, hidden_states, keys, values, attentions, kwargs):
            out = score(self, module, hidden_states, keys, values, attentions, kwargs)
            seen[module.layer_idx] = out.detach().clone()
            return out

        monkeypatch.setattr(KVzapPress, "score", recording)
    else:
        selection = kvzap.kvzip_selection

        def recording(scores, ratio, n_sink=4):
            seen.update({i: s[None].clone() for i, s in enumerate(scores)})
            return selection(scores, ratio, n_sink)

        monkeypatch.setattr(kvzap, "kvzip_selection", recording)
    adapted = get_absorb_method("kv-press", press="kvzap", weights=str(scorer_folder), ratio=0.5, select=select).absorb(
        model, prompt, codec=codec)
    targets = kvzip_targets(model, prompt, codec)
    expected = scores_of(KVzapModel.from_pretrained(scorer_folder), targets)
    assert len(seen) == len(expected) == 2
    first = seen[0].shape[-1] - targets.positions
    for layer, predicted in enumerate(expected):
        assert (seen[layer][0, :, first:].T - predicted).abs().max() < 1e-5
    assert seen[0].shape[-1] == prompt.shape[0] + (getattr(model, "bos_id", None) is not None)
    full = get_absorb_method("kv-press", press="knorm", ratio=1.0).absorb(model, prompt, codec=codec).kept_bytes(model)
    assert 0.4 * full <= adapted.kept_bytes(model) <= 0.6 * full  # about half of the pairs kept


def test_kvzap_without_weights_or_with_the_wrong_ones_is_a_one_line_error(backends, codec, scorer_folder, tmp_path):
    with pytest.raises(ValueError, match="give weights=FOLDER") as error:
        get_absorb_method("kv-press", press="kvzap")
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="read only by press=kvzap"):
        get_absorb_method("kv-press", press="knorm", weights=str(scorer_folder))
    prompt = placed(codec, DOCUMENTS[0])
    with pytest.raises(ValueError, match="holds no KVzap scorer"):
        press_cache(backends[0], prompt[None], "kvzap", 0.5, codec, weights=str(tmp_path / "none"))
    other = KVzapFit(3, 32, 2)
    other.add(KVzipTargets([torch.randn(4, 32)] * 3, [torch.rand(4, 2)] * 3))
    other.solve().save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="train one for it") as error:
        press_cache(backends[0], prompt[None], "kvzap", 0.5, codec, weights=str(tmp_path / "other"))
    assert "\n" not in str(error.value)


def test_the_experiment_writes_a_scorer_kv_press_reads(codec, tmp_path):
    """`incontext run kvzap-train` on a tiny Hugging Face folder (dev documents of two sources): it writes kvpress's
    KVzapModel in <out>/kvzap and its table; `incontext absorb --method kv-press --set press=kvzap --set weights=...`
    presses with it."""
    from incontext.cli.commands import main

    torch.manual_seed(1)
    config = transformers.LlamaConfig(vocab_size=len(codec.tokenizer), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=4096, bos_token_id=0, eos_token_id=1)
    folder = tmp_path / "tiny"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    codec.tokenizer.save_pretrained(folder)
    out = tmp_path / "kvzap-run"
    assert main(["run", "kvzap-train", "--set", f"model={folder}", "--set", "squad=3", "--set", "hotpotqa=0",
                 "--set", "documents=1", "--set", "heldout_every=2", "--out", str(out)]) == 0
    assert (out / "kvzap" / "config.json").is_file() and (out / "kvzap" / "model.safetensors").is_file()
    assert "R^2" in (out / "table.md").read_text()
    absorbed = tmp_path / "absorbed"
    assert main(["absorb", "--model", str(folder), "--method", "kv-press", "--prompt", DOCUMENTS[0], "--set",
                 "press=kvzap", "--set", f"weights={out / 'kvzap'}", "--set", "ratio=0.5", "--out", str(absorbed)]) == 0
    assert (absorbed / "absorb.json").is_file()


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.6])
def test_global_selection_on_kvzips_own_scores_keeps_what_kvzip_keeps(backends, codec, ratio):
    """select=global is KVzip's eviction rule: given KVzip's own scores (as a scorer that returns them), kvzap_cache
    keeps exactly the pairs kv-press with KVzip keeps (a raw document: KVzip scores every position)."""
    from types import SimpleNamespace

    from incontext.absorb.kvzap import kvzap_cache

    model = backends[0]
    assert getattr(model, "bos_id", None) is None
    prompt = torch.tensor(codec.encode(DOCUMENTS[0] + " " + DOCUMENTS[2]))
    targets = kvzip_targets(model, prompt, codec, start=0)
    assert targets.positions == prompt.shape[0]
    ours = kvzap_cache(model, prompt, SimpleNamespace(layers=[_Fixed(s) for s in targets.scores]), ratio)
    theirs = press_cache(model, prompt[None], "kvzip", ratio, codec, start=0)
    for a, b in zip(ours.layers, theirs.layers):
        assert torch.equal(a.keep, b.keep)
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


class _Fixed(torch.nn.Module):
    """A 'scorer layer' that returns fixed log scores whatever it is given."""

    def __init__(self, scores: torch.Tensor):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.scores = scores

    def forward(self, x):
        return self.scores.clamp_min(1e-30).log()


def test_global_selection_is_the_default_and_beats_nothing_kept(backends, codec, scorer_folder):
    """press=kvzap keeps `ratio` of the pairs with select=global (one prefill) on both backends, the same pairs on
    both; select=kvpress runs kvpress's KVzapPress; select on another press is a one-line error."""
    prompt = placed(codec, DOCUMENTS[2])
    kept = []
    for model in backends:
        adapted = get_absorb_method("kv-press", press="kvzap", weights=str(scorer_folder), ratio=0.3).absorb(
            model, prompt, codec=codec)
        kept.append(adapted.kept_bytes(model))
    assert kept[0] == kept[1] > 0
    full = get_absorb_method("kv-press", press="knorm", ratio=1.0).absorb(backends[0], prompt, codec=codec).kept_bytes(
        backends[0])
    assert 0.25 * full <= kept[0] <= 0.35 * full
    with pytest.raises(ValueError, match="select is read only by press=kvzap"):
        get_absorb_method("kv-press", press="knorm", select="kvpress")
