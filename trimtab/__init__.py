"""trimtab: shard ownership and load balancing for clusters of stateless serving brokers.

The repository's top-level folders (``channel/``, ``agent/``, ...) are this package's subpackages
``trimtab.channel``, ``trimtab.agent``, ... through the build configuration (pyproject.toml's
``[tool.setuptools.package-dir]``). :func:`refuse_bare_import` keeps each importable under that one name.
"""

from __future__ import annotations


def refuse_bare_import(name: str) -> None:
    """Called first by every top-level folder's ``__init__``: importing ``channel`` rather than
    ``trimtab.channel`` (possible from the repository root, where the folder is on ``sys.path``) would load
    the same code a second time under another name -- two ``Record`` classes, two settings models, checks
    of ``isinstance`` that fail for no visible reason. Refused at once, with the name to use."""
    if not name.startswith("trimtab."):
        raise ImportError(
            f"import trimtab.{name}, not {name}: the folder {name}/ is the package trimtab.{name}"
        )
