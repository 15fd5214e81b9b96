"""The documentation agrees with the result files: every embedded or generated table equals its file (or what
docs.GENERATED makes of the files), the README's prose types no number by hand, every number a page's prose states
(DOC_NUMBERS) equals the value in its result file, and every link points at a file."""

import json
import re
from pathlib import Path

import pytest

import docsync as docs

ROOT = docs.repo_root()
README = ROOT / "README.md"
FACTS_PAGE = ROOT / "docs" / "results" / "facts-demo.md"  # the invented-facts demo and its runs, moved off the README
SETUP = ("# incontext\n\n```bash\n"
         "bash scripts/env.sh incontext demo          # main job: absorb SQuAD paragraphs into SmolLM2 with each method, one table (~10 min, CPU)\n"
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


def paired(path: str, method: str, reference: str = "keep-prompt") -> str:
    """'53% [43, 71]': a row's right answers as a share of the reference's in the same run, with the paired bootstrap
    95% interval over its episodes (stats.paired_share_interval95, from the file's per-episode scores)."""
    from incontext.stats import paired_share_interval95

    cell = paired_share_interval95([e["score"] for e in row(path, method)["episode_scores"]],
                                   [e["score"] for e in row(path, reference)["episode_scores"]])
    return f"{100 * cell['share']:.0f}% [{100 * cell['low']:.0f}, {100 * cell['high']:.0f}]"


def second_split(task: str) -> dict:
    """kv-prefix's split by derived-query coverage in the second test run (results/second-test-run/summary.json)."""
    rows = json.loads((ROOT / "results/second-test-run/summary.json").read_text())
    return next(r for r in rows if r["run"] == task and r["method"] == "kv-prefix")["by_derived"]


def seconds(path: str, method: str) -> float:
    """A row's median absorb in seconds."""
    return row(path, method)["absorb_ms"] / 1000




def tint(name: str) -> float:
    data = result("tint-perplexity")
    return data["perplexity"][name][data["config"]["fractions"].index(0.5)]


def tint_shares(row: str = "TinT") -> tuple:
    """A row's share of dynamic evaluation's gain, % (results/tint-perplexity gain_share): pooled with its interval,
    then per fraction."""
    share = result("tint-perplexity")["gain_share"][row]
    pooled = share["pooled"]
    return (100 * pooled["share"], 100 * pooled["low"], 100 * pooled["high"], *(100 * f["share"] for f in share["per_fraction"]))


def paper_tint_shares() -> tuple:
    """The paper's Table 2 for GPT-2 (as results/tint-perplexity stores it) read the same way: TinT's share of dynamic
    evaluation's log-perplexity gain per fraction, %."""
    import math

    paper = result("tint-perplexity")["paper_gpt2_wikitext103"]
    return tuple(100 * math.log(v / t) / math.log(v / d) for v, d, t in zip(paper["vanilla"], paper["dynamic eval"], paper["TinT"]))


def cgt_text_turn() -> tuple:
    """results/cgt-text: the first offset after the join at which y is nearer its direction at the sequence's end than
    its direction before the join (regularised, unregularised), then the regularised cosines at the last offset."""
    models = result("cgt-text")["models"]

    def turn(t: dict) -> int:
        return next(o for o, before, end in zip(t["offsets"], t["cos_with_before_join"], t["cos_with_end"]) if o >= 0 and end > before)

    last = models["regularised"]["transition"]
    return (turn(last), turn(models["unregularised"]["transition"]), last["offsets"][-1], last["cos_with_before_join"][-1],
            last["cos_with_end"][-1])


def absorb_s(method: str, tokens: int, name: str = "absorb_cost_cuda_h100_tf32") -> float:
    """An absorb_cost benchmark's absorb seconds (default: the README's GPU run)."""
    rows = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())["rows"]
    return next(r["absorb_s"] for r in rows if r["method"] == method and r["prompt_tokens"] == tokens)


DEMO = "demo-facts"  # the invented-facts demo (the main job before SQuAD): 5 test episodes, the document alone, the defaults
FACTS = "compare-smollm2-facts-test"  # 20 test episodes, the document alone
CONT = "compare-smollm2-continuation-test"  # 5 test passages, the document alone
TEST, TEST_DOCS, TEST_CONT = (f"self-study-test/{t}" for t in ("facts", "documents", "continuation"))  # issue 62's one run


def COVERAGE() -> dict:  # what the derived queries ask on the sweep's validation episodes
    return json.loads((ROOT / "results/self-study-validation/coverage.json").read_text())
SECOND = "second-test-run/"  # issue 68's second test run: the same commands, per-episode scores
QUESTIONS = "compare-smollm2-facts-test-questions"  # 20 test episodes with training questions (a labelled setting)
CONSENSUS = "keep-prompt (wording consensus)"
VALIDATION = "document-alone-validation"  # the sweep that chose the defaults
PLACEMENT = "placement-test/{}"  # keep-prompt on the 20 test episodes: plain, chat with the facts as the system turn, a user turn
LEARNED = "compare-smollm2-facts-learned-tuned"  # iclca-approx with learned maps (dev split)


def curve(task: str, method: str, budget: float, group: str = "presses", split: str = "test") -> dict:
    """A point of the compression curve (results/press-curve/curve-SPLIT.json, summary.py)."""
    points = json.loads((ROOT / f"results/press-curve/curve-{split}.json").read_text())
    return next(p for p in points if p["task"] == task and p["method"] == method and p["budget"] == budget
                and p["group"] == group)


def curve_share(task: str, method: str, budget: float, group: str = "presses") -> float:
    return 100 * curve(task, method, budget, group)["share_of_keep_prompt"]


def curve_cell(task: str, method: str, budget: float, group: str = "presses") -> str:
    """'104% [100, 114]': a curve point's share of keep-prompt's answers with its paired bootstrap interval."""
    point = curve(task, method, budget, group)
    low, high = point["share_interval"]
    return f"{100 * point['share_of_keep_prompt']:.0f}% [{100 * low:.0f}, {100 * high:.0f}]"


