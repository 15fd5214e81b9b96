"""cgt-fold on a plain Transformer with a trained CGT adapter (option adapter=FOLDER): what the harness runs on SmolLM2."""

import pytest
import torch
from cgt_adapter_helpers import random_adapter, random_base, tokens

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
