"""`python -m incontext.cli COMMAND` (and `torchrun -m incontext.cli ...`): the `incontext` command."""

import sys

from .commands import main

sys.exit(main())