def share_of(path: str, method: str, reference: str) -> float:
    """A row's exact match as a percentage of another row's in the same run."""
    return 100 * row(path, method)["score"]["mean"] / row(path, reference)["score"]["mean"]








def ce_share(path: str, method: str) -> float:
    """A row's share of the cross-entropy the prompt gives (drop-prompt's CE minus keep-prompt's), in percent."""
    drop, keep = (row(path, m)["score"]["mean"] for m in ("drop-prompt", "keep-prompt"))
    return 100 * (drop - row(path, method)["score"]["mean"]) / (drop - keep)






def bench(name: str) -> dict:
    """A benchmark's record, benchmarks/results/NAME.json."""
    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())


def wording(key: str, *index: str) -> int:
    """A wording_consistency summary's count over the three long validation files (11 documents), `index` into dicts."""
    total = 0
    for seed in (10000, 20000, 30000):
        value = bench(f"wording_consistency_long_{seed}")["summary"][key]
        total += sum(value[i] for i in index) if index else value
    return total


def total_answers(paths, method: str) -> int:
    return sum(answers(path, method) for path in paths)


def ms_ratio(slow: str, fast: str) -> float:
    """How much slower one run's machine was: keep-prompt's ms per query in one run over another's."""
    return row(slow, "keep-prompt")["query_ms"] / row(fast, "keep-prompt")["query_ms"]


def pct(path: str, method: str) -> float:
    return 100 * row(path, method)["score"]["mean"]


def chat(config: str, questions: int = 21) -> dict:
    """The first row of benchmarks/results/distill_lora_facts.json named `config` with that many chat questions (21:
    the three validation passages; 35: the five test passages)."""
    rows = json.loads((ROOT / "benchmarks" / "results" / "distill_lora_facts.json").read_text())
    return next(r for r in rows if r["config"] == config and r["questions"] == questions)


def mean(values) -> float:
    return sum(values) / len(values)


# the README's headline numbers: (the text on the front page with {} for the number, the number from its file)
SQUAD_DEMO = "demo"  # the main job: SQuAD paragraphs of the test articles, SmolLM2, the document alone, the defaults


def metric_pct(path: str, method: str, key: str = "score") -> float:
    return 100 * row(path, method)[key]["mean"]


def count(path: str, method: str, key: str) -> int:
    """A row's questions whose answer has `key` (contains, em), over all the run's queries."""
    return round(row(path, method)[key]["mean"] * result(path)["queries"])


def field_share(model: str, budget: float, task: str = "squad", method: str = "kv-press:kvzip") -> int:
    """A test-split point of the field's benchmarks (results/field-benchmarks/field-test.json): its share of
    keep-prompt's score, in percent."""
    points = json.loads((ROOT / "results/field-benchmarks/field-test.json").read_text())
    point = next(p for p in points if p["model"] == model and p["task"] == task and p["method"] == method
                 and p["budget"] == budget)
    return round(100 * point["share_of_keep_prompt"])


