"""The one way trimtab layers settings dicts: :func:`deep_merge`.

Settings arrive in layers -- built-in defaults, a tool's own (the dev kit's fast timers, a benchmark's
base), a TOML file, ``--set`` assignments, named flags -- each a nested dict of sections. A later layer
sets leaves; it never replaces a whole section: ``--set broker.adapter.timeout_s=3`` on top of a file
that sets ``broker.adapter.kind`` and ``url`` keeps both. Every command and tool that layers settings
dicts itself (``trimtab dev up``, the local cluster, the chaos suite, the benchmarks, the pipeline's
sweeps) calls this; ``load_settings`` layers the file under the environment and the flags with
pydantic-settings, which merges the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def deep_merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """``layers`` merged left to right into a new dict (none is changed): where two layers both hold a
    mapping under a key, they are merged the same way, key by key; anywhere else the later layer's value
    wins -- a leaf, a list, or a mapping replacing a leaf (and a leaf replacing a mapping). So a later
    layer never drops a key it does not mention, at any depth."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            mine = out.get(key)
            if isinstance(value, Mapping) and isinstance(mine, Mapping):
                out[key] = deep_merge(mine, value)
            elif isinstance(value, Mapping):
                out[key] = deep_merge(value)  # a copy: the result shares no dict with the layers
            else:
                out[key] = value
    return out
