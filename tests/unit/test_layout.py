"""The package layout: each top-level folder is ``trimtab.<name>`` and nothing else.

pyproject.toml's ``[tool.setuptools.package-dir]`` maps the design's folders (channel/, agent/, ...) to
``trimtab.channel`` etc.; it is the only list of them (devkit/layout.py reads it for the tools that cannot
follow an import hook). Importing a folder by its bare name would load the same code a second time under
another module name -- two ``Record`` classes, two settings models -- so the code never does it (checked
here for every Python file) and the folders refuse it at run time (``trimtab.refuse_bare_import``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from trimtab.devkit.layout import folders, link_tree, package_dirs

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = tuple(folders(ROOT))


def git_files(*patterns: str) -> list[str]:
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def test_code_imports_the_trimtab_package_never_a_bare_folder() -> None:
    bad: list[str] = []
    files = [ROOT / f for f in git_files("*.py")]
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


def test_every_package_folder_is_mapped_and_no_link_holds_the_layout_together() -> None:
    # Each mapped folder is a package; every top-level package folder but the tests is mapped (a new folder
    # left out of the table would be missing from the wheel and from the type check).
    for name, path in package_dirs(ROOT).items():
        assert (path / "__init__.py").is_file(), name
    top = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - {"tests"}
    assert top == {*FOLDERS, "trimtab"}
    # No symbolic links in the repository (git mode 120000): the build configuration maps the folders.
    staged = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = [line.split("\t")[-1] for line in staged.stdout.splitlines() if line.startswith("120000")]
    assert not links


def test_a_folder_refuses_its_bare_name_and_imports_under_trimtab() -> None:
    probe = (
        "import importlib, json\n"
        f"out = {{}}\nfor n in {list(FOLDERS)!r}:\n"
        "    try:\n        importlib.import_module(n); out[n] = 'imported'\n"
        "    except ImportError as e:\n        out[n] = str(e)\n"
        "    out['trimtab.' + n] = importlib.import_module('trimtab.' + n).__file__\n"
        "print(json.dumps(out))\n"
    )
    # From the repository root, where every folder is on sys.path under its bare name.
    res = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    out = json.loads(res.stdout)
    for n in FOLDERS:
        assert out[n] == f"import trimtab.{n}, not {n}: the folder {n}/ is the package trimtab.{n}"
        assert Path(out[f"trimtab.{n}"]) == ROOT / n / "__init__.py"


def test_the_link_tree_is_the_package_as_installed(tmp_path: Path) -> None:
    tree = link_tree(tmp_path) / "trimtab"
    assert (tree / "errors.py").resolve() == ROOT / "trimtab" / "errors.py"
    for n in FOLDERS:
        assert (tree / n / "__init__.py").resolve() == ROOT / n / "__init__.py"
    link_tree(tmp_path)  # built again from scratch, over the old one
    assert sorted(p.name for p in tree.iterdir()) == sorted(
        {*FOLDERS, *(p.name for p in (ROOT / "trimtab").iterdir() if p.name != "__pycache__")}
    )


def test_no_import_cycles_between_modules(tmp_path: Path) -> None:
    """A cycle -- even one hidden in a function body or under TYPE_CHECKING -- means two modules that
    cannot be read, tested or replaced alone; the wiring modules are where both ends meet instead.
    grimp walks the package's directory, so it reads the link tree (run from there, so that is the
    ``trimtab`` it finds)."""
    link_tree(tmp_path)
    probe = (
        "import grimp, json\n"
        "graph = grimp.build_graph('trimtab', include_external_packages=False, cache_dir=None)\n"
        "cycles = {}\n"
        "for module in sorted(graph.modules):\n"
        "    for imported in graph.find_modules_directly_imported_by(module):\n"
        "        back = graph.find_shortest_chain(importer=imported, imported=module)\n"
        "        if back is not None:\n"
        "            cycles.setdefault(' '.join(sorted(back)), (module, *back))\n"
        "print(json.dumps({'modules': len(graph.modules), 'cycles': list(cycles.values())}))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    out = json.loads(res.stdout)
    assert out["modules"] > 150, out["modules"]  # the whole package was walked, not trimtab/ alone
    assert not out["cycles"], "import cycles:\n" + "\n".join(" -> ".join(c) for c in out["cycles"])
