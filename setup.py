"""The package list, derived from ``[tool.setuptools.package-dir]`` in pyproject.toml -- the one place that
maps the repository's top-level folders to ``trimtab.<name>`` (docs/architecture.md, "Layout").

Why a setup.py at all: setuptools' ``packages.find`` cannot search folders that ``package-dir`` maps under
another name, and listing every subpackage by hand is the kind of list that drifts. Everything else about
the build is in pyproject.toml.

The dev kit (``trimtab.devkit``: launchers, the local cluster, benchmarks) is mapped like every folder, so an
editable install (``pip install -e .``, what scripts/setup.sh does) imports it; a wheel leaves it out -- it
ships with the repository only (scripts/check-wheel.sh checks both the wheel and the image's context).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: Packages an editable install maps but a wheel (and so the container image) leaves out.
REPOSITORY_ONLY = ("trimtab.devkit",)


def package_dirs() -> dict[str, str]:
    with open(HERE / "pyproject.toml", "rb") as f:
        dirs: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return dirs


def packages(dirs: dict[str, str]) -> list[str]:
    """Every package under each mapped folder: a directory with an ``__init__.py``, or a data directory
    (no Python) below one, which setuptools wants named to ship its files."""
    found: set[str] = set()
    for name, folder in dirs.items():
        root = HERE / folder
        for d in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            if "__pycache__" in d.parts:
                continue
            rel = d.relative_to(root).parts
            if (d / "__init__.py").is_file() or (rel and (d.parent / "__init__.py").is_file()):
                found.add(".".join((name, *rel)))
    return sorted(found)


class BuildPy(build_py):
    """Leave the repository-only packages out of a wheel; an editable install keeps them."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not getattr(self, "editable_mode", False):
            keep = [p for p in self.packages if not p.startswith(REPOSITORY_ONLY)]
            self.packages = keep


DIRS = package_dirs()
setup(packages=packages(DIRS), cmdclass={"build_py": BuildPy})
