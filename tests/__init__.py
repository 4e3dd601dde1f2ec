"""trimtab test suite (a package, so helpers import as ``tests.support.*`` from the repository root)."""
