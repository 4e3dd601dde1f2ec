"""Channel compaction, the pure part: fold groups of bundles with the nodes' own replay, merge the results.

A node resolves the channel by feeding every message, in log order, to :class:`channel.table.TableView`.
Everything ``TableView`` decides is a function of one key's messages -- the key and value checks, the
home-partition rule and the resolution predicate (``channel.resolve.resolve``) look at the message and at
the current record of *its* bundle, nothing else; a split's children are bundles of their own whose
records their owner writes (docs/protocol.md section 3: "validity is per key"). So the channel can be
hash-partitioned by key, each group replayed by its own ``TableView`` in log order, and the tables and
counts added up: the union is exactly the table one node computes. (The property tests in
tests/property/test_pipeline_fold_props.py check it against a single ``TableView`` over random logs with
racing writers, splits, tombstones and poison values.)

One rule is *not* per key: a message whose (partition, offset) is below what the node already applied
in that partition is a re-delivery and is ignored (``duplicate``), whatever its key. Kafka never
re-delivers within one read, but an export file can repeat or reorder offsets (two exports concatenated,
an edited file). The pipeline handles it in two passes over file splits (contiguous byte ranges, read in
file order):

1. each split reader drops the messages that repeat an offset of an *earlier line of its own split*
   (:func:`ExportSplitReader`), and every fold reports, per (split, partition), the smallest and largest
   offset it kept (:class:`Partial.spans`);
2. the driver computes, per (split, partition), the largest offset of every earlier split
   (:func:`earlier_maxima`). If every split's smallest offset lies above it, no message was a re-delivery
   of an earlier split and the result stands; otherwise the fold runs again, dropping the messages at or
   below those maxima -- the exact rule, now that the maxima are known.

The fold hands ``TableView`` each message with ``offset=None``: re-deliveries were removed by the rule
above, before the fold, so the table's own per-partition check has nothing left to do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trimtab.channel.records import Record
from trimtab.channel.replayfile import BAD_LINE, table_report
from trimtab.channel.table import ReplayStats, TableView

#: (split, partition) -> (smallest, largest) offset of the messages a fold kept.
Spans = dict[tuple[int, int], tuple[int, int]]
#: (split, partition) -> the largest offset of that partition in every earlier split.
Covered = Mapping[tuple[int, int], int]


class Message(NamedTuple):
    """One channel message as the fold sees it (a plain tuple: millions of them go through a fold).

    ``order`` is its place in the log (a byte position in an export file, the offset in a Kafka
    partition): the fold applies a bundle's messages in that order. ``offset`` is the offset that counts
    for the re-delivery rule (None: the rule does not apply, as for a message without one). ``bad`` marks
    an export line that is not an export line: counted as skipped ``bad_line``, nothing else.
    """

    key: bytes | None
    value: bytes | None
    partition: int | None
    offset: int | None
    order: int
    split: int = 0
    bad: bool = False


@dataclass
class Partial:
    """What folding one group of bundles gives: its part of the table, its counts, its offset spans."""

    table: dict[str, Record] = field(default_factory=dict)
    stats: ReplayStats = field(default_factory=ReplayStats)
    spans: Spans = field(default_factory=dict)

    def merge(self, other: Partial) -> None:
        overlap = self.table.keys() & other.table.keys()
        if overlap:  # a key folded in two groups: the partitioning is broken, and the result would be wrong
            raise ValueError(f"bundle {sorted(overlap)[0]!r} was folded in two groups")
        self.table.update(other.table)
        add_stats(self.stats, other.stats)
        for k, (lo, hi) in other.spans.items():
            mine = self.spans.get(k)
            self.spans[k] = (lo, hi) if mine is None else (min(mine[0], lo), max(mine[1], hi))


def add_stats(into: ReplayStats, more: ReplayStats) -> None:
    into.accepted += more.accepted
    into.rejected.update(more.rejected)
    into.skipped.update(more.skipped)


def fold(
    messages: Iterable[tuple[Any, ...]], partitions: int | None, covered: Covered | None = None
) -> Partial:
    """Replay one group of bundles -- every message of each of its keys, in log order -- exactly as a node.

    ``partitions`` switches on the home-partition rule (as on a node). ``covered`` (pass 2 above) drops
    the messages that re-deliver an offset of an earlier split.
    """
    view = TableView(partitions)
    spans: Spans = {}
    bad_lines = 0
    batch: list[tuple[bytes | None, bytes | None, int | None, int | None]] = []
    append = batch.append
    for key, value, p, o, _, split, bad in messages:
        if bad:
            bad_lines += 1
            continue
        if p is not None and o is not None:
            if covered is not None and o <= covered.get((split, p), -1):
                continue  # a re-delivery of an earlier split's offset: a node ignores it
            span = spans.get((split, p))
            if span is None:
                spans[(split, p)] = (o, o)
            elif o < span[0] or o > span[1]:
                spans[(split, p)] = (min(span[0], o), max(span[1], o))
        append((key, value, p, None))
        if len(batch) >= 10_000:
            view.apply_all(batch)
            batch.clear()
    view.apply_all(batch)
    stats = view.stats
    if bad_lines:
        stats.skipped[BAD_LINE] += bad_lines
    return Partial(view.as_dict(), stats, spans)


def earlier_maxima(spans: Mapping[tuple[int, int], tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Per (split, partition) with messages: the largest offset of that partition in the earlier splits
    (absent when no earlier split has that partition)."""
    out: dict[tuple[int, int], int] = {}
    running: dict[int, int] = {}
    for split, partition in sorted(spans):
        if partition in running:
            out[(split, partition)] = running[partition]
        hi = spans[(split, partition)][1]
        running[partition] = max(running.get(partition, hi), hi)
    return out


