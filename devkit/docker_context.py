"""The Docker build context of the repository, reproduced without a Docker engine.

The image's build stage copies the whole context (``COPY . .``) and ``.dockerignore`` says what stays out,
so the image can never miss a package the source tree has (it once copied six named folders and shipped a
CLI that died importing ``trimtab.pipeline``). What ships must be tested as shipped: ``scripts/
check-wheel.sh`` copies the files this module selects -- exactly what ``docker build`` would send -- builds
the wheel from that copy, installs it in a fresh virtualenv and runs every command's ``--help``.

``.dockerignore`` semantics, as Docker's builder applies them (moby/patternmatcher): one pattern per line,
``#`` comments and blank lines ignored; a pattern is cleaned (``./`` and a leading ``/`` dropped) and
matched with Go's ``filepath.Match`` against the path relative to the context root *and* against each of
its parent directories (excluding a directory excludes everything in it); ``**`` matches any number of
path segments; ``!`` re-includes. The last pattern that matches decides.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern[str]
    exclude: bool  # False for a "!" pattern (re-include)
    text: str


def _segment_regex(seg: str) -> str:
    """Go's filepath.Match within one path segment: ``*`` and ``?`` never match ``/``, ``[...]`` classes
    (``^`` or ``!`` negates), ``\\`` escapes."""
    out = []
    i = 0
    while i < len(seg):
        c = seg[i]
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = seg.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = seg[i + 1 : j]
                if body[:1] in ("^", "!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = j
        elif c == "\\" and i + 1 < len(seg):
            i += 1
            out.append(re.escape(seg[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def compile_pattern(line: str) -> Pattern | None:
    """One line of ``.dockerignore`` as a :class:`Pattern`, or None for a comment or a blank line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    exclude = not text.startswith("!")
    raw = text[1:].strip() if not exclude else text
    cleaned = os.path.normpath(raw.lstrip("/")) if raw.lstrip("/") else "."
    parts = cleaned.split("/")
    pieces = []
    for n, seg in enumerate(parts):
        if seg == "**":
            # "**/" matches zero or more leading segments; a trailing "**" matches everything below.
            pieces.append("(?:.*/)?" if n < len(parts) - 1 else ".*")
        else:
            pieces.append(_segment_regex(seg) + ("/" if n < len(parts) - 1 else ""))
    return Pattern(re.compile("".join(pieces) + r"\Z"), exclude, text)


def load_patterns(root: Path) -> list[Pattern]:
    path = root / ".dockerignore"
    if not path.exists():
        return []
    return [p for p in (compile_pattern(line) for line in path.read_text().splitlines()) if p is not None]


def excluded(rel: str, patterns: list[Pattern]) -> bool:
    """Whether the context path ``rel`` (``a/b/c``) is left out: the last pattern matching the path or one
    of its parent directories decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for p in patterns:
        if any(p.regex.match(c) for c in candidates):
            verdict = p.exclude
    return verdict


def context_files(root: Path) -> Iterator[str]:
    """Every file and symlink Docker would send as the build context of ``root``, relative, sorted."""
    patterns = load_patterns(root)
    reincludes = any(not p.exclude for p in patterns)

    @cache
    def out(rel: str) -> bool:
        return excluded(rel, patterns)

    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        # An excluded directory is skipped unless a "!" pattern might re-include something in it.
        dirnames[:] = sorted(d for d in dirnames if reincludes or not out(prefix + d))
        for name in sorted(filenames) + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            rel = prefix + name
            if not out(rel):
                yield rel


def copy_context(root: Path, dest: Path) -> int:
    """Copy the build context of ``root`` into ``dest`` (symlinks as symlinks); the number of entries."""
    n = 0
    for rel in context_files(root):
        src, dst = root / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
        n += 1
    return n


def main() -> None:
    """``python -m trimtab.devkit.docker_context SRC DEST``: what check-wheel.sh runs."""
    import sys

    if len(sys.argv) != 3:
        raise SystemExit("usage: python -m trimtab.devkit.docker_context SRC DEST")
    n = copy_context(Path(sys.argv[1]).resolve(), Path(sys.argv[2]))
    print(f"build context: {n} entries copied to {sys.argv[2]}")


if __name__ == "__main__":
    main()
