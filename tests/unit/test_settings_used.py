"""Every documented setting does something: each leaf field of ``config.settings.Settings`` (the ones
docs/configuration.md lists) is read by code outside config/.

A static check over the source (its syntax trees, so docstrings, comments and help texts that mention a
setting do not count), needing no daemon: a leaf ``<section>.<name>`` counts as read when a source file
outside config/ has an attribute access ``.<name>`` and also names its section -- the section attribute
(``s.shedding``, ``sh = s.shedding``) or its model class (``SimulationSettings``) -- so that a common name
(``enabled``, ``interval_s``) read for one section does not vouch for another's. A setting only
``Settings``' own derived accessors read is in ``READ_THROUGH`` below, with the accessor that must be used
outside config/ for it to count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from trimtab.config.settings import Settings
from trimtab.devkit.layout import package_dirs

ROOT = Path(__file__).resolve().parents[2]
#: The code that may read settings: every folder of the package (trimtab/ itself holds the CLI).
CODE = tuple(p.name for p in package_dirs(ROOT).values())

#: Leaves read only by a derived accessor of ``Settings`` (config/settings.py), which the code outside
#: config/ calls instead of the field: leaf -> that accessor as it appears at its call sites.
READ_THROUGH = {
    # The cluster's ZooKeeper path is <zookeeper.root>/<cluster.name>: every node asks Settings.zk_path.
    "zookeeper.root": "zk_path",
}


def leaves(
    model: type[BaseModel], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], type[BaseModel]]]:
    """(path, the model class that declares it) of every leaf field."""
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from leaves(ann, (*prefix, name))
        else:
            yield (*prefix, name), model


@dataclass(frozen=True)
class Source:
    attributes: frozenset[str]  # every ``x.<attr>`` the code accesses
    names: frozenset[str]  # every identifier it uses: variables, attributes, imported names


def parse(text: str) -> Source:
    tree = ast.parse(text)
    attributes, names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            attributes.add(node.attr)
            names.add(node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rsplit(".", 1)[-1])
        elif isinstance(node, ast.keyword) and node.arg is not None:
            names.add(node.arg)
    return Source(frozenset(attributes), frozenset(names))


def sources() -> dict[Path, Source]:
    """Every Python source outside config/."""
    out: dict[Path, Source] = {}
    for d in CODE:
        for p in (ROOT / d).rglob("*.py"):
            real = p.resolve()
            if (ROOT / "config") in real.parents or ".venv" in real.parts or real in out:
                continue
            out[real] = parse(real.read_text())
    return out


def read_by(path: tuple[str, ...], model: type[BaseModel], files: dict[Path, Source]) -> list[Path]:
    """The files that read the leaf ``path`` (declared by ``model``), by the rule of the module docstring."""
    section, name = path[-2], path[-1]
    return [
        p
        for p, src in files.items()
        if name in src.attributes and (section in src.names or model.__name__ in src.names)
    ]


def test_every_setting_is_read_outside_config() -> None:
    files = sources()
    assert len(files) > 100, "the source walk found too little"
    unread = []
    for path, model in leaves(Settings):
        dotted = ".".join(path)
        if dotted in READ_THROUGH:
            continue
        if not read_by(path, model, files):
            unread.append(dotted)
    assert unread == [], (
        f"settings no code reads (document them only once they do something, or remove them): {unread}"
    )


def test_settings_read_through_accessors_are_used() -> None:
    """Each ``READ_THROUGH`` entry is a real leaf, its accessor reads it, and code outside config/ calls it."""
    all_leaves = {".".join(p) for p, _ in leaves(Settings)}
    settings_py = (ROOT / "config/settings.py").read_text()
    files = sources()
    for dotted, accessor in READ_THROUGH.items():
        assert dotted in all_leaves, f"{dotted} is not a setting any more"
        section, name = dotted.rsplit(".", 1)
        assert f"self.{section}.{name}" in settings_py, f"no accessor of Settings reads {dotted}"
        assert any(accessor in src.attributes for src in files.values()), (
            f"{dotted}: nothing outside config/ uses Settings.{accessor}"
        )


def test_the_check_sees_a_setting_nobody_reads() -> None:
    """The rule itself: a leaf named nowhere is caught, and one read for another section is not enough."""
    files = {Path("a.py"): parse("def f(s):\n    return s.split.enabled, s.shedding.interval_s\n")}

    class Shedding(BaseModel):
        enabled: bool = True
        interval_s: float = 1.0
        never_read: int = 0

    assert read_by(("shedding", "interval_s"), Shedding, files)
    assert read_by(("split", "enabled"), Shedding, files)
    assert not read_by(("shedding", "never_read"), Shedding, files)
    other = {Path("b.py"): parse("def f(s):\n    return s.split.enabled\n")}
    assert not read_by(("shedding", "enabled"), Shedding, other)
    # a mention in a docstring, a comment or a help text is not a read
    text = '"""Honours shedding.never_read."""\n# s.shedding.never_read\nHELP = "see shedding.never_read"\n'
    assert not read_by(("shedding", "never_read"), Shedding, {Path("c.py"): parse(text)})
