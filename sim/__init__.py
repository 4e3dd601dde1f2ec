"""The deterministic simulator (docs/simulator.md)."""

from trimtab import refuse_bare_import

refuse_bare_import(__name__)
