"""The image's build context, reproduced from .dockerignore (devkit/docker_context.py): the patterns behave
as Docker's builder applies them, and the real context holds every package the wheel is built from --
the image once copied six named folders and shipped a CLI that died importing trimtab.pipeline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trimtab.devkit.docker_context import compile_pattern, context_files, copy_context, excluded
from trimtab.devkit.layout import package_dirs

ROOT = Path(__file__).resolve().parents[2]


def patterns(*lines: str) -> list:  # type: ignore[type-arg]
    return [p for p in (compile_pattern(line) for line in lines) if p is not None]


@pytest.mark.parametrize(
    ("lines", "path", "out"),
    [
        (["tests"], "tests/unit/test_x.py", True),  # a directory excludes what is in it
        (["tests"], "tests", True),
        (["tests"], "mytests/x", False),
        (["/tests"], "tests/x", True),  # a leading slash is the context root
        (["./tests"], "tests/x", True),
        (["**/__pycache__"], "__pycache__/a.pyc", True),  # ** matches zero segments
        (["**/__pycache__"], "agent/adapters/__pycache__/a.pyc", True),
        (["*.egg-info"], "trimtab.egg-info/PKG-INFO", True),
        (["*.egg-info"], "sub/trimtab.egg-info/PKG-INFO", False),  # * never crosses "/"
        (["docs", "!docs/keep.md"], "docs/keep.md", False),  # the last match decides
        (["docs", "!docs/keep.md"], "docs/other.md", True),
        (["!docs/keep.md", "docs"], "docs/keep.md", True),
        (["dev?it"], "devkit/x.py", True),
        (["[a-c]gent"], "agent/x.py", True),
        (["# a comment", ""], "anything", False),
    ],
)
def test_dockerignore_semantics(lines: list[str], path: str, out: bool) -> None:
    assert excluded(path, patterns(*lines)) is out


def test_the_context_holds_every_package_and_no_caches() -> None:
    files = set(context_files(ROOT))
    tops = {f.split("/", 1)[0] for f in files}
    # The build files and every folder the build configuration maps (setup.py reads the map).
    for needed in ("pyproject.toml", "setup.py", "README.md", *(p.name for p in package_dirs(ROOT).values())):
        assert needed in tops, f"{needed} is not in the image's build context"
    assert not tops & {".git", ".venv", "tests", "docs"}
    assert not [f for f in files if "__pycache__" in f]


def test_the_dockerfile_copies_the_whole_context() -> None:
    text = (ROOT / "Dockerfile").read_text()
    build = text.split("FROM ", 2)[1]  # the build stage
    copies = re.findall(r"^COPY (.+)$", build, re.M)
    assert copies == [". ."], f"the build stage copies {copies}: copy the context, filter with .dockerignore"


def test_copy_keeps_symlinks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("x = 1\n")
    (src / "link").symlink_to("pkg")
    (src / "skip").mkdir()
    (src / "skip" / "b.py").write_text("")
    (src / ".dockerignore").write_text("skip\n")
    dest = tmp_path / "dest"
    assert copy_context(src, dest) == 3  # .dockerignore, link, pkg/a.py
    assert (dest / "link").is_symlink() and (dest / "link" / "a.py").read_text() == "x = 1\n"
    assert not (dest / "skip").exists()
