"""kv-prefix: self-study into a trained K/V prefix (Cartridges). method.py: the method, its options and the adapted
model (TrainedPrefix); export.py: the prefix as a PEFT CARTRIDGE and back."""

from .method import (
    KVPrefix,
    KVPrefixOptions,
    KVPrefixStudy,
    TrainedPrefix,
    compose_prefixes,
    rerotate,
    rerotated_press,
    spread_prefix,
)

__all__ = ['KVPrefix', 'KVPrefixOptions', 'KVPrefixStudy', 'TrainedPrefix', 'compose_prefixes', 'rerotate', 'rerotated_press', 'spread_prefix']
