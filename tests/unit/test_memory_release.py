"""Giving a bootstrap's freed memory back to the system (cluster/memory.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from trimtab.cluster.memory import Released, release_free_memory, resident_bytes

# In a process of its own (its heap is the test's alone): 200 MiB in 2 000-byte blocks (malloc, not
# pymalloc), one block in 100 kept so that the heap's top cannot shrink by itself, the rest freed.
CHILD = textwrap.dedent(
    """
    import json
    from trimtab.cluster.memory import release_free_memory, resident_bytes
    blocks = [bytes(2000) for _ in range(100_000)]
    kept = blocks[::100]
    del blocks
    freed = resident_bytes()
    r = release_free_memory()
    print(json.dumps({"freed": freed, "after": resident_bytes(), "r": None if r is None else
                      [r.rss_before, r.rss_after, r.seconds], "kept": len(kept)}))
    """
)


def test_resident_bytes_is_this_process() -> None:
    """The resident size is read (a process of this interpreter holds more than 10 MiB)."""
    assert resident_bytes() > 10 * 2**20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_goes_back_to_the_system() -> None:
    """Rule: once memory is freed, a trim gives its pages back: resident memory falls by most of the
    freed 200 MiB (without the trim glibc keeps it for good), and the result says so."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    got = json.loads(out)
    assert got["r"] is not None
    before, after, seconds = got["r"]
    assert before >= got["freed"] - 2**20
    assert before - after > 150 * 2**20, got
    assert got["after"] <= after + 2**20
    assert Released(before, after, seconds).released == before - after
    assert seconds >= 0


def test_released_is_never_negative() -> None:
    """A trim that found nothing (or a process that grew meanwhile) releases 0, not a negative size."""
    assert Released(100, 200, 0.0).released == 0
    r = release_free_memory()
    assert r is None or r.released >= 0
