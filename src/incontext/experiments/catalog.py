"""The registered experiments: name -> (description, [(config key, type, default, comment), ...]).

The data lives in catalog.json, generated from the registry by `python -m incontext.experiments.registry`
(run it after changing an experiment or its config); `incontext run --help` reads it so that help needs no
torch import, and a test checks that it matches the registry.
"""

import json
from pathlib import Path

EXPERIMENTS = {name: (description, [tuple(field) for field in fields])
               for name, (description, fields) in json.loads(Path(__file__).with_name("catalog.json").read_text()).items()}