# the facts demo's page (docs/results/facts-demo.md): its prose numbers, each from its result file
FACTS_NUMBERS = [
    ("answer {} and {} of 21 chat questions on validation passages, against {} and {}\nfrom the passage alone and {} for",
     lambda: tuple(chat(c)["right"] for c in ("s26-lora-queries-ensemble", "s26-prefix-queries-ensemble", "s26-lora-bare",
                                              "s26-prefix-bare", "teacher"))),
    ("passages), {} and {} of 35 against\n{} and {} (the model reading it: {})",
     lambda: tuple(chat(c, 35)["right"] for c in ("s26-test-lora-queries-ensemble", "s26-test-prefix-queries-ensemble",
                                                  "s26-test-lora-bare", "s26-test-prefix-bare", "teacher"))),
    ("The prompted model answers {} of the {} questions; KVzip (`kv-press`: a quarter of the document's K/V kept, no\n"
     "training) answers {} ({} of keep-prompt's answers, paired bootstrap interval over the episodes), kv-prefix (a\n"
     "quarter of its bytes, trained on queries it derives from the document) {} ({}), distill-lora (a third of the\n"
     "bytes) {} ({});",
     lambda: (answers(DEMO, "keep-prompt"), result(DEMO)["queries"], answers(DEMO, "kv-press"), paired(DEMO, "kv-press"),
              answers(DEMO, "kv-prefix"), paired(DEMO, "kv-prefix"), answers(DEMO, "distill-lora"),
              paired(DEMO, "distill-lora"))),
    ("The first seed-0 demo, before kv-press joined and the pins moved (transformers 5.24 to\n5.23), had kv-prefix at {}",
     lambda: answers("demo-derived-queries", "kv-prefix")),
    ("{:.1f}% exact match, SmolLM2 + `facts`, the document alone (facts demo)", lambda: 100 * row(DEMO, "keep-prompt")["score"]["mean"]),
    ("{:.1f}% exact match (facts demo) |", lambda: 100 * row(DEMO, "drop-prompt")["score"]["mean"]),
    ("{:.1f}% exact match vs keep-prompt's {:.1f}% from the document alone (facts demo)",
     lambda: tuple(100 * row(DEMO, m)["score"]["mean"] for m in ("distill-lora", "keep-prompt"))),
    ("{:.1f}% exact match vs keep-prompt's {:.1f}% at a quarter of its bytes from the document alone (facts demo, {:.1f} s to absorb on "
     "2 CPU cores shared with other work, {:.1f} s alone",
     lambda: (100 * row(DEMO, "kv-prefix")["score"]["mean"], 100 * row(DEMO, "keep-prompt")["score"]["mean"],
              seconds(DEMO, "kv-prefix"), seconds("demo-after-move", "kv-prefix"))),
    ("KVzip at a quarter of the document's K/V: {} of keep-prompt's answers on {} `facts` test episodes, {} on "
     "`documents`; at a tenth {} and {}, in {:.1f} s; the five other presses at most {} at a quarter (StreamingLLM, `documents`) |",
     lambda: (curve_cell("facts", "kv-press:kvzip", 0.25), curve("facts", "kv-press:kvzip", 0.25)["episodes"],
              curve_cell("documents", "kv-press:kvzip", 0.25), curve_cell("facts", "kv-press:kvzip", 0.1),
              curve_cell("documents", "kv-press:kvzip", 0.1),
              max(curve(t, "kv-press:kvzip", b)["absorb_ms"] for t in ("facts", "documents") for b in (0.25, 0.1)) / 1000,
              curve_cell(*max(((t, f"kv-press:{m}") for t in ("facts", "documents")
                               for m in ("snapkv", "expectedattention", "knorm", "tova", "streamingllm")),
                              key=lambda tm: curve_share(tm[0], tm[1], 0.25)), 0.25))),
    ("KVzip keeps {} and {} of keep-prompt's answers on `facts` and `documents` ({} episodes each, paired\n"
     "bootstrap intervals), kv-prefix started from KVzip's kept K/V and trained {} and {}; at a tenth KVzip {} and\n"
     "{}, kv-prefix {} and {}",
     lambda: (curve_cell("facts", "kv-press:kvzip", 0.25, "trained"), curve_cell("documents", "kv-press:kvzip", 0.25, "trained"),
              curve("facts", "kv-press:kvzip", 0.25, "trained")["episodes"],
              curve_cell("facts", "kv-prefix:press", 0.25, "trained"), curve_cell("documents", "kv-prefix:press", 0.25, "trained"),
              curve_cell("facts", "kv-press:kvzip", 0.1, "trained"), curve_cell("documents", "kv-press:kvzip", 0.1, "trained"),
              curve_cell("facts", "kv-prefix:press", 0.1, "trained"), curve_cell("documents", "kv-prefix:press", 0.1, "trained"))),
    ("{:.1f}% exact match on `facts` (facts demo); perplexity", lambda: 100 * row(DEMO, "dynamic-eval")["score"]["mean"]),
    ("{:.1f}% exact match on `facts` (facts demo, FAVOR+); {:.1f}% vs keep-prompt's {:.1f}% with learned maps",
     lambda: (100 * row(DEMO, "iclca-approx")["score"]["mean"], 100 * row(LEARNED, "iclca-approx")["score"]["mean"],
              100 * row(LEARNED, "keep-prompt")["score"]["mean"])),
    # the document-alone table's reading (issue 62's one test run)
    # the document-alone test run (issue 62) and its second run (issue 68: per-episode scores, paired intervals)
    ("(facts demo); {:.0f}% of keep-prompt's answers on {} test episodes at {:.0f}% of its bytes (second run {}) | [facts demo]",
     lambda: (share(TEST, "distill-lora"), result(TEST)["episodes"], bytes_share(TEST, "distill-lora"),
              paired(SECOND + "facts", "distill-lora"))),
    ("s alone); {:.0f}% of keep-prompt's answers on {} test episodes at {:.0f}% of its bytes ({:.0f}% on "
     "`documents`; second run {} and {}) |",
     lambda: (share(TEST, "kv-prefix"), result(TEST)["episodes"], bytes_share(TEST, "kv-prefix"), share(TEST_DOCS, "kv-prefix"),
              paired(SECOND + "facts", "kv-prefix"),
              paired(SECOND + "documents", "kv-prefix"))),
    ("kv-prefix keeps {:.0f}% of keep-prompt's right answers ({} of its {}) at {:.0f}% of its bytes, distill-lora {:.0f}%; on `documents`\n"
     "({} test episodes) {:.0f}% and {:.0f}% ({} and {} of keep-prompt's {}).",
     lambda: (share(TEST, "kv-prefix"), answers(TEST, "kv-prefix"), answers(TEST, "keep-prompt"), bytes_share(TEST, "kv-prefix"),
              share(TEST, "distill-lora"), result(TEST_DOCS)["episodes"], share(TEST_DOCS, "kv-prefix"), share(TEST_DOCS, "distill-lora"),
              answers(TEST_DOCS, "kv-prefix"), answers(TEST_DOCS, "distill-lora"), answers(TEST_DOCS, "keep-prompt"))),
    ("(`results/second-test-run`): `facts` {} and {}, `documents` {}\nand {} (paired bootstrap intervals)",
     lambda: (paired(SECOND + "facts", "kv-prefix"), paired(SECOND + "facts", "distill-lora"),
              paired(SECOND + "documents", "kv-prefix"), paired(SECOND + "documents", "distill-lora"))),
    ("kv-prefix answers {} of the {} `facts` questions its derived queries covered\n(the question or its cloze) against {} of the {} others",
     lambda: tuple(row(SECOND + "facts", "kv-prefix")["by_derived"][k][v] for k in ("covered", "not_covered")
                   for v in ("right", "asked"))),
    ("it reaches {:.0f}% of its\nreference (second run {})", lambda: (share_of(QUESTIONS, "kv-prefix", CONSENSUS),
                                                                   paired(SECOND + "facts-questions", "kv-prefix", CONSENSUS))),
    ("on `continuation` it keeps {:.0f}% of the {:.3f} nats the passage gives, distill-lora\n{:.0f}%",
     lambda: (ce_share(TEST_CONT, "kv-prefix"),
              row(TEST_CONT, "drop-prompt")["score"]["mean"] - row(TEST_CONT, "keep-prompt")["score"]["mean"],
              ce_share(TEST_CONT, "distill-lora"))),
    ("({:.0f}% and {:.0f}% of the consensus reference's; second run {} and {})",
     lambda: (share_of(QUESTIONS, "distill-lora", CONSENSUS), share_of(QUESTIONS, "kv-prefix", CONSENSUS),
              paired(SECOND + "facts-questions", "distill-lora", CONSENSUS), paired(SECOND + "facts-questions", "kv-prefix", CONSENSUS))),
    # with training questions
    ("distill-lora answers {} and kv-prefix {} of the {} questions, against {} for keep-prompt and {} for keep-prompt\nwith "
     "the same wordings' consensus",
     lambda: (answers(QUESTIONS, "distill-lora"), answers(QUESTIONS, "kv-prefix"), result(QUESTIONS)["queries"],
              answers(QUESTIONS, "keep-prompt"), answers(QUESTIONS, CONSENSUS))),
    ("without them, {} and {} (the demo)", lambda: (answers(DEMO, "distill-lora"), answers(DEMO, "kv-prefix"))),
]

