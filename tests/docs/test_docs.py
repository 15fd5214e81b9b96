"""The documentation agrees with the result files: every embedded result table equals its file, every headline
number on the README front page equals the value in its results.json, and every link points at a file."""

import functools
import json
import re
import sys
from pathlib import Path

import pytest

from incontext import docs

ROOT = docs.repo_root()
README = ROOT / "README.md"
SETUP = ("# incontext\n\n```bash\n"
         "bash scripts/env.sh incontext demo          # main job: absorb prompts into SmolLM2 with each method, one table (~12 min, CPU)\n"
         "bash scripts/env.sh python -m pytest        # tests (what CI runs: .ci/run)\n```\n")


def result(path: str) -> dict:
    return json.loads((ROOT / "results" / path / "results.json").read_text())


def row(path: str, method: str) -> dict:
    return next(r for r in result(path)["rows"] if r["method"] == method)


def answers(path: str, method: str) -> int:
    """A row's count of right answers over all the run's queries."""
    return round(row(path, method)["score"]["mean"] * result(path)["queries"])


def bytes_share(path: str, method: str) -> float:
    """A row's kept bytes as a percentage of keep-prompt's in the same run."""
    return 100 * row(path, method)["kept_bytes"] / row(path, "keep-prompt")["kept_bytes"]


def share(path: str, method: str) -> float:
    """A row's exact match as a percentage of keep-prompt's in the same run."""
    return 100 * row(path, method)["score"]["mean"] / row(path, "keep-prompt")["score"]["mean"]


def seconds(path: str, method: str) -> float:
    """A row's median absorb in seconds."""
    return row(path, method)["absorb_ms"] / 1000


def slower(path: str, than: str) -> float:
    """How many times slower the machine of run `path` was than that of run `than`, by keep-prompt's ms per query."""
    return row(path, "keep-prompt")["query_ms"] / row(than, "keep-prompt")["query_ms"]


def tint(name: str) -> float:
    data = result("tint-perplexity")
    return data["perplexity"][name][data["config"]["fractions"].index(0.5)]


def absorb_s(method: str, tokens: int, name: str = "absorb_cost_cuda_h100_tf32") -> float:
    """An absorb_cost benchmark's absorb seconds (default: the README's GPU run)."""
    rows = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())["rows"]
    return next(r["absorb_s"] for r in rows if r["method"] == method and r["prompt_tokens"] == tokens)


LONG5 = "compare-smollm2-facts-long-1000-spread-lr3e-2-5"  # the same row on the first five test documents
LONG20 = "compare-smollm2-facts-long-1000-spread-lr3e-2-20"  # the same twenty documents without the ensemble
LONG20_PREFIX = "kv-prefix:p100-tuned-spread-lr3e-2"
ARGMAX, ARGMAX_LORA = "compare-smollm2-facts-distill-lora-argmax", "distill-lora:p12-am1"  # the README's distill-lora row
CONT = "compare-smollm2-continuation-long-1000-bytes-5"  # long continuation passages: CE against kept bytes
LR, PREFIX_LR = "compare-smollm2-facts-lr5e-2", "kv-prefix:passes8-autocast-lr5e-2"  # the README's kv-prefix row
ENSEMBLE_VALIDATION = [f"kv-prefix-validation-long-1000-ensemble-{seed}" for seed in (10000, 20000, 30000)]
ENSEMBLE = "kv-prefix:L3E"  # wording_ensemble, long documents
ENSEMBLE20 = "compare-smollm2-facts-long-1000-ensemble-20"  # the long documents' test row: all twenty documents
SHORT_ENSEMBLE = "compare-smollm2-facts-short-ensemble-20"  # the short row with wording_ensemble (method "kv-prefix")
SHORT_VALIDATION = "kv-prefix-validation-short-ensemble-20000"  # the short row with and without it, one run
LORA_ENSEMBLE, LORA_E = "compare-smollm2-facts-distill-lora-ensemble-20", "distill-lora:DE"  # distill-lora's, test
LORA_VALIDATION = "distill-lora-validation-ensemble-20000"  # distill-lora with (DE) and without (D) it, one run


def kept_answers(paths: list[str], method: str) -> tuple[int, int, float]:
    """A row's right answers summed over runs, keep-prompt's, and the first as a percentage of the second."""
    got, keep = (sum(answers(p, m) for p in paths) for m in (method, "keep-prompt"))
    return got, keep, 100 * got / keep


