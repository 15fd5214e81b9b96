"""The documentation agrees with the result files: every embedded result table equals its file, every headline
number on the README front page equals the value in its results.json, and every link points at a file."""

import json
import re
from pathlib import Path

import pytest

from incontext import docs

ROOT = docs.repo_root()
README = ROOT / "README.md"
SETUP = ("# incontext\n\n```bash\n"
         "bash scripts/env.sh incontext demo          # main job: absorb documents into SmolLM2 with each method, one table (~5 min, CPU)\n"
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




def tint(name: str) -> float:
    data = result("tint-perplexity")
    return data["perplexity"][name][data["config"]["fractions"].index(0.5)]


def absorb_s(method: str, tokens: int, name: str = "absorb_cost_cuda_h100_tf32") -> float:
    """An absorb_cost benchmark's absorb seconds (default: the README's GPU run)."""
    rows = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())["rows"]
    return next(r["absorb_s"] for r in rows if r["method"] == method and r["prompt_tokens"] == tokens)


DEMO = "demo"  # the main job: 5 test episodes, the document alone, the defaults
FACTS = "compare-smollm2-facts-test"  # 20 test episodes, the document alone
CONT = "compare-smollm2-continuation-test"  # 5 test passages, the document alone
QUESTIONS = "compare-smollm2-facts-test-questions"  # 20 test episodes with training questions (a labelled setting)
CONSENSUS = "keep-prompt (wording consensus)"
VALIDATION = "document-alone-validation"  # the sweep that chose the defaults
PLACEMENT = "placement-test/{}"  # keep-prompt on the 20 test episodes: plain, chat with the facts as the system turn, a user turn
LEARNED = "compare-smollm2-facts-learned-tuned"  # iclca-approx with learned maps (dev split)


def share_of(path: str, method: str, reference: str) -> float:
    """A row's exact match as a percentage of another row's in the same run."""
    return 100 * row(path, method)["score"]["mean"] / row(path, reference)["score"]["mean"]








def ce_share(path: str, method: str) -> float:
    """A row's share of the cross-entropy the prompt gives (drop-prompt's CE minus keep-prompt's), in percent."""
    drop, keep = (row(path, m)["score"]["mean"] for m in ("drop-prompt", "keep-prompt"))
    return 100 * (drop - row(path, method)["score"]["mean"]) / (drop - keep)






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
    ("passages), {} and {} of 35 against\n{} and {} (the model reading it: {})",
     lambda: tuple(chat(c, 35)["right"] for c in ("s26-test-lora-queries-ensemble", "s26-test-prefix-queries-ensemble",
                                                  "s26-test-lora-bare", "s26-test-prefix-bare", "teacher"))),
    # the main job and the systems table
    ("The prompted model answers {} of the {} questions; the two trained methods, which keep a quarter to a third of its\n"
     "bytes, answer {} each", lambda: (answers(DEMO, "keep-prompt"), result(DEMO)["queries"], answers(DEMO, "kv-prefix"))),
    ("{:.1f}% exact match, SmolLM2 + `facts`, the document alone (demo)", lambda: 100 * row(DEMO, "keep-prompt")["score"]["mean"]),
    ("{:.1f}% exact match (demo) |", lambda: 100 * row(DEMO, "drop-prompt")["score"]["mean"]),
    ("{:.1f}% exact match vs keep-prompt's {:.1f}% from the document alone (demo)",
     lambda: tuple(100 * row(DEMO, m)["score"]["mean"] for m in ("distill-lora", "keep-prompt"))),
    ("{:.1f}% exact match vs keep-prompt's {:.1f}% at a quarter of its bytes from the document alone (demo, {:.1f} s to absorb on",
     lambda: (100 * row(DEMO, "kv-prefix")["score"]["mean"], 100 * row(DEMO, "keep-prompt")["score"]["mean"],
              seconds(DEMO, "kv-prefix"))),
    ("{:.1f}% exact match on `facts` (demo); perplexity", lambda: 100 * row(DEMO, "dynamic-eval")["score"]["mean"]),
    ("{:.1f}% exact match on `facts` (demo, FAVOR+); {:.1f}% vs keep-prompt's {:.1f}% with learned maps",
     lambda: (100 * row(DEMO, "iclca-approx")["score"]["mean"], 100 * row(LEARNED, "iclca-approx")["score"]["mean"],
              100 * row(LEARNED, "keep-prompt")["score"]["mean"])),
    ("(demo); {:.0f}% of keep-prompt's answers on 20 test episodes at {:.0f}% of its bytes | [below]",
     lambda: (share(FACTS, "distill-lora"), bytes_share(FACTS, "distill-lora"))),
    ("21.6 s to absorb on 2 CPU cores); {:.0f}% of keep-prompt's answers on 20 test episodes at {:.0f}% of its bytes |",
     lambda: (share(FACTS, "kv-prefix"), bytes_share(FACTS, "kv-prefix"))),
    # the document-alone table's reading
    ("keep {:.0f}% (distill-lora, {} right) and {:.0f}% (kv-prefix, {} right) of keep-prompt's {} right answers of {}",
     lambda: (share(FACTS, "distill-lora"), answers(FACTS, "distill-lora"), share(FACTS, "kv-prefix"),
              answers(FACTS, "kv-prefix"), answers(FACTS, "keep-prompt"), result(FACTS)["queries"])),
    ("at {:.0f}% and {:.0f}% of its bytes", lambda: (bytes_share(FACTS, "distill-lora"), bytes_share(FACTS, "kv-prefix"))),
    ("On `continuation` ({} test passages: {} tokens of a held-out play in the prompt, the cross-entropy of the next {};",
     lambda: (result(CONT)["episodes"], result(CONT)["task_options"]["prompt_tokens"], result(CONT)["task_options"]["query_tokens"])),
    ("kv-prefix keeps {:.0f}% of the {:.3f} nats the passage gives and distill-lora {:.0f}%",
     lambda: (ce_share(CONT, "kv-prefix"), row(CONT, "drop-prompt")["score"]["mean"] - row(CONT, "keep-prompt")["score"]["mean"],
              ce_share(CONT, "distill-lora"))),
    ("dynamic-eval {:.0f}% and iclca-approx {:.0f}%", lambda: (ce_share(CONT, "dynamic-eval"), ce_share(CONT, "iclca-approx"))),
    ("keep-prompt answers {:.1f}% of the questions asked as chat turns with the facts as the system turn, {:.1f}% with "
     "them in a\n\"Remember these facts\" user turn, and {:.1f}% as plain text",
     lambda: tuple(100 * row(PLACEMENT.format(p), "keep-prompt")["score"]["mean"] for p in ("chat-system", "chat-user", "plain"))),
    # with training questions
    ("distill-lora answers {} and kv-prefix {} of the {} questions, against {} for keep-prompt and {} for keep-prompt\nwith "
     "the same wordings' consensus",
     lambda: (answers(QUESTIONS, "distill-lora"), answers(QUESTIONS, "kv-prefix"), result(QUESTIONS)["queries"],
              answers(QUESTIONS, "keep-prompt"), answers(QUESTIONS, CONSENSUS))),
    ("({:.0f}% and {:.0f}% of the consensus reference's)",
     lambda: (share_of(QUESTIONS, "distill-lora", CONSENSUS), share_of(QUESTIONS, "kv-prefix", CONSENSUS))),
    ("489-token document took {:.1f} s at SmolLM2's shapes", lambda: absorb_s("kv-prefix", 489)),
    ("shapes, {:.1f} s with `--set batch_size=16", lambda: absorb_s("kv-prefix:b16tf32", 489)),
    ("perplexity {:.2f} vs", lambda: tint("dynamic eval")),
    ("vs {:.2f} without (Shakespeare", lambda: tint("vanilla")),
    ("perplexity {:.2f} (dynamic eval", lambda: tint("TinT")),
    ("relative logits error {:.1e} (205K", lambda: result("iclca-table1")["rows"][0]["mean_rel_error"]),
    ("specialised accuracy {:.1f}% with the auxiliary",
     lambda: 100 * result("cgt-table1")["summary"]["cgt_aux"]["specialized_char_accuracy"][0]),
    ("loss vs {:.1f}% without (Table 1", lambda: 100 * result("cgt-table1")["summary"]["cgt"]["specialized_char_accuracy"][0]),
    ("0.95 in {:.0f} steps", lambda: mean(result("residual-bursty")["first_crossing"]["0.95/ic"]["v"])),
    ("steps vs {:.0f} (classic)", lambda: mean(result("residual-bursty")["first_crossing"]["0.95/ic"]["none"])),
    ("accuracy {:.3f} at a = 1.25", lambda: result("amicl")["a_sweep"]["dot"][result("amicl")["config"]["a_values"].index(1.25)]),
]

