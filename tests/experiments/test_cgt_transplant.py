"""cgt-transplant (CGT Table 1's task-vector baseline) on a toy size: the residual stream written at a layer is what
a later run reads (a vector written at every position of the last layer decides the logits), and a toy run writes
per-layer accuracies for both tokens."""

import json

import torch

from incontext.cli.commands import main
from incontext.experiments.cgt_transplant import layer_outputs, with_written
from incontext.models import Transformer, TransformerConfig


def test_writing_the_stream_changes_only_what_reads_it():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=16, n_layer=3, d_model=32, n_head=4)).eval()
    x = torch.randint(0, 16, (2, 10))
    hidden = layer_outputs(model, x)
    assert len(hidden) == 3 and torch.allclose(model.lm_head(model.norm_f(hidden[-1])), model(x), atol=1e-6)
    # writing a layer's own values back changes nothing; another sequence's values change the later positions only
    assert torch.allclose(with_written(model, x, 1, [4], hidden[1][:, 4]), model(x), atol=1e-6)
    other = layer_outputs(model, torch.randint(0, 16, (2, 10)))[1][:, 4]
    written = with_written(model, x, 1, [4], other)
    assert torch.allclose(written[:, :4], model(x)[:, :4], atol=1e-6) and not torch.allclose(written[:, 4:], model(x)[:, 4:])


def test_a_toy_run_reports_each_token_by_layer(tmp_path):
    out = tmp_path / "transplant"
    assert main(["run", "cgt-transplant", "--set", "steps=4", "--set", "seeds=[0]", "--set", "workers=1",
                 "--set", "eval_sequences=8", "--set", "n_layer=2", "--set", "split_layer=1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    transplant = results["runs"][0]["transplant"]
    assert set(transplant) == {"=", "|"} and all(len(v) == 2 and all(0 <= a <= 1 for a in v) for v in transplant.values())
    assert "task vector at '='" in (out / "table.md").read_text() and (out / "transplant.png").is_file()