SHORT = "compare-smollm2-facts-lr5e-2"  # the dev-split rows: short documents, kv-prefix at today's defaults
SHORT_E = "compare-smollm2-facts-short-ensemble-20"
SHORT_VAL = "kv-prefix-validation-short-ensemble-20000"
LONG = "compare-smollm2-facts-long-1000-spread-lr3e-2-20"
LONG_E = "compare-smollm2-facts-long-1000-ensemble-20"
LONG_VAL = [f"kv-prefix-validation-long-1000-ensemble-{seed}" for seed in (10000, 20000, 30000)]
L3, L3E = "kv-prefix:p100-tuned-spread-lr3e-2", "kv-prefix:L3E"
CONT_LONG = "compare-smollm2-continuation-long-1000-bytes-5"
COMPOSED = {"kv-prefix": ("compare-smollm2-facts-composition-trained", "kv-prefix:co192 (composed)"),
            "distill-lora": ("compare-smollm2-facts-composition-trained-lora", "distill-lora:co48 (composed)")}
LORA = "compare-smollm2-facts-distill-lora-argmax"
LORA_E = "compare-smollm2-facts-distill-lora-ensemble-20"
LORA_VAL, LORA_EVAL = "distill-lora-validation-argmax-20000", "distill-lora-validation-ensemble-20000"
ABLATIONS = "kv-prefix-ablations"
SCHEDULE = "kv-prefix-validation-schedule"
PAGE = "docs/absorb-methods.md"


def same(*values):
    """The one value all of `values` share, or a marker that no page holds (a page's "the same N" then fails)."""
    return values[0] if len(set(values)) == 1 else "<they differ>"


