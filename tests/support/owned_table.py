"""A channel table reduced to what the placement view reads of it (``get``, ``owned``), for tests that
drive the view record by record: :meth:`OwnedRecords.change` stores the record and then tells the view, in
the order a :class:`~trimtab.channel.table.TableView` applies a record and notifies its listeners."""

from __future__ import annotations

from trimtab.channel.records import Record, State
from trimtab.cluster.placement.view import LivePlacement


class OwnedRecords:
    def __init__(self) -> None:
        self.records: dict[str, Record] = {}

    def get(self, bundle: str) -> Record | None:
        return self.records.get(bundle)

    def owned(self) -> list[tuple[str, str]]:
        return [(k, r.dst) for k, r in self.records.items() if r.state is State.OWNED and r.dst is not None]

    def change(self, view: LivePlacement, bundle: str, old: Record | None, new: Record | None) -> None:
        if new is None:
            self.records.pop(bundle, None)
        else:
            self.records[bundle] = new
        view.record_changed(bundle, old, new)


def change(view: LivePlacement, bundle: str, old: Record | None, new: Record | None) -> None:
    """:meth:`OwnedRecords.change` on the records the view was built over (which must be OwnedRecords)."""
    table = view._table
    assert isinstance(table, OwnedRecords)
    table.change(view, bundle, old, new)
