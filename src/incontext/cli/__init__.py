"""The command line: `incontext COMMAND` (main.py parses it and calls the command's module: absorb.py, chat.py,
compare.py; lm_eval.py is lm-evaluation-harness's model for absorb folders, `python -m incontext.cli.lm_eval`; help
comes from catalog.json without importing torch)."""

from .commands import DEMO, build_parser, main

__all__ = ["DEMO", "build_parser", "main"]
