"""cgt-fold on a plain Transformer with a trained CGT adapter (option adapter=FOLDER): what the harness runs on SmolLM2."""

import pytest
import torch
from cgt_adapter_helpers import VOCAB, random_adapter, random_base, tokens

from incontext.absorb import AdaptedModel, get_absorb_method


def test_cgt_fold_with_an_adapter_folder_folds_the_prompt(tmp_path):
    adapter = random_adapter(random_base(0), 0)
    adapter.save_guide(tmp_path / "adapter")
    base = random_base(0)  # the same weights, as the harness loads them (with gradients on)
    method = get_absorb_method("cgt-fold", adapter=str(tmp_path / "adapter"))
    assert method.unsupported(base) is None
    prompt, query = tokens(0, 1, 9), tokens(1, 2, 7)
    adapted = method.absorb(base, prompt[0])
    with torch.no_grad():
        expected = adapter(query, y=adapter.context(prompt)[:, -1])
        assert (adapted(query) - expected).abs().max() < 1e-10
    assert all(p.requires_grad for p in base.parameters())  # the harness's model is left as it was
    loaded = AdaptedModel.load(adapted.save(tmp_path / "saved"))
    with torch.no_grad():
        assert (loaded(query) - expected).abs().max() < 1e-10


def test_cgt_fold_without_an_adapter_is_not_applicable_to_a_plain_model(tmp_path):
    base = random_base(1)
    assert "adapter=FOLDER" in get_absorb_method("cgt-fold").unsupported(base)
    reason = get_absorb_method("cgt-fold", adapter=str(tmp_path / "missing")).unsupported(base)
    assert "does not apply" in reason and "guide.json" in reason
    with pytest.raises(ValueError, match="does not apply"):
        get_absorb_method("cgt-fold").absorb(base, tokens(1, 1, 5)[0])


def test_cgt_fold_runs_in_the_harness_on_a_plain_model(tmp_path):
    from incontext.harness.compare import compare
    from incontext.tasks.episodes import get_episode_source

    class Codec:
        def encode(self, text):
            return [b % VOCAB for b in text.encode()]

    adapter = random_adapter(random_base(2, dtype=torch.float32, max_seq_len=1024), 2)
    adapter.save_guide(tmp_path / "adapter")
    base = random_base(2, dtype=torch.float32, max_seq_len=1024)
    source = get_episode_source("facts", people=1)
    rows = compare(base, source, source.episodes(2, seed=0, tokenizer=Codec()),
                   {"cgt-fold": {"adapter": str(tmp_path / "adapter")}, "cgt-fold:none": {}}, progress=False)
    rows = {row["method"]: row for row in rows}
    assert rows["cgt-fold"]["status"] == "ok" and rows["cgt-fold"]["score"]["n"] == 2
    assert rows["cgt-fold:none"]["status"] == "n/a" and "adapter=FOLDER" in rows["cgt-fold:none"]["reason"]