# prose numbers of docs pages (the page, its text with {} for the number, the number from its file)
DOC_NUMBERS = [
    ("docs/absorb-methods.md", "| plain text, `Q:/A:` questions | {:.1f}% | {:.1f}% | {:.0f} |",
     lambda: (100 * row(PLACEMENT.format("plain"), "keep-prompt")["score"]["mean"],
              100 * row(PLACEMENT.format("plain"), "drop-prompt")["score"]["mean"], result(PLACEMENT.format("plain"))["mean_prompt_tokens"])),
    ("docs/absorb-methods.md", "(`placement=system`, the default) | {:.1f}% | {:.1f}% | {:.0f} |",
     lambda: (100 * row(PLACEMENT.format("chat-system"), "keep-prompt")["score"]["mean"],
              100 * row(PLACEMENT.format("chat-system"), "drop-prompt")["score"]["mean"], result(PLACEMENT.format("chat-system"))["mean_prompt_tokens"])),
    ("docs/absorb-methods.md", "(`placement=user`) | {:.1f}% | {:.1f}% | {:.0f} |",
     lambda: (100 * row(PLACEMENT.format("chat-user"), "keep-prompt")["score"]["mean"],
              100 * row(PLACEMENT.format("chat-user"), "drop-prompt")["score"]["mean"], result(PLACEMENT.format("chat-user"))["mean_prompt_tokens"])),
    ("docs/absorb-methods.md", "({} against {} right of {}, within", lambda: (answers(PLACEMENT.format("chat-system"), "keep-prompt"),
                                                                         answers(PLACEMENT.format("chat-user"), "keep-prompt"),
                                                                         result(PLACEMENT.format("chat-user"))["queries"])),
    ("docs/absorb-methods.md", "gave {:.1f}% against the earlier defaults' {:.1f}% (KL {:.2f} vs {:.2f})",
     lambda: (100 * row(VALIDATION, "kv-prefix:p8-bf16-lr5e-2")["score"]["mean"], 100 * row(VALIDATION, "kv-prefix")["score"]["mean"],
              row(VALIDATION, "kv-prefix:p8-bf16-lr5e-2")["agreement"]["kl"], row(VALIDATION, "kv-prefix")["agreement"]["kl"])),
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


@pytest.mark.parametrize("page, template, value", DOC_NUMBERS, ids=[t for _, t, _ in DOC_NUMBERS])
def test_a_docs_prose_number_comes_from_its_result_file(page, template, value):
    numbers = value()
    text = template.format(*numbers) if isinstance(numbers, tuple) else template.format(numbers)
    assert text in (ROOT / page).read_text(), f"{page}: a number differs from its result file"


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