def redeliveries_across_splits(
    spans: Mapping[tuple[int, int], tuple[int, int]],
) -> dict[tuple[int, int], int]:
    """The maxima to fold again with, or {} when no split re-delivers an offset of an earlier one (then
    the first fold's result is exact)."""
    maxima = earlier_maxima(spans)
    if all(spans[k][0] > m for k, m in maxima.items()):
        return {}
    return maxima


def two_pass(run: Callable[[Covered | None], Partial]) -> tuple[Partial, int]:
    """Fold everything with ``run`` (one distributed fold of every group, merged), and again with the
    re-delivery maxima if the first pass shows a split re-delivering an earlier split's offsets.
    Returns the result and how many passes it took (1 or 2)."""
    first = run(None)
    maxima = redeliveries_across_splits(first.spans)
    if not maxima:
        return first, 1
    return run(maxima), 2


def merge_all(partials: Iterable[Partial]) -> Partial:
    out = Partial()
    for p in partials:
        out.merge(p)
    return out


def report(
    table: Mapping[str, Record], stats: ReplayStats, extra_skips: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """``{"table", "stats"}`` in exactly the shape (and, through :func:`channel.replayfile.report_json`,
    the bytes) of ``trimtab channel replay --json``: the same function builds both."""
    view = TableView()
    view.load(dict(table), {})
    view.stats = ReplayStats(stats.accepted, Counter(stats.rejected), Counter(stats.skipped))
    for reason, n in (extra_skips or {}).items():
        if n:
            view.stats.skipped[reason] += n
    return table_report(view)


class Transition(NamedTuple):
    """An accepted change of one bundle (the history's ``transitions`` aggregate): from and to states (None
    is Init), the records' timestamps (the writers' clocks, ms) and brokers."""

    bundle: str
    from_state: str | None
    to_state: str | None
    from_ts: int | None
    to_ts: int | None
    src: str | None
    dst: str | None
    force: bool
    version: int | None


def transitions(messages: Iterable[tuple[Any, ...]], partitions: int | None) -> list[Transition]:
    """Every accepted change in one group of bundles' messages (in log order), as the nodes decide it: a
    ``TableView`` that is live from the start tells its listener each change."""
    view = TableView(partitions)
    view.set_live()
    out: list[Transition] = []

    def changed(key: str, old: Record | None, new: Record | None) -> None:
        ref = new if new is not None else old
        out.append(
            Transition(
                key,
                None if old is None else old.state.value,
                None if new is None else new.state.value,
                None if old is None else old.ts,
                None if new is None else new.ts,
                None if ref is None else ref.src,
                None if ref is None else ref.dst,
                False if new is None else new.force,
                None if new is None else new.version,
            )
        )

    view.add_listener(changed)
    view.apply_all((key, value, p, None) for key, value, p, *_ in messages)
    return out
