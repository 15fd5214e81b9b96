"""Each guide in docs/guides/ followed literally: its Python blocks run as written (against copies of the
registries, so nothing stays registered), the result shows up where the guide says, and every command of a guide
and of the README parses."""

import contextlib
import re
import shlex
from pathlib import Path

import pytest
import torch

from incontext.cli import commands as cli, catalog as cli_catalog
import docsync as docs
from incontext.absorb import protocol as base
from incontext.harness.compare import compare
from incontext.models import Transformer, TransformerConfig
from incontext.tasks import episodes, metrics

ROOT = docs.repo_root()
GUIDES = ROOT / "docs" / "guides"


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)


def run_python(page: Path) -> dict:
    """Runs every Python block of the page in one namespace, in order."""
    namespace: dict = {"__name__": f"guide_{page.stem.replace('-', '_')}"}
    for code in blocks(page, "python"):
        exec(compile(code, str(page), "exec"), namespace)
    return namespace


def commands(page: Path) -> list[list[str]]:
    """The `incontext` command lines of the page's bash blocks (continuations joined, comments dropped), as the
    arguments after `incontext` (a `torchrun ... -m incontext.cli` line counts too)."""
    found = []
    for block in blocks(page, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["incontext"]:
                found.append(words[1:])
            elif words[:1] == ["torchrun"] and "incontext.cli" in words:
                found.append(words[words.index("incontext.cli") + 1:])
    return found


def parses(args: list[str]) -> None:
    """The command line is valid (a --help one prints its help and exits 0)."""
    try:
        cli.build_parser().parse_args(args)
    except SystemExit as exit_:
        assert exit_.code == 0 and "--help" in args, f"incontext {' '.join(args)} does not parse"


@pytest.fixture
def registries(monkeypatch, tmp_path):
    """The registries scoped (what a guide registers is gone after the test) and a catalog in tmp_path that
    `write()` regenerates, as `python -m incontext.cli.catalog` does."""
    monkeypatch.setattr(cli_catalog, "CATALOG", tmp_path / "catalog.json")
    with contextlib.ExitStack() as stack:
        for registry in (base.METHODS, base.ADAPTED, base.PEFT_FORMS, episodes.SOURCES, metrics.METRICS):
            stack.enter_context(registry.scoped())
        yield lambda: cli_catalog.write_catalog()


def help_text(capsys, args) -> str:
    try:
        code = cli.main(args)
    except SystemExit as exit_:
        code = exit_.code
    assert code in (0, None)
    return capsys.readouterr().out


def tiny_lm(vocab=128) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=vocab, n_layer=2, d_model=32, n_head=4, max_seq_len=512)).double().eval()


