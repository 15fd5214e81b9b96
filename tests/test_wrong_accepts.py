"""Inputs that used to be accepted and silently ignored or misread (issue 77): each is now a one-line error."""

import pytest
import torch

from incontext.absorb import get_absorb_method
from incontext.cli import commands as cli


@pytest.mark.parametrize("argv", [["absorb", "--model", "smollm2", "--method", "keep-prompt", "--prompt", "x", "--out", ""],
                                  ["generate", "--model", "smollm2", "--adapted", "", "hello"],
                                  ["compare", "--model", "smollm2", "--task", "facts", "--out", ""]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(capsys, argv):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and "an empty path" in capsys.readouterr().err


def test_compare_ratio_without_a_budgeted_method_is_refused(capsys):
    code = cli.main(["compare", "--model", "smollm2", "--task", "facts", "--methods", "keep-prompt,drop-prompt",
                     "--ratio", "0.1", "--out", "runs/never-written"])
    err = capsys.readouterr().err
    assert code == 2 and "none of the compared methods" in err and len(err.strip().splitlines()) == 1


def test_kv_prefix_press_without_a_press_start_is_refused():
    with pytest.raises(ValueError, match="press=snapkv is read only with init=press"):
        get_absorb_method("kv-prefix", init="document", press="snapkv")
    get_absorb_method("kv-prefix", init="press", press="snapkv")  # with its start: fine
    get_absorb_method("kv-prefix", press="snapkv")  # init=auto: the press start where it can be made
    with pytest.raises(ValueError, match="unknown press"):
        get_absorb_method("kv-prefix", press="snapkvv")


def test_kv_press_document_start_past_the_document_is_refused():
    pytest.importorskip("kvpress")
    from incontext import Transformer, TransformerConfig

    model = Transformer(TransformerConfig(vocab_size=40, n_layer=1, d_model=16, n_head=2, positions="rope",
                                          norm="rmsnorm", mlp="swiglu", max_seq_len=64)).eval()
    with pytest.raises(ValueError, match="document_start=12 is at or past the end of the 12-token prompt"):
        get_absorb_method("kv-press", press="knorm", document_start=12).absorb(model, torch.arange(12))


def test_lm_eval_empty_absorbed_is_refused():
    pytest.importorskip("lm_eval")
    from incontext.cli.lm_eval import IncontextLM

    with pytest.raises(ValueError, match="absorbed= is empty"):
        IncontextLM(absorbed="")


def test_export_model_checks_out_before_converting(tmp_path, capsys, monkeypatch):
    """An --out that cannot be created is refused in one line before the model loads (a conversion takes minutes)."""
    import incontext.cli.absorb as absorb_cli

    (tmp_path / "file").write_text("x")
    monkeypatch.setattr(absorb_cli, "load_model", lambda *a, **k: pytest.fail("the model loaded before --out was checked"))
    code = cli.main(["export-model", "--model", "smollm2", "--out", str(tmp_path / "file" / "sub")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot be created" in err and len(err.splitlines()) == 1