def result_file(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def trajectory() -> tuple:
    """prefix_trajectory_validation.json at its last step: (step, how much lower the best averaged iterate's KL is
    than the raw prefix's), or a marker where an averaged iterate answers more (the page says no more answers)."""
    by_step = result_file("results/prefix_trajectory_validation.json")["by_step"]
    last = max(by_step, key=int)
    raw, averaged = by_step[last]["raw"], [v for k, v in by_step[last].items() if k != "raw"]
    if max(v[1] for v in averaged) > raw[1]:
        return last, "<more answers>"
    return int(last), raw[0] - min(v[0] for v in averaged)


def half_ci(path: str, method: str) -> float:
    score = row(path, method)["score"]
    return 100 * (score["high"] - score["low"]) / 2


def chunked() -> tuple:
    rows = bench("chunked_teacher_facts_long")["rows"]
    chunks = [r["hits"] for name, r in rows.items() if name.startswith("chunks")]
    whole = rows["whole document"]
    return bench("chunked_teacher_facts_long")["prompt_tokens"], min(chunks), max(chunks), whole["queries"], whole["hits"]


def sweep(variant: str) -> dict:
    """Issue 62's validation sweep, one row of results/self-study-validation/summary.json."""
    return next(r for r in result_file("results/self-study-validation/summary.json") if r["variant"] == variant)


def late(variant: str) -> int:
    """A sweep row's right answers on run2.sh's episodes (validation seeds 10004-10007, both tasks)."""
    return sweep(variant)["blocks"]["facts 4-7"] + sweep(variant)["blocks"]["documents 4-7"]


def chat_test(config: str) -> dict:
    """Issue 62's chat check: distill_lora_facts.json's row `config` on the test split (--seed 1, 35 questions)."""
    rows = json.loads((ROOT / "benchmarks" / "results" / "distill_lora_facts.json").read_text())
    return next(r for r in rows if r["config"] == config and r.get("split") == "test" and r.get("seed") == 1)


def data_share(method: str) -> float:
    """The data stage's share of the absorb's wall time, in percent, over a self-study absorb_cost run's repeats."""
    row = next(r for r in bench("absorb_cost_self_study_cpu")["rows"] if r["method"] == method)
    return 100 * sum(r["teacher_wall_s"] for r in row["runs"]) / sum(r["wall_s"] for r in row["runs"])


def absorb_tokens(name: str) -> tuple:
    """A CPU absorb_cost run's kv-prefix:quality rows: (seconds, tokens) for each prompt length, in order."""
    return tuple(x for r in bench(name)["rows"] if r["method"] == "kv-prefix:quality" for x in (r["absorb_s"], r["prompt_tokens"]))


# prose numbers of docs pages (the page, its text with {} for the number, the number from its file); whitespace and
# line breaks are compared as one space, so a reflowed paragraph still matches
DOC_NUMBERS = [
    (PAGE, "the model reading the passage answers {}, kv-prefix {} and distill-lora {}. {} of kv-prefix's misses give another "
           "person's fact of the passage (distill-lora {}, the model reading it {})",
     lambda: (*(chat_test(c)["right"] for c in ("teacher", "s29-test-kv-prefix", "s29-test-distill-lora")),
              *(chat_test(c)["wrong_person"] for c in ("s29-test-kv-prefix", "s29-test-distill-lora", "teacher")))),
    (PAGE, "kv-prefix {:.1f} s, against {:.1f} s with the old data stage and {:.1f} s for distill-lora; the goal, 30 s, is not met. "
           "The data stage takes {:.0f}% of kv-prefix's wall time ({:.0f}% before)",
     lambda: (*(absorb_s(m, 165, "absorb_cost_self_study_cpu") for m in ("kv-prefix", "kv-prefix:windows", "distill-lora")),
              data_share("kv-prefix"), data_share("kv-prefix:windows"))),
    (PAGE, "At its new default kv-prefix keeps {:.0f}% of keep-prompt's right answers on `facts` ({} of its {}) and {:.0f}% on "
           "`documents` ({} of its {}) at a quarter of its bytes, where the data stage it had keeps {:.0f}% and {:.0f}%; "
           "distill-lora, whose data stage did not change, {:.0f}% and {:.0f}%.",
     lambda: (share(TEST, "kv-prefix"), answers(TEST, "kv-prefix"), answers(TEST, "keep-prompt"), share(TEST_DOCS, "kv-prefix"),
              answers(TEST_DOCS, "kv-prefix"), answers(TEST_DOCS, "keep-prompt"), share(TEST, "kv-prefix:windows"),
              share(TEST_DOCS, "kv-prefix:windows"), share(TEST, "distill-lora"), share(TEST_DOCS, "distill-lora"))),
    (PAGE, "On `continuation` kv-prefix keeps {:.0f}% of the {:.3f} nats the passage gives ({:.0f}% with the old stage) and "
           "distill-lora {:.0f}%",
     lambda: (ce_share(TEST_CONT, "kv-prefix"), row(TEST_CONT, "drop-prompt")["score"]["mean"] - row(TEST_CONT, "keep-prompt")["score"]["mean"],
              ce_share(TEST_CONT, "kv-prefix:windows"), ce_share(TEST_CONT, "distill-lora"))),
    (PAGE, "({} of {} derived queries on `facts` and {} of {} on `documents` are sentence prefixes, {} and {} are rule-made "
           "questions), and only {} of the {} `facts` questions and none of the {} `documents` questions are among them "
           "word for word ({} to {} of the {} over {} draws of the derived queries; the sentence-prefix rule gives the cloze "
           "form of {} of the {} asked `facts` facts, {} to {} over the draws, and of {} of the {} `documents` facts)",
     lambda: (COVERAGE()["facts"]["derived_kinds"]["prefix"], sum(COVERAGE()["facts"]["derived_kinds"].values()),
              COVERAGE()["documents"]["derived_kinds"]["prefix"], sum(COVERAGE()["documents"]["derived_kinds"].values()),
              COVERAGE()["facts"]["derived_kinds"]["question"], COVERAGE()["documents"]["derived_kinds"]["question"],
              COVERAGE()["facts"]["asked_verbatim_among_derived"], COVERAGE()["facts"]["asked"],
              COVERAGE()["documents"]["asked"] if COVERAGE()["documents"]["asked_verbatim_among_derived"] == 0 else "<some>",
              COVERAGE()["facts"]["asked_verbatim_over_draws"]["min"], COVERAGE()["facts"]["asked_verbatim_over_draws"]["max"],
              COVERAGE()["facts"]["asked"], COVERAGE()["facts"]["draws"], COVERAGE()["facts"]["cloze_among_derived"],
              COVERAGE()["facts"]["asked"], COVERAGE()["facts"]["cloze_over_draws"]["min"],
              COVERAGE()["facts"]["cloze_over_draws"]["max"], COVERAGE()["documents"]["cloze_among_derived"],
              COVERAGE()["documents"]["asked"])),
    (PAGE, "(the labelled setting above) kv-prefix reaches {:.0f}% of its reference", lambda: share_of(QUESTIONS, "kv-prefix", CONSENSUS)),
    (PAGE, "It gives {} of keep-prompt's {} right answers on the 16 episodes, against {} for the old data stage",
     lambda: (sweep("kv-prefix:derived")["right"], sweep("kv-prefix:derived")["keep_prompt_right"], sweep("kv-prefix")["right"])),
    (PAGE, "answers fewer ({}); the tail bucket lowers the KL but answers fewer on top of `derived` ({} against `derived`'s {} on "
           "the same 8 episodes)",
     lambda: (sweep("kv-prefix:derived-grounded")["right"], late("kv-prefix:derived-tail"), late("kv-prefix:derived"))),
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
    # the document alone (test split): the setting's sizes
    (PAGE, "(~{:.0f} tokens, {:.0f} questions each)",
     lambda: (round(result(FACTS)["mean_prompt_tokens"], -1), result(FACTS)["queries"] / result(FACTS)["episodes"])),
    (PAGE, "(validation split, {} episodes, {} questions;", lambda: (result(VALIDATION)["episodes"], result(VALIDATION)["queries"])),
    (PAGE, "(both {:.0f}% exact match at every setting)",
     lambda: max(pct(VALIDATION, r["method"]) for r in result(VALIDATION)["rows"] if r["method"].startswith(("dynamic-eval", "iclca")))),
    (PAGE, "**`facts`, {} test episodes**", lambda: result(FACTS)["episodes"]),
    (PAGE, "**`continuation`, {} test passages** ({} tokens of a held-out play in the prompt, the cross-entropy of the next {};",
     lambda: (result(CONT)["episodes"], result(CONT)["task_options"]["prompt_tokens"], result(CONT)["task_options"]["query_tokens"])),
    (PAGE, "(the same {} test episodes; `results/placement-test",
     lambda: same(*(result(PLACEMENT.format(p))["episodes"] for p in ("plain", "chat-system", "chat-user")))),
    (PAGE, "| the facts, for keep-prompt ({} test episodes, {} questions) |",
     lambda: (result(PLACEMENT.format("plain"))["episodes"], result(PLACEMENT.format("plain"))["queries"])),
    (PAGE, "the same help. {} test episodes (the demo's)", lambda: same(result(QUESTIONS)["episodes"], result(DEMO)["episodes"])),
    # the older dev-split results
    (PAGE, "`incontext demo` ran the dev split's first {} episodes", lambda: result("demo-dev-questions")["episodes"]),
    (PAGE, "{} answers against keep-prompt's {} ({:.0f}%)",
     lambda: (answers(SHORT, "kv-prefix:passes8-autocast-lr5e-2"), answers(SHORT, "keep-prompt"), share(SHORT, "kv-prefix:passes8-autocast-lr5e-2"))),
    (PAGE, "{} of keep-prompt's {} answers with it, {} without, at the same absorb time ({:.1f} s and {:.1f} s)",
     lambda: (answers(SHORT_VAL, "kv-prefix:SE"), answers(SHORT_VAL, "keep-prompt"), answers(SHORT_VAL, "kv-prefix:S"),
              seconds(SHORT_VAL, "kv-prefix:SE"), seconds(SHORT_VAL, "kv-prefix:S"))),
    (PAGE, "`results/compare-smollm2-facts-short-ensemble-20`, a machine about {:.1f} times slower by keep-prompt's ms",
     lambda: ms_ratio(SHORT_E, SHORT)),
    (PAGE, "{} of keep-prompt's {} answers ({:.0f}%) at KL {:.2f} ({:.2f} without)",
     lambda: (answers(SHORT_E, "kv-prefix"), answers(SHORT_E, "keep-prompt"), share(SHORT_E, "kv-prefix"),
              row(SHORT_E, "kv-prefix")["agreement"]["kl"], row(SHORT, "kv-prefix:passes8-autocast-lr5e-2")["agreement"]["kl"])),
    (PAGE, "`facts` with {} people (~{:,.0f} tokens)", lambda: (result(LONG)["task_options"]["people"], result(LONG)["mean_prompt_tokens"])),
    (PAGE, "`results/compare-smollm2-facts-long-1000-spread-lr3e-2-5`, {:.0f}% of keep-prompt's answers",
     lambda: share("compare-smollm2-facts-long-1000-spread-lr3e-2-5", L3)),
    (PAGE, "{} of keep-prompt's {} answers ({:.0f}%). Why", lambda: (answers(LONG, L3), answers(LONG, "keep-prompt"), share(LONG, L3))),
    (PAGE, "options on {} validation documents", lambda: sum(bench(f"wording_consistency_long_{s}")["episodes"] for s in (10000, 20000, 30000))),
    (PAGE, "answers only {} of its {} right facts right in all {} training wordings; the student keeps {} of those and {} of the {} "
           "right in at most one",
     lambda: (wording("teacher_right_by_train_hits", "4"), wording("teacher_eval"),
              len(bench("wording_consistency_long_10000")["summary"]["teacher_by_wording"]), wording("student_right_by_train_hits", "4"),
              wording("student_right_by_train_hits", "0", "1"), wording("teacher_right_by_train_hits", "0", "1"))),
    (PAGE, "(L3E) kept {} of keep-prompt's {} answers on those documents",
     lambda: (total_answers(LONG_VAL, L3E), same(total_answers(LONG_VAL, "keep-prompt"), wording("teacher_eval")))),
    (PAGE, "against L3's {} (the student above)", lambda: wording("student_eval")),
    (PAGE, "`results/compare-smollm2-facts-long-1000-ensemble-20`, a machine about {:.1f} times slower", lambda: ms_ratio(LONG_E, LONG)),
    (PAGE, "**{} of keep-prompt's {} answers ({:.0f}%) at {:.1f}% of its bytes**",
     lambda: (answers(LONG_E, L3E), answers(LONG_E, "keep-prompt"), share(LONG_E, L3E), bytes_share(LONG_E, L3E))),
    (PAGE, "{:,} tokens of a held-out Shakespeare play, the next {} scored",
     lambda: (result(CONT_LONG)["task_options"]["prompt_tokens"], result(CONT_LONG)["task_options"]["query_tokens"])),
    (PAGE, "Of the {:.3f} nats the passage gives, p = 100 keeps {:.0f}%",
     lambda: (row(CONT_LONG, "drop-prompt")["score"]["mean"] - row(CONT_LONG, "keep-prompt")["score"]["mean"],
              ce_share(CONT_LONG, "kv-prefix:p100"))),
    (PAGE, "Dev split ({} episodes, {} questions per document)",
     lambda: (result(COMPOSED["kv-prefix"][0])["episodes"],
              result(COMPOSED["kv-prefix"][0])["queries"] // result(COMPOSED["kv-prefix"][0])["task_options"]["documents"])),
    (PAGE, "Each document composed keeps {:.0f}% and {:.0f}% (kv-prefix), {:.0f}% and {:.0f}% (distill-lora)",
     lambda: tuple(100 * r for m in ("kv-prefix", "distill-lora") for r in row(*COMPOSED[m])["composition"]["ratio"])),
    (PAGE, "one answer is {:.1f} points",
     lambda: 100 * result(COMPOSED["kv-prefix"][0])["task_options"]["documents"] / result(COMPOSED["kv-prefix"][0])["queries"]),
    (PAGE, "`benchmarks/results/absorb_cost_cast_once_cpu.md`): {:.1f} s at {} tokens, {:.1f} s at {}; at {:,} tokens {:.0f} s",
     lambda: absorb_tokens("absorb_cost_cast_once_cpu") + absorb_tokens("absorb_cost_quality_2000_cpu")[::-1]),
    (PAGE, "at 489 tokens the defaults of the time take {:.1f} s and `batch_size=16` with `tf32=true` {:.1f} s",
     lambda: (absorb_s("kv-prefix", 489), absorb_s("kv-prefix:b16tf32", 489))),
    (PAGE, "Validation (seed 10000, {} episodes, {} queries", lambda: (result(ABLATIONS)["episodes"], result(ABLATIONS)["queries"])),
    (PAGE, "conversations hurt ({:.1f}% against {:.1f}%)", lambda: (pct(ABLATIONS, "kv-prefix:conversations"), pct(ABLATIONS, "kv-prefix"))),
    (PAGE, "ties next-token training in exact match and beats it in KL ({:.2f} against {:.2f}); at equal bytes the prefix and a "
           "rank-{} LoRA tie ({:.1f}%)",
     lambda: (row(ABLATIONS, "kv-prefix")["agreement"]["kl"], row(ABLATIONS, "kv-prefix:next-token")["agreement"]["kl"],
              row(ABLATIONS, "distill-lora:equal-bytes")["options"]["rank"],
              same(*(pct(ABLATIONS, m) for m in ("kv-prefix", "kv-prefix:next-token", "distill-lora:equal-bytes"))))),
    (PAGE, "(random vectors: {:.1f}%, KL {:.2f}). The intervals are about ±{:.0f} points",
     lambda: (pct(ABLATIONS, "kv-prefix:random-vectors"), row(ABLATIONS, "kv-prefix:random-vectors")["agreement"]["kl"],
              half_ci(ABLATIONS, "kv-prefix"))),
    (PAGE, "`results/distill-lora-validation-argmax-20000`: {} of keep-prompt's {} answers",
     lambda: (answers(LORA_VAL, "distill-lora:p12-am1"), answers(LORA_VAL, "keep-prompt"))),
    (PAGE, "{} of keep-prompt's {} answers ({:.0f}%), fewer with the KL alone",
     lambda: (answers(LORA, "distill-lora:p12-am1"), answers(LORA, "keep-prompt"), share(LORA, "distill-lora:p12-am1"))),
    (PAGE, "for its top token (KL {:.2f})", lambda: row(LORA, "distill-lora:p12-am1")["agreement"]["kl"]),
    (PAGE, "`results/distill-lora-validation-ensemble-20000`): {} of keep-prompt's {} answers against {} without",
     lambda: (answers(LORA_EVAL, "distill-lora:DE"), answers(LORA_EVAL, "keep-prompt"), answers(LORA_EVAL, "distill-lora:D"))),
    (PAGE, "`results/compare-smollm2-facts-distill-lora-ensemble-20`, a machine about {:.1f} times slower", lambda: ms_ratio(LORA_E, LORA)),
    (PAGE, "{} of keep-prompt's {} answers ({:.0f}%) at the same {:,.0f} KiB",
     lambda: (answers(LORA_E, "distill-lora:DE"), answers(LORA_E, "keep-prompt"), share(LORA_E, "distill-lora:DE"),
              same(row(LORA_E, "distill-lora:DE")["kept_bytes"], row(LORA, "distill-lora:p12-am1")["kept_bytes"]) / 1024)),
    # tried, did not work
    (PAGE, "kv-prefix {:.1f}% against {:.1f}% without (`kv-prefix-validation/default`",
     lambda: (pct("kv-prefix-validation/default", "kv-prefix"), pct("kv-prefix-validation/no-questions", "kv-prefix"))),
    (PAGE, "distill-lora {:.1f}% against {:.1f}% (`kv-prefix-validation-sweep`)",
     lambda: (pct("kv-prefix-validation-sweep", "distill-lora"), pct("kv-prefix-validation-sweep", "distill-lora:no-questions"))),
    (PAGE, "the same {} of {} answers as a constant rate at 48 steps, KL {:.3f} against {:.3f}",
     lambda: (same(answers(SCHEDULE, "kv-prefix:cos48"), answers(SCHEDULE, "kv-prefix:const48")), result(SCHEDULE)["queries"],
              row(SCHEDULE, "kv-prefix:cos48")["agreement"]["kl"], row(SCHEDULE, "kv-prefix:const48")["agreement"]["kl"])),
    (PAGE, "at the last of {} steps a KL up to {:.2f} lower, no more answers", trajectory),
    (PAGE, "where L3 gives {} of keep-prompt's {} answers: `wording_consistency_long_10000.json`",
     lambda: tuple(bench("wording_consistency_long_10000")["summary"][k] for k in ("student_eval", "teacher_eval"))),
    (PAGE, "**A chunked teacher at {:,.0f} tokens**: {}-{} of {} answers against {} reading the whole document", chunked),
    # the second test run (issue 68): its answers and the split by derived-query coverage
    (PAGE, "`facts` reproduces the first run's answers exactly ({} and {} of keep-prompt's {})",
     lambda: (answers(SECOND + "facts", "kv-prefix"), answers(SECOND + "facts", "distill-lora"), answers(SECOND + "facts", "keep-prompt"))),
    (PAGE, "on `facts` it answers {} of the {} covered questions ({:.0f}%, keep-prompt {} of them) and {} of the {} others "
           "({:.0f}%, keep-prompt {}); on `documents` {} of {} and {} of {}",
     lambda: (lambda f, d: (f["covered"]["right"], f["covered"]["asked"], 100 * f["covered"]["right"] / f["covered"]["asked"],
                            f["covered"]["reference_right"], f["not_covered"]["right"], f["not_covered"]["asked"],
                            100 * f["not_covered"]["right"] / f["not_covered"]["asked"], f["not_covered"]["reference_right"],
                            d["covered"]["right"], d["covered"]["asked"], d["not_covered"]["right"], d["not_covered"]["asked"]))(
         *(second_split(t) for t in ("facts", "documents")))),
    (PAGE, "behind ({:.0f}% of keep-prompt's answers there against {:.0f}% on the covered ones on `facts`)",
     lambda: (lambda f: (100 * f["not_covered"]["right"] / f["not_covered"]["reference_right"],
                         100 * f["covered"]["right"] / f["covered"]["reference_right"]))(second_split("facts"))),
    (PAGE, "**Repeated K/V heads for sdpa on CUDA**: {:.1f} against {:.1f} s at 489 tokens",
     lambda: (absorb_s("kv-prefix", 489, "absorb_cost_cuda_h100_gqa"), absorb_s("kv-prefix:enable-gqa", 489, "absorb_cost_cuda_h100_gqa"))),
    # the papers' results pages (issue 76: the claims read from their files)
    ("docs/results/cgt.md", "from {} tokens after the join on (unregularised {}), and is still turning {} tokens after it (cosine "
                            "{:.3f} with the direction before the join, {:.3f} with the end;", cgt_text_turn),
    ("docs/results/cgt.md", "(5-nearest-neighbour topic accuracy {:.2f}-{:.2f}, chance",
     lambda: tuple(sorted(m["knn_topic_accuracy"] for m in result("cgt-text")["models"].values()))),
    ("docs/results/tint.md", "TinT keeps {:.0f}% [{:.0f}, {:.0f}] of dynamic evaluation's gain here over all fractions "
                             "(30 / 50 / 70 / 90%: {:.0f}, {:.0f}, {:.0f}, {:.0f}%)", tint_shares),
    ("docs/results/tint.md", "(the share of dynamic evaluation's log-perplexity gain): {:.0f} / {:.0f} / {:.0f} / {:.0f}% for GPT-2",
     paper_tint_shares),
    ("docs/results/tint.md", "Flagged: OPT-125M's forward, backward and descent parts round to the paper's {} / {} / {} but sum to "
                             "{:.3f}B, which the paper prints as {}B (the sum of the rounded parts); OPT-350M's {:.3f}B against the "
                             "printed {}B does not follow from the paper's own formula; the totals of OPT-1.3B ({:.3f}B) and OPT-2.7B ({:.3f}B) "
                             "agree with the printed {}B and {}B.",
     lambda: (lambda ours, paper: (*paper["OPT-125M"][:3], ours["OPT-125M"]["total_sum"], paper["OPT-125M"][3],
                                   ours["OPT-350M"]["total_sum"], paper["OPT-350M"][3], ours["OPT-1.3B"]["total_sum"],
                                   ours["OPT-2.7B"]["total_sum"], paper["OPT-1.3B"][3], paper["OPT-2.7B"][3]))(
         result("tint-table3")["formula_billions"], result("tint-table3")["paper_billions"])),
]
DOC_NUMBERS += [("docs/results/facts-demo.md", template, value) for template, value in FACTS_NUMBERS]

# kinds of prose number that a page's text may hold only where a DOC_NUMBERS entry covers it: shares in percent, counts
# of right answers against keep-prompt's, seconds and KL values
CHECKED_PROSE = [r"\d[\d,]*(?:\.\d+)?%", r"\d+ (?:answers )?(?:of|against) keep-prompt's \d+", r"\b\d+\.\d+ s\b", r"\bKL \d+\.\d+"]
CHECKED_PAGES = [PAGE]


def _flat(text: str) -> str:
    return " ".join(text.split())


def _prose(page: str) -> str:
    """A page's text without its result blocks (the tables checked against their files) and code, flattened."""
    text = re.sub(r"<!-- result:.*?<!-- /result -->", " ", (ROOT / page).read_text(), flags=re.S)
    return _flat(re.sub(r"```.*?```", " ", text, flags=re.S))


def _formatted(template: str, value) -> str:
    numbers = value()
    return template.format(*numbers) if isinstance(numbers, tuple) else template.format(numbers)


def test_readme_opens_with_the_two_setup_commands():
    assert README.read_text().startswith(SETUP)


def test_the_readme_types_no_number_by_hand():
    """The front page's numbers are in tables copied from or generated out of result files (docs.GENERATED): its
    prose, outside those blocks and code, holds no percentage, score or time."""
    text = re.sub(r"<!-- (result|generated):.*?<!-- /(result|generated) -->", " ", README.read_text(), flags=re.S)
    prose = re.sub(r"```.*?```", " ", text, flags=re.S)
    numbers = [n for n in re.findall(r"\b\d+(?:\.\d+)?(?: ?%| s\b| ms\b| nats\b)|\b(?:F1|EM|KL) \d[\d.]*", prose)
               if n != "95%"]  # a 95% interval is a kind of interval, not a result
    assert not numbers, f"README prose numbers outside generated tables: {numbers}"


@pytest.mark.parametrize("page, template, value", DOC_NUMBERS, ids=[t for _, t, _ in DOC_NUMBERS])
def test_a_docs_prose_number_comes_from_its_result_file(page, template, value):
    text = _flat(_formatted(template, value))
    assert text in _flat((ROOT / page).read_text()), f"{page}: a number differs from its result file: {text!r}"


@pytest.mark.parametrize("page", CHECKED_PAGES)
def test_every_share_count_and_time_in_a_page_prose_is_checked(page):
    """A percentage, an 'N of keep-prompt's M', a time in seconds or a KL value written in the page's prose (outside
    result blocks) must lie inside the text of some DOC_NUMBERS entry, so a new claim of those kinds needs its entry."""
    prose = _prose(page)
    covered = [False] * len(prose)
    for where, template, value in DOC_NUMBERS:
        if where == page:
            text = _flat(_formatted(template, value))
            for m in re.finditer(re.escape(text), prose):
                covered[m.start():m.end()] = [True] * (m.end() - m.start())
    unchecked = [m.group(0) + " in ..." + prose[max(0, m.start() - 60):m.end()]
                 for pattern in CHECKED_PROSE for m in re.finditer(pattern, prose) if not all(covered[m.start():m.end()])]
    assert not unchecked, f"{page}: prose numbers no DOC_NUMBERS entry checks: {unchecked}"


def test_the_prose_patterns_find_each_kind_of_number():
    prose = "kv-prefix: 44 of keep-prompt's 54 answers (81%) at KL 0.38 in 21.1 s."
    found = [m.group(0) for pattern in CHECKED_PROSE for m in re.finditer(pattern, prose)]
    assert found == ["81%", "44 of keep-prompt's 54", "21.1 s", "KL 0.38"]


def test_every_result_block_equals_its_file():
    """Run `python tools/docsync.py` to rewrite the blocks from the files when this fails."""
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


def test_a_generated_table_that_differs_from_its_files_is_reported(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "n.txt").write_text("7")
    monkeypatch.setitem(docs.GENERATED, "seven", lambda root: f"| n |\n|---|\n| {(root / 'n.txt').read_text()} |")
    page = tmp_path / "README.md"
    page.write_text("<!-- generated: seven -->\n| n |\n|---|\n| 6 |\n<!-- /generated -->\n<!-- generated: nine -->\n<!-- /generated -->\n")
    problems = docs.stale(tmp_path)
    assert len(problems) == 2 and "seven differs" in problems[0] and "unknown generated table 'nine'" in problems[1]
    page.write_text(page.read_text().replace("<!-- generated: nine -->\n<!-- /generated -->\n", ""))
    page.write_text(docs.synced(tmp_path, page.read_text()))
    assert docs.stale(tmp_path) == [] and "| 7 |" in page.read_text()


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


def test_the_demo_after_the_move_equals_the_demo_before_it():
    """Issue 69's move changed no result: the main job re-run at the moved code (results/demo-after-move) gives the
    demo's rows (results/demo, before the move) exactly, timings aside."""
    before, after = result(DEMO), result("demo-after-move")
    assert before["code"]["commit"] != after["code"]["commit"] and before["command"] == after["command"]
    keys = ("method", "score", "agreement", "kept_bytes", "train_steps", "episode_scores", "questions", "by_derived")
    assert [{k: r.get(k) for k in keys} for r in before["rows"]] == [{k: r.get(k) for k in keys} for r in after["rows"]]
