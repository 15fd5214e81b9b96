"""What each registered experiment reproduces of the four papers, at what scale, and its status; plain data (no torch).

STATUS maps every registered experiment (`incontext run --help`) to a PaperStatus; UNREGISTERED lists the papers'
experiments that have no registered experiment (issue 76), each "not run" with its reason. A number in these strings
comes from the experiment's own result folder, results/NAME/ (or the folder the string names), or, marked "paper",
from the paper (../shared/papers/); the paper's settings not printed in the paper come from ../shared/specs/.
`papers_table(paper)` renders one paper's rows as the markdown table that docs/results/papers.md holds between
`<!-- generated: papers-PAPER -->` markers (tests/experiments/test_status.py checks the page against it).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

STATUSES = ("reproduced", "below the paper", "not run")

# key -> the paper's title (the key names the page's generated block: papers-KEY)
PAPERS = {
    "cgt": "Contextually Guided Transformers via Low-Rank Adaptation (CGT)",
    "iclca": "Exact conversion of in-context learning to model weights in linearized-attention transformers (ICLCA)",
    "tint": "Trainable Transformer in Transformer (TinT)",
    "residual-streams": "Associative memory inspires improvements for in-context learning using a novel attention "
                        "residual stream architecture (AMICL, residual streams)",
    "none": "No paper: checks and demos",
}


@dataclass(frozen=True)
class PaperStatus:
    name: str  # the registered experiment (`incontext run NAME`), or for UNREGISTERED a name it could take
    paper: str  # a key of PAPERS
    reproduces: str  # the paper's table or figure
    scale: str  # ours, then the paper's
    status: str  # one of STATUSES
    cause: str  # reproduced: how close; below the paper: the measured cause; not run: the reason
    page: str  # the docs page with the results (repository path), "" when there is none


def _entry(name, paper, reproduces, scale, status, cause, page) -> PaperStatus:
    return PaperStatus(name, paper, reproduces, scale, status, cause, page)


CGT, ICLCA, TINT, RESIDUAL = (f"docs/results/{p}.md" for p in ("cgt", "iclca", "tint", "residual-streams"))
OTHER = "docs/results/regression-and-parity.md"

_REGISTERED = [
    # CGT
    _entry("cgt-table1", "cgt", "Table 1: base / specialised accuracy, representation variation, linear-fit error",
           "4 layers, d_x 64, d_y 32, 1-digit numbers, 2 tasks, 1,500 steps x 64, 6 seeds; paper 6 layers, d_x 112, "
           "d_y 64, 3 digits, 4 tasks, 400,000 steps x 128, 6 runs",
           "below the paper",
           "aux specialisation reproduces (74.2% vs base 76.2%; paper 77.0 / 77.5); the no-aux collapse (66.6%, the "
           "no-prompt level 68.6%; paper 15.3%) and the fit error (0.59-0.71; paper 0.04-0.19) do not; the fit error's "
           "controlled runs (results/cgt-table1-controls) point at training: 2x the steps 0.58 -> 0.45, y width 64 0.56, "
           "8x the probe's sequences 0.46",
           CGT),
    _entry("cgt-transplant", "cgt", "Table 1's task-vector transplantation baseline (paper 36.8% at the separator, 40.7% at '=')",
           "cgt-table1's preset cpu (4 layers, d 64, 1-digit numbers, 2 tasks, 1,500 steps), seeds 0 and 1; paper 6 "
           "layers, d 112, 3 digits, 4 tasks, 400,000 steps",
           "reproduced",
           "the conclusion: task vectors do not emerge; written at '=' the best layer gives 67.3% and at the separator 54.7%, no better than dropping the prompt (68.3%) and far below the prompt (80.7%); paper 40.7 / 36.8 vs 77.7", CGT),
    _entry("cgt-moving-average", "cgt", "Fig. 14: y kept as a moving average (rate 1/300) instead of frozen",
           "cgt-text's regularised CGT (4 layers, d_x 64, d_y 32, 1,500 steps, BBC News + Shakespeare), 192 tokens after a 64-token first part; paper c4, ~1000 tokens",
           "below the paper",
           "informed minus uninformed -0.002 nats, below zero at 60% of positions (frozen y the same): y hardly differs between documents in this model (cgt-text's collapse), so neither freezing nor averaging carries the first part", CGT),
    _entry("cgt-three-excerpts", "cgt", "Fig. 13(b): y's transitions on mixtures of three excerpts (paper ~10-20 tokens)",
           "cgt-text's regularised CGT, 64 sequences of three 85-token held-out excerpts of three topics; paper c4",
           "below the paper",
           "median 23 tokens at both boundaries (quartiles 16-49 and 10-43) vs the paper's ~10-20: cause not isolated (scale; cgt-text's join gives 22)", CGT),
    _entry("cgt-ablations", "cgt", "Figs 7-9: ablations over the layer l, the rank and w_C / w_D",
           "cgt-table1's preset cpu (4 layers, 1,500 steps), l 1-3, rank 1-8, four (w_C, w_D) pairs, seeds 0 and 1: 9 trainings a seed; paper 6 layers, 400,000 steps",
           "reproduced",
           "the directions at this scale: specialised accuracy rises with l (70.1 / 72.5 / 74.2% at l 1 / 2 / 3 of 4; "
           "paper best at l 4 of 6), rank 1 lowest (73.4% vs 74.2-74.5%, within 3 SE), the strongest w_C / w_D "
           "(0.32 / 0.16) lowest (70.6%); w_C and w_D moved together, so w_D's own effect is not separated", CGT),
    _entry("cgt-single-task", "cgt", "App. D.1: one task of 8 examples (paper's 8-layer baseline 82.7%)",
           "cgt-table1's preset cpu with one task of 8 examples, baseline and CGT + aux + reg, seeds 0 and 1; paper 8-layer baseline",
           "below the paper",
           "baseline 82.8% (paper 82.7%); CGT + aux + reg with y frozen after 4 examples 80.4% against its dynamic 82.9% "
           "(paper: frozen 82.6-82.8%, equal): the frozen y keeps 72% of what examples 1-4 add over dropping them (73.9%); "
           "cause not isolated (scale)", CGT),
    _entry("cgt-vae", "cgt", "App. A.1 / D.4, Figs 17-20: the VAE variant with the GP prior",
           "cgt-text's CGT as a VAE (4 layers, d_y 32, 1,500 steps, BBC News + Shakespeare), beta 1 / 3 / 10, nu 0.1, "
           "lambda 0.1; paper c4",
           "below the paper",
           "low-frequency share of y's power 0.284 / 0.286 / 0.347 at beta 1 / 3 / 10 (smoother at 10, as Fig. 17), but the switch at boundaries is not monotone in beta (20 / 3 / 38 tokens) and topic accuracy stays 0.42-0.43: cause not isolated", CGT),
    _entry("cgt-rp", "cgt", "App. A.2: the distribution-matching regulariser R_P",
           "cgt-table1's preset cpu, seeds 0 and 1, CGT + aux + R_P at w_P 0.01 / 0.1 / 1 beside CGT + aux and + reg; "
           "the paper has no run of it",
           "below the paper",
           "R_P trades accuracy for smoothness at every weight: variation 0.58 / 0.41 / 0.30 at w_P 0.01 / 0.1 / 1 (aux "
           "1.09, reg 0.44) with base accuracy 75.7 / 68.3 / 61.1% (reg 77.1%, no prompt about 67.5%) and a worse fit "
           "(0.60 / 0.71 / 0.88 vs 0.58): no weight gains over R_C / R_D at this size", CGT),
    _entry("cgt-regression", "cgt", "Fig. 4: regression error by examples, dynamic vs y frozen after 5 / 10 / 20",
           "4 layers, d_x 64, d_y 32, d_in 4, 24 points, 3,000 steps; paper 8 layers, d_x 128, d_y 64, d_in 16",
           "below the paper",
           "frozen y 3.9 / 3.2 / 3.3 MSE vs dynamic 1.1: y holds part of the task (probe R^2 0.31-0.53); at d_in 2, "
           "8,000 steps frozen 0.14 vs dynamic 0.04 (results/cgt-regression-pilots)",
           CGT),
    _entry("cgt-text", "cgt", "Sec. 4.4, Figs 5-6: text mixtures, y at the join, t-SNE by topic, specialised CE",
           "4 layers, d_x 64, d_y 32, 2,048-token BPE, 1,500 steps of 8 x 256 tokens, BBC News + Shakespeare; paper 12 "
           "layers, d_x = d_y = 128, 8,000-token BPE, 512 tokens, c4, 400,000 steps",
           "below the paper",
           "frozen y barely helps (CE 4.860 vs 4.863 without the prefix; paper: y gains 0.23 on 3.65); 5-NN topic "
           "accuracy 0.447 vs 0.439 without the regulariser; y turns at 22 tokens (paper 10-20): cause not isolated",
           CGT),
    _entry("cgt-pretrained", "cgt", "no paper table: a frozen-y specialised model (sec. 4.4) over a pretrained LM",
           "1.1M guide parameters over frozen SmolLM2-135M, 100 steps of 4 x 128 tokens; paper: 12-layer CGTs "
           "trained on c4",
           "below the paper",
           "y collapsed (cosine 0.997 between documents): specialised CE 4.027 = another document's y 4.028 = a "
           "same-size LoRA 4.025 (no prefix 4.181)",
           CGT),
    # ICLCA
    _entry("iclca-table1", "iclca", "Table 1: float32 relative logits error of the exact conversion by model size",
           "depth 1 to 1000 (205K-198M parameters), 100 pairs; paper also depth 10,000 (1.98B)",
           "reproduced",
           "2.9e-07 to 9.9e-07 (paper 2.9e-7 to 1.7e-6); 1.98B not run: it does not fit this machine",
           ICLCA),
    _entry("iclca-table2", "iclca", "Table 2: induction heads, accuracy with prompt / without / converted",
           "2 layers, width 128, Taylor features, learned positions, 8,000 steps x 32; paper 12 layers, width 128, RoPE",
           "below the paper",
           "99.94 / 2.24 / 99.94% (paper 99.95 / 2.23 / 99.95) in 1 of 4 runs; seeds 1, 2 and a seed-0 re-run stay on "
           "the counting plateau (22.3 / 22.2 / 21.3%): the escape depends on seed and rounding; with the paper's RoPE "
           "(2 layers, 5 seeds: scripts/iclca_table2_rope.sh, results/iclca-table2-rope) 0 of 5 leave it (18.5-22.5%; "
           "conversion exact, 1e-6 in float32): at 2 layers RoPE does not help; the paper's 12 layers do not fit "
           "here (4 layers: about 45 min a run, not run; 12 layers x 5 seeds on a GPU: scripts/device_papers.sh, "
           "no GPU lent yet)",
           ICLCA),
    _entry("iclca-bias-scratch", "iclca", "Sec. 6.3, Fig. 1: the biased architecture trained from scratch vs without",
           "iclca-table2's model (2 layers, width 128, Taylor features, learned positions), 3,000 steps, seeds 0 and 1; "
           "paper 12 layers, width 128, RoPE",
           "below the paper",
           "at 3,000 steps neither variant leaves the counting plateau (validation accuracy 28.8 / 28.1% plain, 30.1 / 29.0% biased; with prompt 19-22%): no speed-up measurable at this size; conversion exact on top of the learned biases (relative error 0)", ICLCA),
    _entry("iclca-approx", "iclca", "Sec. 6.4: approximate conversion of softmax attention (GPT-2: 16.56% -> 9.17%)",
           "SmolLM2-135M (pretrained GPT-2 not available offline), 50 pairs of 128 + 32 tokens of held-out plays",
           "below the paper",
           "FAVOR+ makes it worse than no prompt (72.0% -> 75.2-104.4%): the estimator's variance at pretrained q/k "
           "norms; learned feature maps 33.6% (paper 9.17%)",
           ICLCA),
    _entry("iclca-approx-trained", "iclca", "Sec. 6.4 on a GPT-2-style model trained here",
           "4 layers, width 128, 1,071,872 parameters, 1,500 steps on Shakespeare; paper: pretrained GPT-2",
           "below the paper",
           "14.18% without prompt -> 11.61% (m 1024, paper 16.56% -> 9.17%): falls with m, less than the paper's; "
           "cause not measured",
           ICLCA),
    _entry("linearize-smollm2", "iclca", "Sec. 7's suggestion (learned kernels): exact conversion on a linearized "
           "pretrained LM; no paper number",
           "SmolLM2-135M, 128 learned features, 200 map steps per layer, 400 LoRA recovery steps of 4 x 256 tokens",
           "reproduced",
           "conversion exact (2.4e-14 relative in float64, 1.0e-05 in float32); perplexity 1.44x SmolLM2's",
           ICLCA),
    # TinT
    _entry("tint-table3", "tint", "Table 3: simulator parameters of OPT-125M to OPT-2.7B; a GPT-2-small-sized step",
           "formula for all four rows; GPT-2-small-sized simulator built on the meta device, one float64 step",
           "reproduced",
           "OPT-1.3B 10.824B, OPT-2.7B 21.771B as printed; flagged: OPT-125M 1.276B (paper 1.2B), OPT-350M 3.174B "
           "(paper 3.4B, not its own formula); step = R-approx to 1.5e-10",
           TINT),
    _entry("tint-perplexity", "tint", "Table 2: perplexity of vanilla / dynamic evaluation / TinT by training fraction",
           "4 layers, width 96, 656,448 parameters, 600 steps x 16, Shakespeare, 64 documents of 128 tokens; paper "
           "GPT-2 and OPT-125M on WikiText-103",
           "below the paper",
           "TinT keeps 31% [1, 47] of dynamic evaluation's gain (paper 63-71% GPT-2, 50-100% OPT): exact SGD on its "
           "subset 39%, with the frozen tied embedding added 106%",
           TINT),
    _entry("tint-classification", "tint", "Table 1: few-shot classification, vanilla / in-context / dynamic eval / TinT",
           "4 layers, width 96, 668,736 parameters, 5-way BBC News, 4 shots x 3 draws, 400 test queries; paper OPT-125M, "
           "7 tasks, 32 shots, 3 seeds",
           "below the paper",
           "no gain beyond the intervals (calibrated 4-shot TinT 41.9 vs vanilla 39.8%, half-width 5.9): validation "
           "picks the smallest inner lr uncalibrated, one step does not help this model",
           TINT),
    _entry("tint-layer-steps", "tint", "Tables 4-5: few-shot accuracy by layer-step budget 12x1, 6x2, 3x4, label / full "
           "loss, single / multi format, with and without calibration",
           "reduced: tint-classification's model (4 layers, width 96), 5-way BBC News, 4 shots x 3 draws, budgets 4x1, "
           "2x2, 1x4; paper OPT-125M, 7 tasks, 32 shots, 3 seeds",
           "below the paper",
           "4x1 / 2x2 / 1x4 on 4 layers: 26-44% vs the paper's 51-73% (12 layers); the budgets differ by less than the seeds' spread, as in the paper, and calibration adds 4-9 points; the model is tint-classification's (below the paper itself)", TINT),
    # residual streams and AMICL
    _entry("amicl", "residual-streams", "Figs 5-6 (and Fig. 4's grid): AMICL accuracy by a, D, length, similarity",
           "the paper's: K 512, D 100, s 20, 1,000 trials per point (K 50 for the D sweep)",
           "reproduced",
           "within 2-3 binomial std of the paper's plot readings (a = 1: 0.297 vs ~0.33; D = 10: 0.739 vs ~0.72)",
           RESIDUAL),
    _entry("residual-bursty", "residual-streams", "Table 1 (and Tables 3-4, Fig. 3): steps until IC / IC2 accuracy "
           "exceeds 0.5 / 0.9 / 0.95",
           "D 32, 40,108 parameters per run, lr 0.03, 12,000 steps, 4 seeds; paper D 85, 207,303 parameters, lr 0.01, "
           "75,000 steps, 4 seeds",
           "reproduced",
           "fewer steps than classic to IC 0.95: V 25% (paper 24%), Q 15% (~18%), K 3% (~3%); absolute steps ~3.5x fewer",
           RESIDUAL),
    _entry("residual-lm", "residual-streams", "Sec. 4, Table 2: classic vs residual-V small LMs, validation loss, IOI",
           "4 layers, width 128, 932,608 parameters, generated stories, T 64, 3,000 steps x 32, 3 seeds; paper 8 "
           "layers, width 256, ~8M parameters, TinyStories, T 256, 3 epochs, 3 seeds",
           "below the paper",
           "final IOI on the paper's prompts 99.6 / 99.5% (paper 7.2 / 41.0%): both copy names seen in training, "
           "neither a held-out name (0%); V gets there sooner (step 1500: 90% vs 24%)",
           RESIDUAL),
    # no paper
    _entry("hf-parity", "none", "no paper: our Transformer's logits vs transformers' GPT-2, Llama and SmolLM2-135M",
           "random 4-layer width-128 GPT-2 and Llama; pretrained SmolLM2-135M on 82 tokens",
           "reproduced",
           "max logit difference 5.36e-07 (GPT-2), 0 (Llama, SmolLM2); greedy continuations identical",
           OTHER),
    _entry("kvzap-train", "none", "no paper of the four: KVzap's scorer (arXiv 2601.07891, linear variant) trained for "
           "a shipped model, issue 79's amortized absorber",
           "linear scorers for SmolLM2-135M and Qwen2.5-0.5B, 80 dev documents each (SQuAD dev articles, HotpotQA dev, "
           "the documents task); KVzap: MLP and linear scorers for 8B-class models",
           "below the paper",
           "held-out R^2 of KVzip's log scores 0.55 (SmolLM2) / 0.59 (Qwen); with KVzip's eviction rule, one prefill at "
           "0.3-0.4x KVzip's time, SQuAD test F1 77% / 94% of keep-prompt at 10% / 25% (KVzip 89% / 105%): below KVzip, "
           "as the linear fit leaves 40% of the score variance", "docs/absorb-methods.md"),
    _entry("regression-demo", "none", "no paper: in-context linear regression vs least squares and ridge",
           "4 layers, width 64, 202,561 parameters, d_in 4, 4,500 steps x 64",
           "below the paper",
           "below its reference, ridge: MSE 1.583 vs 0.005 after 15 examples, 4,500 steps",
           OTHER),
]
STATUS: dict[str, PaperStatus] = {entry.name: entry for entry in _REGISTERED}

UNREGISTERED: list[PaperStatus] = [
    _entry("residual-overhead", "residual-streams", "Sec. 4: wall-clock cost of residual V (paper 30.18 vs 29.12 h, +3.6%)",
           "residual-lm's LM (4 layers, width 128, T 64, batch 32), 1 CPU thread; paper 8 layers, width 256, T 256, "
           "batch 64, whole runs on a PC with 4 GPUs",
           "not run", "a benchmark, not an experiment: benchmarks/residual_overhead.py measures +0.4% [-0.9, +0.9] per "
           "training step at the reduced size (benchmarks/results/residual_overhead.md); its paper size (--preset "
           "paper, a GPU: scripts/device_papers.sh, no GPU lent yet) not run", RESIDUAL),
]


def _cell(text: str) -> str:
    return text.replace("|", "/")


def papers_table(paper: str) -> str:
    """One paper's experiments, registered first, as a markdown table (links relative to docs/results/)."""
    if paper not in PAPERS:
        raise KeyError(f"unknown paper {paper!r}; papers: {', '.join(PAPERS)}")
    lines = ["| experiment | reproduces | scale: ours; paper | status | cause, or reason |", "|---|---|---|---|---|"]
    for entry in [e for e in _REGISTERED if e.paper == paper] + [e for e in UNREGISTERED if e.paper == paper]:
        name = f"`{entry.name}`" if entry.name in STATUS else f"{entry.name} (none registered)"
        if entry.page:
            name = f"[{name}]({posixpath.relpath(entry.page, 'docs/results')})"
        cells = [name, entry.reproduces, entry.scale, entry.status, entry.cause]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)
