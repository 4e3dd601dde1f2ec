"""One error tree (issue 30, point 4): the tree drawn in ``trimtab/errors.py``'s docstring is exactly the
hierarchy of the classes, found by walking ``TrimtabError.__subclasses__()`` recursively over every module
of the package -- a class added anywhere without being drawn, or drawn and gone, fails here -- and every
exception class trimtab defines is a ``TrimtabError``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from dataclasses import dataclass
from types import ModuleType

import trimtab
from trimtab import errors
from trimtab.devkit.layout import package_dirs
from trimtab.errors import TrimtabError

#: Exception classes that are not TrimtabErrors on purpose, with why.
NOT_TRIMTAB = {
    # A test's stand-in for kill -9: no `except Exception` (nor `except TrimtabError`) may clean up after it.
    "trimtab.pipeline.ingest.SimulatedCrash",
}

_NODE = re.compile(r"(?P<prefix>(?:│   |    )*(?:├── |└── )?)(?P<name>\w+)(?:\s+\[(?P<module>[\w.]+)\])?")


@dataclass(frozen=True)
class Drawn:
    qualname: str  # trimtab.<module>.<Class>
    parent: str | None
    prefix: str  # the tree-drawing characters before the name, as drawn
    line: str


def every_module() -> list[ModuleType]:
    """Every module of the package (the dev kit, the pipeline and the simulator included): a subclass
    exists for ``__subclasses__`` only once its module is imported."""
    found = [trimtab.__name__]
    for name, path in package_dirs().items():
        found += [m.name for m in pkgutil.walk_packages([str(path)], name + ".")]
    return [importlib.import_module(m) for m in sorted(set(found))]


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def drawn_tree() -> list[Drawn]:
    """The tree in the docstring of trimtab/errors.py, line by line (``[module]`` relative to trimtab)."""
    doc = errors.__doc__ or ""
    block = doc.split("::\n", 1)[1]
    lines = [line[4:] for line in block.splitlines() if line.strip()]
    out: list[Drawn] = []
    stack: list[str] = []
    for line in lines:
        m = _NODE.match(line)
        assert m is not None, f"not a line of the tree: {line!r}"
        depth = len(m["prefix"]) // 4
        name = f"trimtab.{m['module'] or 'errors'}.{m['name']}"
        del stack[depth:]
        out.append(Drawn(name, stack[-1] if stack else None, m["prefix"], line))
        stack.append(name)
    return out


def class_tree() -> dict[str, str | None]:
    """Every TrimtabError subclass trimtab defines -> its TrimtabError parent (None for the root)."""
    every_module()
    edges: dict[str, str | None] = {qualname(TrimtabError): None}

    def walk(cls: type) -> None:
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("trimtab."):  # (not a test's own subclass)
                edges[qualname(sub)] = qualname(cls)
                walk(sub)

    walk(TrimtabError)
    return edges


def test_the_drawn_tree_is_the_class_hierarchy() -> None:
    drawn = {d.qualname: d.parent for d in drawn_tree()}
    real = class_tree()
    missing = [
        f"{name.rsplit('.', 1)[1]} [{name.removeprefix('trimtab.').rsplit('.', 1)[0]}] under {parent}"
        for name, parent in sorted(real.items())
        if drawn.get(name, "?") != parent
    ]
    gone = sorted(set(drawn) - set(real))
    assert not missing, "draw these in trimtab/errors.py's tree (or fix their place):\n" + "\n".join(missing)
    assert not gone, f"drawn in trimtab/errors.py but no such class (any more): {gone}"


def test_the_tree_is_drawn_consistently() -> None:
    """Each line's ``├──``/``└──`` and the ``│`` columns before it are what its place in the tree gives:
    a class drawn under the wrong branch cannot look right by accident."""
    nodes = drawn_tree()
    assert nodes[0].qualname == qualname(TrimtabError) and nodes[0].prefix == ""
    children: dict[str | None, list[str]] = {}
    for d in nodes:
        children.setdefault(d.parent, []).append(d.qualname)
    parent_of = {d.qualname: d.parent for d in nodes}

    def is_last(name: str) -> bool:
        return children[parent_of[name]][-1] == name

    for d in nodes[1:]:
        ancestors: list[str] = []
        p = d.parent
        while p is not None and parent_of[p] is not None:
            ancestors.append(p)
            p = parent_of[p]
        columns = "".join("    " if is_last(a) else "│   " for a in reversed(ancestors))
        want = columns + ("└── " if is_last(d.qualname) else "├── ")
        assert d.prefix == want, f"{d.line!r}: expected the prefix {want!r}"


def test_every_exception_class_is_a_trimtab_error() -> None:
    strays = []
    for module in every_module():
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ != module.__name__ or not issubclass(obj, BaseException):
                continue
            if not issubclass(obj, TrimtabError) and qualname(obj) not in NOT_TRIMTAB:
                strays.append(qualname(obj))
    assert not strays, f"not TrimtabErrors (trimtab/errors.py: one error tree): {sorted(strays)}"


def test_the_exceptions_to_the_rule_still_exist() -> None:
    """An allow-list entry whose class is gone would let a new class of that name slip through."""
    classes = {
        qualname(obj)
        for module in every_module()
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if obj.__module__ == module.__name__
    }
    assert classes >= NOT_TRIMTAB