@functools.cache
def wordings() -> dict:
    """benchmarks/wording_consistency.py's facts on the eleven long validation documents, summarised together."""
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from wording_consistency import summarise
    facts = [f for seed in (10000, 20000, 30000)
             for f in json.loads((ROOT / f"benchmarks/results/wording_consistency_long_{seed}.json").read_text())["facts"]]
    return summarise(facts, 4, student=True)


def wordings_kept(*groups: tuple[str, ...]) -> tuple[float, ...]:
    """The student's hits as a percentage of keep-prompt's right facts, per group of training-wording counts."""
    out = wordings()
    return tuple(100 * sum(out["student_right_by_train_hits"][k] for k in g)
                 / sum(out["teacher_right_by_train_hits"][k] for k in g) for g in groups)


def ce_share(path: str, method: str) -> float:
    """A row's share of the cross-entropy the prompt gives (drop-prompt's CE minus keep-prompt's), in percent."""
    drop, keep = (row(path, m)["score"]["mean"] for m in ("drop-prompt", "keep-prompt"))
    return 100 * (drop - row(path, method)["score"]["mean"]) / (drop - keep)


def keep_cells(path: str) -> tuple[float, float]:
    """keep-prompt's row of the README's table: exact match %, kept KiB."""
    keep = row(path, "keep-prompt")
    return 100 * keep["score"]["mean"], keep["kept_bytes"] / 1024


def method_cells(path: str, method: str) -> tuple[float, ...]:
    """A method's row of the README's table: exact match % (share of keep-prompt's), kept KiB (share), absorb s."""
    r = row(path, method)
    return (100 * r["score"]["mean"], share(path, method), r["kept_bytes"] / 1024, bytes_share(path, method),
            seconds(path, method))


def chat(config: str, questions: int = 21) -> dict:
    """The first row of benchmarks/results/distill_lora_facts.json named `config` with that many chat questions (21:
    the three validation passages; 35: the five test passages)."""
    rows = json.loads((ROOT / "benchmarks" / "results" / "distill_lora_facts.json").read_text())
    return next(r for r in rows if r["config"] == config and r["questions"] == questions)


def mean(values) -> float:
    return sum(values) / len(values)


