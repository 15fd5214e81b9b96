"""The package's layering: a module imports only from its own layer or the layers below it.

    ops, tasks, runtime, config, fileio, outputs, stats, registry  <  models  <  tint, train  <  interop  <  absorb  <  harness
        <  experiments  <  cli

Imports are read from the source (relative and absolute `incontext.` imports, also inside functions). The backends
the absorb methods run on (our Transformer, the Hugging Face backend and its families table) are in models/, below
them; interop/ keeps conversions only (weights both ways, the shared pieces of a PEFT LoRA, the shipped models), below
absorb/, whose methods' exports live beside them."""

import ast
import re
from pathlib import Path

import pytest

import incontext

LAYER = {"ops": 0, "tasks": 0, "runtime": 0, "config": 0, "fileio": 0, "outputs": 0, "stats": 0, "registry": 0, "models": 1, "tint": 2, "train": 2, "interop": 3,
         "absorb": 4, "harness": 5, "experiments": 6, "cli": 7}
ROOT = Path(incontext.__file__).parent


def imported_parts(rel: Path, source: str) -> list[tuple[int, str]]:
    """(line, top-level part of incontext) for every import of the package in one file (`rel`: its path
    inside the package)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            package = list(rel.parts[:-1])
            base = package[: len(package) - (node.level - 1)]
            target = base + (node.module.split(".") if node.module else [])
            names = target[:1] or [alias.name for alias in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("incontext."):
            found.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("incontext.")]
    return found


def modules():
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0].removesuffix(".py") in LAYER)


def test_every_top_level_piece_has_a_layer():
    pieces = {p.name.removesuffix(".py") for p in ROOT.iterdir()
              if p.name != "__init__.py" and not p.name.startswith("__") and p.suffix != ".json"}  # data files import nothing
    assert pieces <= set(LAYER), f"give these a layer in tests/test_layers.py: {sorted(pieces - set(LAYER))}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_upward_import(path):
    own = LAYER[path.relative_to(ROOT).parts[0].removesuffix(".py")]
    upward = [f"line {line}: {part}" for line, part in imported_parts(path.relative_to(ROOT), path.read_text()) if LAYER.get(part, -1) > own]
    assert not upward, f"{path.relative_to(ROOT)} imports from a higher layer: {upward}"


def test_the_checker_sees_upward_imports():
    rel = Path("tint/probe.py")
    assert imported_parts(rel, "from ..interop.hf import x\n") == [(1, "interop")]
    assert imported_parts(rel, "def f():\n    from incontext.absorb import y\n") == [(2, "absorb")]
    assert imported_parts(rel, "from . import modules\nfrom .. import models\n") == [(1, "tint"), (2, "models")]


def module_imports(path: Path) -> set[str]:
    """The package's modules that one module imports (dotted names; `from . import x` counts module x; imports
    under TYPE_CHECKING count too)."""
    names = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
             for p in ROOT.rglob("*.py")}
    own = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
    package = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("incontext")):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            target = ".".join(base + (node.module.split(".") if node.module else []))
            found |= {name for name in [target, *(f"{target}.{a.name}" for a in node.names)] if name in names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in names}
    return found - {own}


def test_no_two_modules_import_each_other():
    graph = {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): module_imports(p)
             for p in ROOT.rglob("*.py")}
    circles = sorted(f"{a} <-> {b}" for a, deps in graph.items() for b in deps if a < b and a in graph.get(b, ()))
    assert not circles, f"import circles: {circles}"


def test_no_interop_module_imports_absorb():
    found = [f"{path.relative_to(ROOT)} line {line}" for path in sorted((ROOT / "interop").rglob("*.py"))
             for line, part in imported_parts(path.relative_to(ROOT), path.read_text()) if part == "absorb"]
    assert not found, f"interop/ imports absorb/: {found}"


def method_of(module: str) -> str | None:
    """The method a module belongs to (absorb/methods/NAME.py or a module of the package absorb/methods/NAME/)."""
    parts = module.split(".")
    return parts[3] if len(parts) > 3 and parts[:3] == ["incontext", "absorb", "methods"] else None


def test_no_absorb_method_module_imports_another():
    """Each method supplies only what is its own (its package's modules import each other: method, export); what two
    share lives one level up (protocol, distill, study, lora, presses, prompt_update)."""
    found = []
    for path in sorted((ROOT / "absorb" / "methods").rglob("*.py")):
        own = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        if own == "incontext.absorb.methods":
            continue  # the package that registers them all
        found += [f"{own} imports {other}" for other in sorted(module_imports(path))
                  if method_of(other) not in (None, method_of(own))]
    assert len({method_of(".".join(p.relative_to(ROOT.parent).with_suffix("").parts))
                for p in (ROOT / "absorb" / "methods").rglob("*.py")} - {None}) >= 9
    assert not found, f"absorb method modules import each other: {found}"


def test_one_training_loop_for_the_distillers():
    """kv-prefix and distill-lora train through distill.train alone: neither builds an optimizer, steps one or
    defines a loop of its own (the second copy the pipeline replaced)."""
    import re

    for name in ("kv_prefix", "distill_lora"):
        source = "".join(p.read_text() for p in (ROOT / "absorb" / "methods" / name).glob("*.py"))
        assert not re.search(r"torch\.optim\.|\.backward\(|\.step\(\)|Rollback|tqdm", source), name
    assert "def train(" in (ROOT / "absorb" / "distill.py").read_text()


def test_the_absorb_folder_names_no_method():
    """absorb/folder.py reads every method's adapted model and PEFT form through the registries (protocol.py's ADAPTED
    and PEFT_FORMS): it imports no method package."""
    found = sorted(m for m in module_imports(ROOT / "absorb" / "folder.py") if m.startswith("incontext.absorb.methods"))
    assert not found, f"absorb/folder.py imports {found}"


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def flags_in_errors(source: str) -> list[tuple[int, str]]:
    """(line, flag) for every command-line flag spelled in the message of a `raise` (pip's own flags aside): the
    library names the problem; the command line names its flags."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Raise) and node.exc is not None:
            for part in ast.walk(node.exc):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    text = re.sub(r"pip install(?: --[a-z-]+)*", "", part.value)
                    found += [(node.lineno, flag) for flag in FLAG.findall(text)]
    return found


def test_no_library_error_names_a_command_line_flag():
    offenders = [f"{path.relative_to(ROOT)}:{line}: {flag}" for path in ROOT.rglob("*.py") if "cli" not in path.relative_to(ROOT).parts
                 for line, flag in flags_in_errors(path.read_text())]
    assert not offenders, "library errors naming CLI flags:\n" + "\n".join(offenders)


def test_the_flag_checker_sees_a_flag():
    assert flags_in_errors('raise ValueError(f"give --set x={y}")') == [(1, "--set")]
    assert flags_in_errors('raise ValueError("run `pip install --no-deps pkg`")') == []
