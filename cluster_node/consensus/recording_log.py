"""recording.log: what each archive recording holds for the cluster, and the recovery plan (core)

The consensus module keeps one log recording in the archive, extended term after term, plus
snapshot recordings. ``recording.log`` says which leadership term starts where in that one log
(TERM entries) and which recordings hold snapshots taken at which log position (SNAPSHOT
entries). On start it is read back to build a ``RecoveryPlan``; during elections a member reads
it to tell a lagging member where its term ends and the next begins.

This module is pure: it decodes the file's bytes, keeps the entries in memory, and turns every
mutation into byte patches ``(offset, data)`` that the shell (``recording_log_file.py``) writes
and syncs. The consensus core hands those patches out as ``WriteRecordingLog`` effects.

Entry layout
============
Entries follow the reference's (Aeron Cluster's RecordingLog) fields and offsets, little-endian, each padded
to a multiple of 64 bytes (at most 4096), with a CRC-32 in the entry's last four bytes so that a
torn write is recognised::

    offset  size  field
         0     8  recording_id             i64
         8     8  leadership_term_id       i64
        16     8  term_base_log_position   i64
        24     8  log_position             i64   -1 (NULL) while a TERM is still open
        32     8  timestamp                i64
        40     4  service_id               i32   -1 = consensus module (snapshots); 0 for TERMs
        44     4  entry_type               i32   TERM 0, SNAPSHOT 1, STANDBY_SNAPSHOT 2;
                                                  bit 31 set = entry invalidated
        48     4  archive_endpoint_length  i32   n, standby snapshots only (else 0)
        52     n  archive_endpoint         ASCII
      52+n     .  zero padding
       L-4     4  crc32                    u32   of bytes [0, L-4); L = align(56 + n, 64)

Entries are only appended, or rewritten whole in place (committing a TERM's log position,
setting the invalid bit), so a crash leaves at most the last entry torn: decoding stops at the
first entry whose length or checksum is wrong, and reports the valid length so the shell can cut
the torn tail. A bad entry followed by good ones is corruption and refused.

TERM entries
============
A member appends a TERM entry when its log *adopts* a leadership term: when its log up to the
term's base position is the term leader's log. The previous open TERM is committed at the new
term's base in the same patch set. So the last valid TERM entry is always the term of the last
entry in the log (the member's ``log_leadership_term_id``), which the vote rule relies on.
Truncating an uncommitted tail invalidates the TERMs that started beyond the cut and sets the
log position of the term the cut falls in.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, replace

__all__ = [
    "ENTRY_TYPE_TERM",
    "ENTRY_TYPE_SNAPSHOT",
    "ENTRY_TYPE_STANDBY_SNAPSHOT",
    "ENTRY_INVALID_FLAG",
    "ENTRY_ALIGNMENT",
    "MAX_ENTRY_LENGTH",
    "CONSENSUS_MODULE_SERVICE_ID",
    "RecordingLogError",
    "Entry",
    "Snapshot",
    "RecoveryPlan",
    "RecordingLog",
    "encode_entry",
]

NULL_VALUE = -1
NULL_POSITION = -1
ENTRY_TYPE_TERM = 0
ENTRY_TYPE_SNAPSHOT = 1
ENTRY_TYPE_STANDBY_SNAPSHOT = 2
ENTRY_INVALID_FLAG = 1 << 31
ENTRY_ALIGNMENT = 64
MAX_ENTRY_LENGTH = 4096
CONSENSUS_MODULE_SERVICE_ID = -1

_FIXED = struct.Struct("<qqqqqiii")  # 52 bytes: the fields up to archive_endpoint_length
_CRC = struct.Struct("<I")
_MAX_ENDPOINT = MAX_ENTRY_LENGTH - _FIXED.size - _CRC.size


class RecordingLogError(ValueError):
    """recording.log is corrupt (not merely torn at its tail), or a mutation is not allowed."""


@dataclass(frozen=True, slots=True)
class Entry:
    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int
    entry_type: int
    is_valid: bool = True
    archive_endpoint: str = ""
    entry_index: int = -1
    """Position of the entry in the file (0-based); set by RecordingLog."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    recording_id: int
    leadership_term_id: int
    term_base_log_position: int
    log_position: int
    timestamp: int
    service_id: int


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    """How to rebuild a member's state on start (reference ``RecordingLog.RecoveryPlan``).

    ``snapshots`` holds the latest valid snapshot set: the consensus module's (service id -1)
    first, then one per service. ``appended_log_position`` is the log recording's stop position
    as the archive reports it; ``committed_log_position`` is the highest position known to be
    committed from the files alone: the snapshot's position, else 0.
    """

    last_leadership_term_id: int
    last_term_base_log_position: int
    appended_log_position: int
    committed_log_position: int
    log_recording_id: int
    log_start_position: int
    snapshots: tuple[Snapshot, ...]


