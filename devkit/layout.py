"""The package layout, read from the one place that states it: pyproject.toml's
``[tool.setuptools.package-dir]`` (each top-level folder is ``trimtab.<name>``).

Import hooks are how an editable install maps the folders (setuptools' finder); tools that read the source
tree themselves -- mypy, import-linter (through grimp) -- cannot follow an import hook. For them,
:func:`link_tree` builds ``build/pkgtree/trimtab``: a throw-away directory (in .gitignore) whose entries
point at the folders, made fresh from the table by ``scripts/test.sh`` before each check. Nothing else
keeps a list of folders: setup.py, the layout tests and the settings test read the same table.

``python -m trimtab.devkit.layout [DEST]`` builds the tree (default ``build/pkgtree``) and prints its path.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "trimtab"


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """``trimtab.<name>`` -> its folder, as the build configuration maps them."""
    with open(root / "pyproject.toml", "rb") as f:
        table: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items()}


def folders(root: Path = ROOT) -> dict[str, Path]:
    """The top-level folders that are subpackages: bare folder name -> path (``trimtab/`` itself not)."""
    return {n.removeprefix(PACKAGE + "."): p for n, p in package_dirs(root).items() if n != PACKAGE}


def link_tree(dest: Path, root: Path = ROOT) -> Path:
    """``dest/trimtab``: the package as an installed copy would lay it out, made of links to the sources
    (so errors point at files a person edits), rebuilt from scratch. Returns ``dest``."""
    top = dest / PACKAGE
    if top.exists() or top.is_symlink():
        shutil.rmtree(top) if top.is_dir() and not top.is_symlink() else top.unlink()
    top.mkdir(parents=True)
    for entry in sorted(package_dirs(root)[PACKAGE].iterdir()):
        if entry.name != "__pycache__":
            (top / entry.name).symlink_to(entry.resolve())
    for name, path in folders(root).items():
        if "." in name:
            raise ValueError(f"package-dir maps trimtab.{name}: only top-level folders are mapped")
        (top / name).symlink_to(path.resolve(), target_is_directory=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0]) if args else ROOT / "build" / "pkgtree"
    print(link_tree(dest.resolve()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
