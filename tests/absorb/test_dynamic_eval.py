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
