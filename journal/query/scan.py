"""Where a slice query's normal scan is, as an immutable value.

Two positions matter and they can differ: the offset of the last emitted
event (what a restart resumes from) and where the next scan starts, which a
bounded catch-up chunk moves past the last event when nothing more lies below
its bound. Keeping both in one value, with the tie rule (`seen`) applied in
one place, lets the backtracking position reuse the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from types import MappingProxyType

import attrs

from journal.model import TimestampOffset, own_offset
from journal.rows import ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR, Emitted, Row


def offset_after(
    offset: TimestampOffset, ts: datetime, pid: str, seq_nr: int, read_timestamp: datetime
) -> TimestampOffset | None:
    """The offset after a row read from `offset` on, or None if `offset` already covers it.

    Rows arrive ordered by timestamp; at the offset's own timestamp, `seen`
    tells which (pid, seq_nr) were already emitted there.
    """
    timestamp, _, seen = offset
    if ts > timestamp:
        return own_offset(ts, read_timestamp, pid, seq_nr)
    # -1 for an id not seen there: it emitted nothing, not even a seq_nr 0 (the
    # tombstone `delete_all` leaves when it resets the id's sequence).
    if ts < timestamp or seen.get(pid, -1) >= seq_nr:
        return None
    return _new(TimestampOffset, (ts, read_timestamp, _proxy({**seen, pid: seq_nr})))


# TimestampOffset without its `__new__` (`seen` is a read-only view already): this runs
# once for every event a slice query reads.
_new = tuple.__new__
_proxy = MappingProxyType


@attrs.frozen
class ScanPosition:
    """The stream's offset (`latest`) and where its next normal scan starts (`scan_from`).

    `scan_from` is never behind `latest.timestamp`; it runs ahead only after a
    bounded chunk that held no more rows, and then no row at it was emitted.
    """

    latest: TimestampOffset
    scan_from: datetime

    @classmethod
    def at(cls, offset: TimestampOffset) -> ScanPosition:
        return cls(offset, offset.timestamp)

    @property
    def exclude(self) -> Mapping[str, int]:
        """The (pid, seq_nr) pairs at `scan_from` the next scan must skip."""
        return self.latest.seen if self.scan_from == self.latest.timestamp else {}

    def emit(
        self, ts: datetime, pid: str, seq_nr: int, read_timestamp: datetime
    ) -> ScanPosition | None:
        """The position after emitting a row, or None if the row was emitted already."""
        latest = offset_after(self.latest, ts, pid, seq_nr, read_timestamp)
        return None if latest is None else ScanPosition(latest, ts)

    def emit_rows(self, rows: Iterable[Row]) -> tuple[ScanPosition, list[tuple[Row, Emitted]]]:
        """`emit` for each row of a batch in turn (each ends with its read time): the
        position after the last, and the rows to emit with their offsets, in order.

        The same rule as `emit`, without a position per row: a catch-up runs this
        for every event it reads. A row whose id is the only one seen at its
        timestamp (a timestamp of its own, or its append's earlier events only) is
        emitted with its read time in place of its offset (`Emitted`): the envelope
        builds that offset from the row's own fields if it is asked for it.
        """
        latest = self.latest
        emitted: list[tuple[Row, Emitted]] = []
        append = emitted.append
        timestamp, _, seen = latest
        # The last row emitted, while its offset is its own (not built): its id alone
        # is seen at `timestamp`.
        own: Row | None = None
        # Locals, not globals, in the loop: it runs once for every event a catch-up reads.
        new, offset, proxy = _new, TimestampOffset, _proxy
        at_ts, at_pid, at_seq_nr = ROW_DB_TIMESTAMP, ROW_PID, ROW_SEQ_NR
        for row in rows:
            # `offset_after`, inlined.
            ts = row[at_ts]
            if ts > timestamp:
                timestamp = ts
                own = row
                append((row, row[-1]))
                continue
            if ts < timestamp:
                continue
            pid = row[at_pid]
            seq_nr = row[at_seq_nr]
            if own is not None:  # the only id seen at this timestamp is `own`'s
                if own[at_pid] == pid:  # the id's next event of one append: its own offset
                    if own[at_seq_nr] >= seq_nr:
                        continue
                    own = row
                    append((row, row[-1]))
                    continue
                seen = {own[at_pid]: own[at_seq_nr], pid: seq_nr}  # built now
                own = None
            elif seen.get(pid, -1) >= seq_nr:  # -1: as `offset_after`
                continue
            else:
                seen = {**seen, pid: seq_nr}
            latest = new(offset, (ts, row[-1], proxy(seen)))
            append((row, latest))
        if not emitted:
            return self, emitted
        if own is not None:
            latest = own_offset(timestamp, own[-1], own[at_pid], own[at_seq_nr])
        return ScanPosition(latest, latest.timestamp), emitted

    def skip_to(self, end: datetime) -> ScanPosition:
        """After a chunk read whole up to `end`: the next scan may start there."""
        return attrs.evolve(self, scan_from=end) if end > self.scan_from else self