# the README's headline numbers: (the text on the front page with {} for the number, the number from its file)
HEADLINES = [
    ("answer {} and {} of 21 chat questions on validation passages, against {} and {}\nfrom the passage alone and {} for",
     lambda: tuple(chat(c)["right"] for c in ("s26-lora-queries-ensemble", "s26-prefix-queries-ensemble", "s26-lora-bare",
                                              "s26-prefix-bare", "teacher"))),
    ("test passages, {} and {} of 35 against\n{} and {} (the model reading it: {})",
     lambda: tuple(chat(c, 35)["right"] for c in ("s26-test-lora-queries-ensemble", "s26-test-prefix-queries-ensemble",
                                                  "s26-test-lora-bare", "s26-test-prefix-bare", "teacher"))),
    ("{:.1f}% exact match, SmolLM2 + `facts` (demo)", lambda: 100 * row("demo", "keep-prompt")["score"]["mean"]),
    ("{:.1f}% exact match (demo) |", lambda: 100 * row("demo", "drop-prompt")["score"]["mean"]),
    ("{:.1f}% exact match vs keep-prompt's 31.4% (demo)", lambda: 100 * row("demo", "distill-lora")["score"]["mean"]),
    ("exact match vs keep-prompt's {:.1f}% (demo)", lambda: 100 * row("demo", "keep-prompt")["score"]["mean"]),
    ("(20 test episodes each); {:.1f}% vs {:.1f}% in the demo",
     lambda: tuple(100 * row("demo", m)["score"]["mean"] for m in ("kv-prefix", "keep-prompt"))),
    ("{:.1f}% exact match vs keep-prompt's", lambda: 100 * row(SHORT_ENSEMBLE, "kv-prefix")["score"]["mean"]),
    # the README's short- and long-document table and its cells in the table of systems
    ("vs keep-prompt's {:.1f}% (111%) at a quarter", lambda: 100 * row(SHORT_ENSEMBLE, "keep-prompt")["score"]["mean"]),
    ("38.6% ({:.0f}%) at a quarter", lambda: share(SHORT_ENSEMBLE, "kv-prefix")),
    ("({:.0f}% without, {:.1f} s to absorb on 2 CPU cores)",
     lambda: (share(LR, PREFIX_LR), seconds(LR, PREFIX_LR))),
    ("{:.0f}% at 9.7% of the bytes on ~1,035", lambda: share(ENSEMBLE20, ENSEMBLE)),
    ("98% at {:.1f}% of the bytes on ~1,035", lambda: bytes_share(ENSEMBLE20, ENSEMBLE)),
    ("(demo); {:.1f}% vs keep-prompt's", lambda: 100 * row(LORA_ENSEMBLE, LORA_E)["score"]["mean"]),
    ("vs keep-prompt's {:.1f}% (124%) on 20 test", lambda: 100 * row(LORA_ENSEMBLE, "keep-prompt")["score"]["mean"]),
    ("% ({:.0f}%) on 20 test episodes with `argmax_weight=1` and `wording_ensemble=true` ({:.0f}% without)",
     lambda: (share(LORA_ENSEMBLE, LORA_E), share(ARGMAX, ARGMAX_LORA))),
    # the README's table of self-study results, one template per row (a tuple: the row's numbers in order)
    ("| ~160 tokens, 20 episodes | keep-prompt | {:.1f}% | {:,.0f} | prefill only |", lambda: keep_cells(LR)),
    ("| | kv-prefix, p = M/4, 8 passes, bf16, rate 0.05 | {:.1f}% ({:.0f}%) | {:,.0f} ({:.0f}%) | {:.1f} |",
     lambda: method_cells(LR, PREFIX_LR)),
    ("| | the same with `wording_ensemble=true` | {:.1f}% ({:.0f}%) | {:,.0f} ({:.0f}%) | {:.1f} (slower machine) |",
     lambda: method_cells(SHORT_ENSEMBLE, "kv-prefix")),
    ("| | distill-lora, rank 8, 12 passes, `argmax_weight=1` | {:.1f}% ({:.0f}%) | {:,.0f} ({:.0f}%) | {:.1f} |",
     lambda: method_cells(ARGMAX, ARGMAX_LORA)),
    ("| | the same with `wording_ensemble=true` | {:.1f}% ({:.0f}%) | {:,.0f} ({:.0f}%) | {:.1f} (slower machine) |",
     lambda: method_cells(LORA_ENSEMBLE, LORA_E)),
    ("| ~1,035 tokens, 20 documents | keep-prompt | {:.1f}% | {:,.0f} | prefill only |", lambda: keep_cells(ENSEMBLE20)),
    ("| | kv-prefix, p = 100, spread start, bf16, rate 0.03, `wording_ensemble=true` | {:.1f}% ({:.0f}%) | {:,.0f} ({:.1f}%) | {:.0f} (slower machine) |",
     lambda: method_cells(ENSEMBLE20, ENSEMBLE)),
    ("met ({:.0f}%; {:.0f}% with `wording_ensemble=true`); distill-lora",
     lambda: (share(LR, PREFIX_LR), share(SHORT_ENSEMBLE, "kv-prefix"))),
    ("distill-lora, {} ({:.0f}%; {:.0f}% with the option)", lambda: ("met" if share(ARGMAX, ARGMAX_LORA) >= 80 else "not met",
                                                                  share(ARGMAX, ARGMAX_LORA), share(LORA_ENSEMBLE, LORA_E))),
    ("met with `wording_ensemble=true`\n({:.0f}%; the same prefix", lambda: share(ENSEMBLE20, ENSEMBLE)),
    ("without it kept {:.0f}%, ", lambda: share(LONG20, LONG20_PREFIX)),
    ("{:.0f}% over the first five documents", lambda: share(LONG5, LONG20_PREFIX)),
    ("{:.0f}% over the other fifteen", lambda: 100 * (answers(LONG20, LONG20_PREFIX) - answers(LONG5, LONG20_PREFIX))
     / (answers(LONG20, "keep-prompt") - answers(LONG5, "keep-prompt"))),
    ("{} of its {} right facts right in all four", lambda: (wordings()["teacher_right_by_train_hits"]["4"],
                                                                    wordings()["teacher_eval"])),
    ("the prefix kept {:.0f}% of those and {:.0f}% of the ones", lambda: wordings_kept(("4",), ("0", "1"))),
    ("option it kept {} of the {} ({:.0f}%) there", lambda: kept_answers(ENSEMBLE_VALIDATION, ENSEMBLE)),
    ("(kv-prefix {:.1f} s with, {:.1f} s without; distill-lora {:.1f} s with, {:.1f} s without)",
     lambda: (seconds(SHORT_VALIDATION, "kv-prefix:SE"), seconds(SHORT_VALIDATION, "kv-prefix:S"),
              seconds(LORA_VALIDATION, "distill-lora:DE"), seconds(LORA_VALIDATION, "distill-lora:D"))),
    ("machines {:.1f}-{:.1f} times slower than the runs without the option",
     lambda: (lambda r: (min(r), max(r)))([slower(SHORT_ENSEMBLE, LR), slower(LORA_ENSEMBLE, ARGMAX),
                                            slower(ENSEMBLE20, LONG20)])),
    ("p = 100 keeps {:.0f}% of the 0.857 nats", lambda: ce_share(CONT, "kv-prefix:p100")),
    ("keeps 45% of the {:.3f} nats the passage", lambda: row(CONT, "drop-prompt")["score"]["mean"] - row(CONT, "keep-prompt")["score"]["mean"]),
    ("passage ({:.0f}% at rank 2; its adapters", lambda: ce_share(CONT, "distill-lora:r2")),
    ("489-token document takes {:.1f} s at SmolLM2's shapes", lambda: absorb_s("kv-prefix", 489)),
    ("shapes, {:.1f} s with `--set batch_size=16", lambda: absorb_s("kv-prefix:b16tf32", 489)),
    ("perplexity {:.2f} vs", lambda: tint("dynamic eval")),
    ("vs {:.2f} without (Shakespeare", lambda: tint("vanilla")),
    ("perplexity {:.2f} (dynamic eval", lambda: tint("TinT")),
    ("relative logits error {:.1e} (205K", lambda: result("iclca-table1")["rows"][0]["mean_rel_error"]),
    ("{:.1f}% exact match on `facts` vs", lambda: 100 * row("compare-smollm2-facts-learned-tuned", "iclca-approx")["score"]["mean"]),
    ("vs keep-prompt's {:.1f}% (learned", lambda: 100 * row("compare-smollm2-facts-learned-tuned", "keep-prompt")["score"]["mean"]),
    ("specialised accuracy {:.1f}% with the auxiliary",
     lambda: 100 * result("cgt-table1")["summary"]["cgt_aux"]["specialized_char_accuracy"][0]),
    ("loss vs {:.1f}% without (Table 1", lambda: 100 * result("cgt-table1")["summary"]["cgt"]["specialized_char_accuracy"][0]),
    ("0.95 in {:.0f} steps", lambda: mean(result("residual-bursty")["first_crossing"]["0.95/ic"]["v"])),
    ("steps vs {:.0f} (classic)", lambda: mean(result("residual-bursty")["first_crossing"]["0.95/ic"]["none"])),
    ("accuracy {:.3f} at a = 1.25", lambda: result("amicl")["a_sweep"]["dot"][result("amicl")["config"]["a_values"].index(1.25)]),
]


