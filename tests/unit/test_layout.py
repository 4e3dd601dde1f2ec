"""The package layout: everything is imported as ``trimtab.<name>``, never by the bare folder name.

The repository keeps the design's top-level folders (channel/, agent/, ...) and exposes them as
``trimtab.channel`` etc. through symlinks. Importing a folder by its bare name would load the same code a
second time under another module name -- two ``Record`` classes, two settings models -- so it is refused
here for every Python file of the repository.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("channel", "config", "balance", "cluster", "agent", "controller", "devkit", "bench")


def python_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in out if not f.startswith("trimtab/") or f.count("/") == 1]


def test_code_imports_the_trimtab_package_never_a_bare_folder() -> None:
    bad: list[str] = []
    files = python_files()
    assert len(files) > 50
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            bad += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in FOLDERS
            ]
    assert not bad, "import these as trimtab.<name>:\n" + "\n".join(bad)


def test_trimtab_exposes_each_top_level_folder() -> None:
    for name in FOLDERS[:-1]:
        link = ROOT / "trimtab" / name
        assert link.is_symlink() and link.resolve() == (ROOT / name).resolve(), name
        assert (ROOT / name / "__init__.py").is_file(), name


def test_no_import_cycles_between_modules() -> None:
    """A cycle -- even one hidden in a function body or under TYPE_CHECKING -- means two modules that
    cannot be read, tested or replaced alone; the wiring modules are where both ends meet instead."""
    import grimp

    graph = grimp.build_graph("trimtab", include_external_packages=False)
    cycles: dict[frozenset[str], tuple[str, ...]] = {}
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                cycles.setdefault(frozenset(back), (module, *back))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles.values())
