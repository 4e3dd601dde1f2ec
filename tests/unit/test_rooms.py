"""The rooms picture in docs/architecture.md is the code's import graph (cli/rooms.py), and the
pure core never reaches into a shell."""

from __future__ import annotations

from pathlib import Path

import pytest

from trimtab.cli.rooms import MARK_BEGIN, MARK_END, doors, mermaid, reduced, room_of, with_picture

ROOT = Path(__file__).resolve().parents[2]
PURE = {"config", "channel", "balance"}
SHELLS = {"cluster", "agent", "controller", "sim", "pipeline", "cli", "devkit"}


def test_the_picture_in_the_docs_is_the_import_graph() -> None:
    doc = (ROOT / "docs/architecture.md").read_text()
    assert with_picture(doc, mermaid(doors(ROOT))) == doc, "docs/architecture.md is stale: run `trimtab docs`"


def test_the_pure_core_imports_no_shell() -> None:
    g = doors(ROOT)
    for room in PURE:
        assert not g.get(room, set()) & SHELLS, (room, g.get(room))
    assert "balance" in g["agent"] and "channel" in g["controller"]  # the graph is read at all


def test_modules_fall_into_their_rooms() -> None:
    assert room_of("trimtab.channel.intents") == "channel"
    assert room_of("trimtab.errors") == "errors"
    assert room_of("trimtab.cli.admin") == "cli"
    assert room_of("trimtab.cli.pipeline") == "cli"
    assert room_of("trimtab.pipeline.ingest") == "pipeline"
    assert room_of("kazoo.client") is None


def test_an_arrow_a_longer_path_implies_is_left_out_and_so_is_the_error_tree() -> None:
    g = {"agent": {"cluster", "balance", "errors"}, "cluster": {"balance"}, "balance": {"errors"}}
    r = reduced(g)
    assert r["agent"] == {"cluster"} and r["cluster"] == {"balance"} and r["balance"] == set()


def test_a_page_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers"):
        with_picture("# no picture here", "x")
    assert (
        with_picture(f"a\n{MARK_BEGIN}\nold\n{MARK_END}\nb", "new") == f"a\n{MARK_BEGIN}\nnew\n{MARK_END}\nb"
    )