def _entry_length(endpoint_length: int) -> int:
    raw = _FIXED.size + endpoint_length + _CRC.size
    return (raw + ENTRY_ALIGNMENT - 1) // ENTRY_ALIGNMENT * ENTRY_ALIGNMENT


def encode_entry(entry: Entry) -> bytes:
    endpoint = entry.archive_endpoint.encode("ascii")
    if len(endpoint) > _MAX_ENDPOINT:
        raise RecordingLogError(f"archive endpoint longer than {_MAX_ENDPOINT} bytes")
    length = _entry_length(len(endpoint))
    entry_type = entry.entry_type | (0 if entry.is_valid else ENTRY_INVALID_FLAG)
    if entry_type >= 1 << 31:
        entry_type -= 1 << 32
    buf = bytearray(length)
    _FIXED.pack_into(
        buf,
        0,
        entry.recording_id,
        entry.leadership_term_id,
        entry.term_base_log_position,
        entry.log_position,
        entry.timestamp,
        entry.service_id,
        entry_type,
        len(endpoint),
    )
    buf[_FIXED.size : _FIXED.size + len(endpoint)] = endpoint
    _CRC.pack_into(buf, length - 4, zlib.crc32(memoryview(buf)[: length - 4]))
    return bytes(buf)


class RecordingLog:
    """The entries of recording.log in memory; mutations return the byte patches to apply."""

    __slots__ = ("entries", "_offsets", "length", "torn_tail_length")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._offsets: list[int] = []
        self.length = 0
        """Bytes of valid entries (the file's length once the patches are applied)."""
        self.torn_tail_length = 0
        """Bytes after the valid entries that ``decode`` ignored (a torn last write)."""

    # ------------------------------------------------------------------------------ decoding

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> RecordingLog:
        log = cls()
        view = memoryview(data)
        offset = 0
        total = len(view)
        while offset < total:
            entry_len = cls._valid_entry_length(view, offset)
            if entry_len == 0:
                # Torn tail, unless a valid entry follows somewhere after it: then it is damage.
                probe = offset + ENTRY_ALIGNMENT
                while probe < total:
                    if cls._valid_entry_length(view, probe):
                        raise RecordingLogError(
                            f"recording.log is corrupt at byte {offset}: a damaged entry is"
                            f" followed by a valid one at byte {probe}"
                        )
                    probe += ENTRY_ALIGNMENT
                log.torn_tail_length = total - offset
                break
            fields = _FIXED.unpack_from(view, offset)
            raw_type = fields[6] & 0xFFFFFFFF
            endpoint = bytes(view[offset + _FIXED.size : offset + _FIXED.size + fields[7]])
            entry = Entry(
                recording_id=fields[0],
                leadership_term_id=fields[1],
                term_base_log_position=fields[2],
                log_position=fields[3],
                timestamp=fields[4],
                service_id=fields[5],
                entry_type=raw_type & ~ENTRY_INVALID_FLAG,
                is_valid=not (raw_type & ENTRY_INVALID_FLAG),
                archive_endpoint=endpoint.decode("ascii", "replace"),
                entry_index=len(log.entries),
            )
            log.entries.append(entry)
            log._offsets.append(offset)
            offset += entry_len
        log.length = offset
        return log

    @staticmethod
    def _valid_entry_length(view: memoryview, offset: int) -> int:
        """Length of a well-formed entry at ``offset``, or 0 if there is none."""
        if offset + ENTRY_ALIGNMENT > len(view):
            return 0
        endpoint_length = struct.unpack_from("<i", view, offset + 48)[0]
        if not 0 <= endpoint_length <= _MAX_ENDPOINT:
            return 0
        length = _entry_length(endpoint_length)
        if offset + length > len(view):
            return 0
        (crc,) = _CRC.unpack_from(view, offset + length - 4)
        if zlib.crc32(view[offset : offset + length - 4]) != crc:
            return 0
        return length

    def encode(self) -> bytes:
        return b"".join(encode_entry(e) for e in self.entries)

    # ------------------------------------------------------------------------------ queries

    def term_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.is_valid and e.entry_type == ENTRY_TYPE_TERM]

    def last_term(self) -> Entry | None:
        for e in reversed(self.entries):
            if e.is_valid and e.entry_type == ENTRY_TYPE_TERM:
                return e
        return None

    def find_term(self, leadership_term_id: int) -> Entry | None:
        for e in reversed(self.entries):
            if e.is_valid and e.entry_type == ENTRY_TYPE_TERM and e.leadership_term_id == leadership_term_id:
                return e
        return None

    def greatest_term_at_or_before(self, leadership_term_id: int) -> Entry | None:
        best = None
        for e in self.term_entries():
            if e.leadership_term_id <= leadership_term_id and (
                best is None or e.leadership_term_id > best.leadership_term_id
            ):
                best = e
        return best

    def first_term_after(self, leadership_term_id: int) -> Entry | None:
        best = None
        for e in self.term_entries():
            if e.leadership_term_id > leadership_term_id and (
                best is None or e.leadership_term_id < best.leadership_term_id
            ):
                best = e
        return best

    def latest_snapshot(self, service_id: int = CONSENSUS_MODULE_SERVICE_ID) -> Entry | None:
        for e in reversed(self.entries):
            if e.is_valid and e.entry_type == ENTRY_TYPE_SNAPSHOT and e.service_id == service_id:
                return e
        return None

    # ---------------------------------------------------------------------------- mutations

    def _append(self, entry: Entry) -> tuple[int, bytes]:
        entry = replace(entry, entry_index=len(self.entries))
        data = encode_entry(entry)
        offset = self.length
        self.entries.append(entry)
        self._offsets.append(offset)
        self.length += len(data)
        return (offset, data)

    def _rewrite(self, index: int, entry: Entry) -> tuple[int, bytes]:
        self.entries[index] = entry
        return (self._offsets[index], encode_entry(entry))

    def _invalidate(self, matches) -> list[tuple[int, bytes]]:
        """Mark every valid entry that ``matches`` invalid; the patches, in file order."""
        return [
            self._rewrite(e.entry_index, replace(e, is_valid=False))
            for e in list(self.entries)
            if e.is_valid and matches(e)
        ]

    def append_term(
        self,
        recording_id: int,
        leadership_term_id: int,
        term_base_log_position: int,
        timestamp: int,
    ) -> tuple[tuple[int, bytes], ...]:
        """Adopt ``leadership_term_id`` starting at ``term_base_log_position``; the open previous
        term is committed at that base in the same patch set."""
        writes = []
        last = self.last_term()
        if last is not None:
            if leadership_term_id <= last.leadership_term_id:
                raise RecordingLogError(
                    f"term {leadership_term_id} is not after the last term {last.leadership_term_id}"
                )
            if term_base_log_position < last.term_base_log_position:
                raise RecordingLogError(
                    f"term {leadership_term_id} base {term_base_log_position} is before term"
                    f" {last.leadership_term_id}'s base {last.term_base_log_position}"
                )
            if last.log_position != term_base_log_position:
                writes.append(self._rewrite(last.entry_index, replace(last, log_position=term_base_log_position)))
        writes.append(
            self._append(
                Entry(
                    recording_id,
                    leadership_term_id,
                    term_base_log_position,
                    NULL_POSITION,
                    timestamp,
                    0,
                    ENTRY_TYPE_TERM,
                )
            )
        )
        return tuple(writes)

    def commit_log_position(self, leadership_term_id: int, log_position: int) -> tuple[tuple[int, bytes], ...]:
        """Set the end of a term (orderly termination, or a truncation inside it)."""
        e = self.find_term(leadership_term_id)
        if e is None:
            raise RecordingLogError(f"no TERM entry for term {leadership_term_id}")
        if e.log_position == log_position:
            return ()
        return (self._rewrite(e.entry_index, replace(e, log_position=log_position)),)

    def truncate_to(self, position: int) -> tuple[tuple[int, bytes], ...]:
        """The log is cut at ``position``: TERMs that start after it are invalidated, snapshots
        taken after it too, and the term the cut falls in ends there."""
        writes = self._invalidate(
            lambda e: (e.term_base_log_position if e.entry_type == ENTRY_TYPE_TERM else e.log_position) > position
        )
        last = self.last_term()
        if last is not None and last.log_position != position:
            writes.append(self._rewrite(last.entry_index, replace(last, log_position=position)))
        return tuple(writes)

    def invalidate_terms_from(self, leadership_term_id: int) -> tuple[tuple[int, bytes], ...]:
        """Drop the TERMs from ``leadership_term_id`` on (a tail of terms the leader lacks)."""
        return tuple(
            self._invalidate(lambda e: e.entry_type == ENTRY_TYPE_TERM and e.leadership_term_id >= leadership_term_id)
        )

    def append_snapshot(
        self,
        recording_id: int,
        leadership_term_id: int,
        term_base_log_position: int,
        log_position: int,
        timestamp: int,
        service_id: int,
    ) -> tuple[tuple[int, bytes], ...]:
        return (
            self._append(
                Entry(
                    recording_id,
                    leadership_term_id,
                    term_base_log_position,
                    log_position,
                    timestamp,
                    service_id,
                    ENTRY_TYPE_SNAPSHOT,
                )
            ),
        )

    def invalidate_latest_snapshot(self) -> tuple[tuple[int, bytes], ...]:
        """Invalidate the newest consensus-module snapshot and the service snapshots at its
        position, so that the previous set is loaded on the next start."""
        cm = self.latest_snapshot(CONSENSUS_MODULE_SERVICE_ID)
        if cm is None:
            return ()
        return tuple(
            self._invalidate(
                lambda e: (
                    e.entry_type in (ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_STANDBY_SNAPSHOT)
                    and e.log_position == cm.log_position
                    and e.leadership_term_id == cm.leadership_term_id
                )
            )
        )

    # ------------------------------------------------------------------------------ retention

    def snapshot_sets(self, service_count: int) -> list[tuple[Entry, ...]]:
        """The complete valid snapshot sets, newest first: each the consensus module's entry
        followed by one entry per service at the same term and log position."""
        sets = []
        for cm in reversed(self.entries):
            if not (
                cm.is_valid and cm.entry_type == ENTRY_TYPE_SNAPSHOT and cm.service_id == CONSENSUS_MODULE_SERVICE_ID
            ):
                continue
            found = [cm]
            for service_id in range(service_count):
                s = next(
                    (
                        e
                        for e in reversed(self.entries)
                        if e.is_valid
                        and e.entry_type == ENTRY_TYPE_SNAPSHOT
                        and e.service_id == service_id
                        and e.log_position == cm.log_position
                        and e.leadership_term_id == cm.leadership_term_id
                    ),
                    None,
                )
                if s is None:
                    break
                found.append(s)
            if len(found) == service_count + 1:
                sets.append(tuple(found))
        return sets

    def retention(self, service_count: int, retain: int) -> tuple[int, tuple[tuple[int, bytes], ...], list[int]]:
        """What keeping the newest ``retain`` snapshot sets means: ``(log position, patches,
        recording ids)``.

        The log position is the oldest retained set's: the log before it is needed by no
        recovery this file can plan (NULL_POSITION while there are fewer than ``retain`` sets:
        then the fallback past the newest sets is a replay from the log's start, so nothing of
        the log may go). The patches invalidate every valid snapshot entry before that position,
        and the recording ids are the snapshot recordings no valid entry names any more: the
        ones just invalidated and those of earlier invalid entries before that position (a
        removal a crash cut short). An entry invalidated after the oldest retained set (an
        operator's ``invalidate-latest-snapshot``) keeps its recording, to be looked at.

        The shell applies the patches (synced) before it asks the archive to remove anything,
        so that no valid entry ever names a removed recording."""
        if retain < 1:
            raise RecordingLogError(f"at least one snapshot set must be retained, got {retain}")
        sets = self.snapshot_sets(service_count)
        if len(sets) < retain:
            return NULL_POSITION, (), []
        floor = sets[retain - 1][0].log_position
        kinds = (ENTRY_TYPE_SNAPSHOT, ENTRY_TYPE_STANDBY_SNAPSHOT)
        gone = [e for e in self.entries if e.entry_type in kinds and e.log_position < floor]
        writes = self._invalidate(lambda e: e.entry_type in kinds and e.log_position < floor)
        kept = {e.recording_id for e in self.entries if e.is_valid and e.entry_type in kinds}
        recordings = sorted({e.recording_id for e in gone if e.recording_id != NULL_VALUE} - kept)
        return floor, tuple(writes), recordings

    # ------------------------------------------------------------------- offline rewrites

    @staticmethod
    def _order(e: Entry) -> tuple:
        # Term, then the TERM entry before the snapshots taken in it, by position, and at one
        # position the services (highest id first) before the consensus module (-1): the order
        # a member appends them in.
        position = e.term_base_log_position if e.entry_type == ENTRY_TYPE_TERM else e.log_position
        return (e.leadership_term_id, 0 if e.entry_type == ENTRY_TYPE_TERM else 1, position, -e.service_id)

    def sorted_copy(self) -> RecordingLog:
        """The same entries (invalid ones too) in the order a member appends them (see
        ``_order``); a file edited or merged by hand may hold them otherwise, and the queries
        that take "the newest" entry read the file from its end. Stable for equal keys."""
        return RecordingLog._of(sorted(self.entries, key=RecordingLog._order))

    def seeded_from_latest_snapshot(self, service_count: int) -> RecordingLog:
        """A log holding only what a start from the latest valid snapshot set needs: that set
        and the valid TERM entries of the log from its position on (the term it was taken in and
        every later one), in order. Every other entry (older snapshots and terms, invalid
        entries) is left out. RecordingLogError when there is no complete valid set."""
        sets = self.snapshot_sets(service_count)
        if not sets:
            raise RecordingLogError("no complete valid snapshot set to seed from")
        latest = sets[0]
        cm = latest[0]
        terms = [e for e in self.term_entries() if e.leadership_term_id >= cm.leadership_term_id]
        if not terms or terms[0].leadership_term_id != cm.leadership_term_id:
            raise RecordingLogError(
                f"no valid TERM entry for leadership term {cm.leadership_term_id}, in which the latest snapshot "
                f"(log position {cm.log_position}) was taken"
            )
        services = sorted(latest[1:], key=lambda e: -e.service_id)
        return RecordingLog._of(sorted([*terms, *services, cm], key=RecordingLog._order))

    def latest_snapshot_set_only(self, service_count: int) -> RecordingLog:
        """A log holding the latest valid snapshot set alone (no TERM entry: the log recording is
        dropped, and a start creates an empty one at the snapshot's position). RecordingLogError
        when there is no complete valid set."""
        sets = self.snapshot_sets(service_count)
        if not sets:
            raise RecordingLogError("no complete valid snapshot set to seed from")
        return RecordingLog._of(sorted(sets[0], key=RecordingLog._order))

    @classmethod
    def _of(cls, entries: list[Entry]) -> RecordingLog:
        log = cls()
        for e in entries:
            log._append(e)
        return log

    # ------------------------------------------------------------------------- recovery plan

    def create_recovery_plan(
        self,
        service_count: int,
        log_start_position: int,
        log_stop_position: int,
        log_recording_id: int = NULL_VALUE,
    ) -> RecoveryPlan:
        """Merge the entries with what the archive says of the log recording (its start and stop
        positions) into a plan: the latest complete snapshot set and the log's last term."""
        snapshots: list[Snapshot] = []
        for cm in reversed(self.entries):
            if not (
                cm.is_valid and cm.entry_type == ENTRY_TYPE_SNAPSHOT and cm.service_id == CONSENSUS_MODULE_SERVICE_ID
            ):
                continue
            found = [cm]
            for service_id in range(service_count):
                s = None
                for e in reversed(self.entries):
                    if (
                        e.is_valid
                        and e.entry_type == ENTRY_TYPE_SNAPSHOT
                        and e.service_id == service_id
                        and e.log_position == cm.log_position
                        and e.leadership_term_id == cm.leadership_term_id
                    ):
                        s = e
                        break
                if s is None:
                    break
                found.append(s)
            if len(found) == service_count + 1:
                snapshots = [
                    Snapshot(
                        e.recording_id,
                        e.leadership_term_id,
                        e.term_base_log_position,
                        e.log_position,
                        e.timestamp,
                        e.service_id,
                    )
                    for e in found
                ]
                break  # the newest complete set
        last = self.last_term()
        # Only a snapshot proves a position committed: a TERM's end says where the next term
        # began, not that a quorum had the log up to there.
        committed = snapshots[0].log_position if snapshots else 0
        if last is None:
            return RecoveryPlan(
                NULL_VALUE,
                0,
                log_stop_position,
                committed,
                log_recording_id,
                log_start_position,
                tuple(snapshots),
            )
        return RecoveryPlan(
            last.leadership_term_id,
            last.term_base_log_position,
            log_stop_position,
            committed,
            last.recording_id if log_recording_id == NULL_VALUE else log_recording_id,
            log_start_position,
            tuple(snapshots),
        )

    def __repr__(self) -> str:
        return f"RecordingLog({self.entries!r})"
