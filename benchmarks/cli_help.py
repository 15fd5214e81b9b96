"""How long `incontext ... --help` takes, against the peer it avoids: importing torch.

Runs each command as a child process, interleaved, and reports the children's CPU time (user + system, from
getrusage), median over repeats, and the ratio help / torch import. Prints a markdown table; writes
benchmarks/results/cli_help.{json,md}.

    python benchmarks/cli_help.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COMMANDS = {
    "incontext --help": [sys.executable, "-m", "incontext.cli", "--help"],
    "incontext run --help": [sys.executable, "-m", "incontext.cli", "run", "--help"],
    "incontext compare --help": [sys.executable, "-m", "incontext.cli", "compare", "--help"],
    "python -c 'import torch' (peer)": [sys.executable, "-c", "import torch"],
}


def child_cpu_seconds(command: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, capture_output=True, check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):  # interleaved: each round runs every command once
        for name, command in COMMANDS.items():
            times[name].append(child_cpu_seconds(command))
    medians = {name: statistics.median(values) for name, values in times.items()}
    peer = medians["python -c 'import torch' (peer)"]
    lines = [f"# CPU time of `--help` vs importing torch (child processes, median of {args.repeats}, interleaved)", "",
             "| command | CPU seconds | ratio to importing torch |", "|---|---|---|"]
    lines += [f"| {name} | {value:.3f} | {value / peer:.2f} |" for name, value in medians.items()]
    table = "\n".join(lines) + "\n"
    print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_help.json").write_text(json.dumps({"repeats": args.repeats, "cpu_seconds": times, "medians": medians}, indent=2))
    (RESULTS / "cli_help.md").write_text(table)


if __name__ == "__main__":
    main()