class Chars:
    """A character codec for the tiny model."""

    def encode(self, text):
        return [min(ord(c), 127) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


# ----------------------------------------------------------------------------- add an absorb method


def test_add_an_absorb_method(registries, capsys, tmp_path):
    page = GUIDES / "add-absorb-method.md"
    guide = run_python(page)
    assert base.absorb_methods().count("keep-tail") == 1 and base.method_options("keep-tail") == ["tokens"]
    registries()  # step 2: python -m incontext.cli.catalog
    listed = help_text(capsys, ["absorb", "--list"])
    assert "keep-tail" in listed and guide["KeepTail"].summary in listed and "tokens=32" in listed
    assert "how many of the prompt's last tokens stay in the context" in listed  # the field's help (its metadata)
    compare_help = " ".join(help_text(capsys, ["compare", "--help"]).split())
    assert "keep-tail needs a causal LM: keeps only the prompt's last `tokens` tokens" in compare_help
    assert "keep-tail" in help_text(capsys, ["absorb", "--help"])
    # step 3: the harness runs it; the whole prompt kept is keep-prompt exactly, and it saves and loads
    model, codec = tiny_lm(), Chars()
    source = episodes.get_episode_source("facts", people=1)
    eps = source.episodes(2, seed=0, tokenizer=codec)
    rows = compare(model, source, eps, {"keep-tail": {"tokens": 10_000}, "keep-tail:short": {"tokens": 8}}, progress=False)
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert rows[2]["agreement"]["relative_logits_error"] < 1e-12 and rows[3]["agreement"]["relative_logits_error"] > 1e-3
    adapted = base.get_absorb_method("keep-tail", tokens=8).absorb(model, eps[0].prompt)
    query = eps[0].queries[0].inputs[None]
    loaded = base.AdaptedModel.load(adapted.save(tmp_path / "tail"))
    torch.testing.assert_close(loaded(query), adapted(query))
    for args in commands(page):
        parses(args)


# ----------------------------------------------------------------------------- add an episode task


def test_add_an_episode_task_and_a_metric(registries, capsys):
    page = GUIDES / "add-episode-task.md"
    run_python(page)
    source = episodes.get_episode_source("capitals", pairs=2)
    eps = source.episodes(3, seed=0, tokenizer=Chars())
    assert eps[0].prompt.tolist() == source.episodes(3, seed=0, tokenizer=Chars())[0].prompt.tolist()  # seeded
    assert len(eps) == 3 and all(len(e.queries) == 2 for e in eps) and source.higher_is_better
    registries()
    text = " ".join(help_text(capsys, ["compare", "--help"]).split())
    assert "capitals invented countries and their capitals in the prompt" in text and "[exact match %]; text models" in text
    rows = compare(tiny_lm(), source, eps, {}, progress=False)
    assert [r["method"] for r in rows] == ["keep-prompt", "drop-prompt"] and all(r["status"] == "ok" for r in rows)
    # the metric of step 2: registered, and the harness scores with it
    first = metrics.get_metric("first-token")
    assert first.label == "first token %" and "first-token" in cli_catalog.catalog()["metrics"]
    source.metric = "first-token"  # an instance attribute: the class keeps "exact"
    rows = compare(tiny_lm(), source, eps, {}, progress=False)
    assert 0.0 <= rows[0]["score"]["mean"] <= 1.0
    for args in commands(page):
        parses(args)


# ----------------------------------------------------------------------------- add a model family


def test_add_a_model_family():
    transformers = pytest.importorskip("transformers")
    from incontext.interop import hf as interop_hf
    from incontext.models import families

    with families.FAMILIES.scoped(), interop_hf.CONVERSIONS.scoped():
        families.FAMILIES.unregister("mistral")  # the tables before the guide's rows
        interop_hf.CONVERSIONS.unregister("mistral")
        check_the_family_guide(transformers, interop_hf)


def check_the_family_guide(transformers, interop_hf):
    torch.manual_seed(0)
    hf = transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=None)).eval()
    with pytest.raises(ValueError, match="not in the families table"):
        interop_hf.wrap_hf(hf).as_transformer()
    assert base.get_absorb_method("iclca-approx").unsupported(interop_hf.wrap_hf(hf)) is not None
    run_python(GUIDES / "add-model-family.md")  # step 1: the row
    lm = interop_hf.wrap_hf(hf)
    ids = torch.randint(0, 64, (1, 12))
    with torch.no_grad():
        torch.testing.assert_close(lm.as_transformer()(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
    assert lm.lora_modules(("attn.out",)) == ("hf.model.layers.0.self_attn.o_proj", "hf.model.layers.1.self_attn.o_proj")
    assert base.get_absorb_method("iclca-approx").unsupported(lm) is None
    for args in commands(GUIDES / "add-model-family.md"):
        parses(args)


# ----------------------------------------------------------------------------- the other guides and the README


def test_reproduce_a_table_runs_its_small_command(tmp_path, capsys):
    page = GUIDES / "reproduce-a-table.md"
    small = next(args for args in commands(page) if "--set" in args)
    out = tmp_path / "small"
    assert cli.main([*small[:-1], str(out)]) == 0  # the guide's command, written to tmp_path
    assert "| 1 |" in (out / "table.md").read_text() and (out / "results.json").is_file()
    capsys.readouterr()
    assert "\n  depths " in help_text(capsys, ["run", "iclca-table1", "--help"])
    assert docs.main(["--check"]) == 0


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted(GUIDES.glob("*.md"))], ids=lambda p: p.name)
def test_every_command_parses(page):
    found = commands(page)
    assert found or page.name == "reproduce-a-table.md" or page.name.startswith("add-"), f"{page.name}: no commands"
    for args in found:
        parses(args)