def test_readme_opens_with_the_two_setup_commands_and_stays_short():
    text = README.read_text()
    assert text.startswith(SETUP)
    assert len(text.splitlines()) <= 250


@pytest.mark.parametrize("template, value", HEADLINES, ids=[t for t, _ in HEADLINES])
def test_headline_number_comes_from_its_result_file(template, value):
    numbers = value()
    text = template.format(*numbers) if isinstance(numbers, tuple) else template.format(numbers)
    assert text in README.read_text(), "the README's headline differs from its result file"


def test_every_result_block_equals_its_file():
    """Run `python -m incontext.docs` to rewrite the blocks from the files when this fails."""
    assert docs.blocks(ROOT), "no result blocks found"
    assert docs.stale(ROOT) == []


def test_a_block_that_differs_or_names_a_missing_file_is_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.md").write_text("intro\n\n| a |\n|---|\n| 1 |\n")
    (tmp_path / "README.md").write_text("<!-- result: results/t.md table=1 -->\n| a |\n|---|\n| 2 |\n<!-- /result -->\n")
    (tmp_path / "docs" / "x.md").write_text("<!-- result: results/gone.md -->\nold\n<!-- /result -->\n")
    problems = docs.stale(tmp_path)
    assert len(problems) == 2 and "differs" in problems[0] and "no such result file" in problems[1]
    (tmp_path / "docs" / "x.md").unlink()
    page = tmp_path / "README.md"
    page.write_text(docs.synced(tmp_path, page.read_text()))
    assert docs.stale(tmp_path) == [] and "| 1 |" in page.read_text()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", docs.doc_pages(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_points_at_a_file_and_heading(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"https?:|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"
