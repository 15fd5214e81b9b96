"""kv-prefix: self-study into a trained K/V prefix (Cartridges). method.py: the method and its options;
start.py: the prefix's starts beyond the document's first tokens; adapted.py: the adapted model (TrainedPrefix);
export.py: the prefix as a PEFT CARTRIDGE and back."""

from .adapted import TrainedPrefix, compose_prefixes
from .method import KVPrefix, KVPrefixOptions, KVPrefixStudy
from .start import rerotate, rerotated_press, spread_prefix
from . import export  # noqa: F401  (registers its PEFT CARTRIDGE form: export and load)

__all__ = ['KVPrefix', 'KVPrefixOptions', 'KVPrefixStudy', 'TrainedPrefix', 'compose_prefixes', 'rerotate', 'rerotated_press', 'spread_prefix']
