"""Crash recovery of the archive's files: reconcile the catalog with the segment files on open.

Apart from the segment writer and reader (``cluster_node.archive.storage``) because it runs once, when the
archive opens its directory, and decides what of the disk's contents is kept.

Crash recovery (:func:`recover`), run when the archive opens its directory:

1. load the catalog, every record's checksum checked (:func:`load_catalog`): a record that fails
   is never used, the archive refuses to open (:class:`ArchiveDamagedError`, naming the
   recording and ``cluster-node archive rebuild``), since its stop position or stream id could
   make step 3 cut committed data;
2. for every VALID recording, find the end of its data: the last segment file, scanned from its
   first frame to the first frame that is not complete, well formed and (where the recording has
   them) matching its checksum (:func:`scan_tail`);
3. what follows that end must be what a crash leaves: zeros up to the stop position (writes that
   never reached the disk), or for an active recording one torn frame then zeros; anything else
   is damage and the archive refuses to open, before anything is cut. Otherwise an active
   recording (no stop position: the archive died recording it) gets the recovered end as its
   stop position; a stopped one whose data ends early (lost page cache at sync level 0) is cut
   back to it; data beyond the stop position (a torn tail, or a truncation cut short) is
   removed: the file holding the stop is truncated there and later files are deleted.

Ordering of the writes that must survive: a truncation updates the catalog first, then removes
data; a new recording is in the catalog before its first segment byte; the stop position is
written after the last segment write. So whichever write a crash interrupts, step 3 repairs it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cluster_node.archive.catalog_layout import RecordingDescriptor
from cluster_node.archive.checksums import check_frames
from cluster_node.archive.segment_files import truncate_segments
from cluster_node.archive.segments import (
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    NULL_POSITION,
    align,
    scan_frames,
    segment_base_position,
    segment_file_name,
)
from cluster_node.archive.storage import _HEADER, ArchiveDamagedError, CatalogStore, list_segments

__all__ = ["TailScan", "scan_tail", "recovered_end", "damage_line", "why_frame_is_bad", "Repair", "recover"]


def why_frame_is_bad(data: bytes, offset: int, position: int, d: RecordingDescriptor, limit: int) -> str:
    if offset + HEADER_LENGTH > len(data):
        return "frame header runs past the end of the data"
    flen, version, _flags, ftype, toff, _sid, stid, _tid, _rv = _HEADER.unpack_from(data, offset)
    if flen == 0:
        return "frame length is 0 (no data where the recording says there is)"
    if flen < HEADER_LENGTH:
        return f"frame length {flen} is shorter than the header"
    if version != 0:
        return f"frame version {version} is not 0"
    if ftype not in (FRAME_TYPE_DATA, FRAME_TYPE_PAD):
        return f"frame type {ftype} is neither DATA nor PAD"
    expected = position & (d.term_buffer_length - 1)
    if toff != expected:
        return f"term offset {toff} does not match the position (expected {expected})"
    if stid != d.stream_id:
        return f"stream id {stid} differs from the recording's {d.stream_id}"
    if offset + align(flen) > limit:
        return f"frame of length {flen} runs past the end of the recording"
    return "frame crosses a term boundary"


class TailScan(NamedTuple):
    """What a scan of a recording's last segment file found."""

    end: int
    """Position where its good frames end (complete, well formed, checksums matching)."""
    damage: str | None = None
    """Why the bytes after ``end`` are not a tail torn by a crash (None: they are, or there are none)."""


def scan_tail(directory: Path, descriptor: RecordingDescriptor) -> TailScan:
    """Where the good frames of a recording end, by scanning its last segment file, and whether
    what follows them may be cut.

    A crash leaves at most one partly written frame after the last good one, then zeros (a write
    never leaves bytes after ones it did not write); the lost page cache of an OS crash at sync
    level 0 leaves zeros. So the bytes after ``end`` are cut only when they are:

    * a stopped recording (its stop position in the catalog): zeros up to the stop position (the
      last writes never reached the disk; data beyond the stop position is never data);
    * an active one (the archive stopped while recording): zeros beyond one frame (``mtu``).

    Anything else (a frame that fails its checksum with data after it, a broken frame before data)
    is damage: :attr:`TailScan.damage` says what and where, and nothing is cut.
    """
    d = descriptor
    bases = list_segments(directory, d.recording_id)
    start_base = segment_base_position(d.start_position, d.start_position, d.term_buffer_length, d.segment_file_length)
    bases = [b for b in bases if b >= start_base]
    if not bases:
        return TailScan(d.start_position)
    last = bases[-1]
    path = Path(directory) / segment_file_name(d.recording_id, last)
    data = bytearray(path.read_bytes()[: d.segment_file_length])
    first = d.start_position - last if last == start_base else 0
    first = max(0, first)
    if first > len(data):
        return TailScan(last + first if last == start_base else last)
    end = scan_frames(data, first, len(data), term_length=d.term_buffer_length, stream_id=d.stream_id)
    why = None
    if d.frame_checksums_from != NULL_POSITION:
        checked_from = max(first, d.frame_checksums_from - last)
        if checked_from < end:
            mask = d.term_buffer_length - 1
            bad = check_frames(bytearray(data), checked_from, end, checked_from & mask, d.term_buffer_length)
            if bad >= 0:
                end, why = bad, "frame fails its checksum"
    if d.stop_position != NULL_POSITION:
        if last + end >= d.stop_position:
            return TailScan(last + end)
        rest_from, rest_to = end, min(len(data), d.stop_position - last)
        allowance = "data up to the stop position"
    else:
        rest_from, rest_to = min(len(data), end + align(max(d.mtu_length, HEADER_LENGTH))), len(data)
        allowance = "data after it"
    rest = data[rest_from:rest_to]
    if rest.count(0) != len(rest):
        if why is None:
            why = (
                why_frame_is_bad(data, end, last + end, d, len(data))
                if end + HEADER_LENGTH <= len(data)
                else "frame is cut short"
            )
        return TailScan(last + end, f"{why}, with {allowance}")
    return TailScan(last + end)


def recovered_end(directory: Path, descriptor: RecordingDescriptor) -> int:
    """Where the good frames of a recording end, by scanning its last segment file."""
    return scan_tail(directory, descriptor).end


def damage_line(directory: Path, recording_id: int, position: int, why: str) -> str:
    """The one line that reports damaged recorded data, with what the operator can do."""
    return (
        f"recording {recording_id} in {directory} is damaged at position {position}: {why}; it is not used. "
        f"Replace this member's archive with a copy from a member whose `cluster-node archive verify` "
        f"passes, or, if the other members hold the log, cut it there (cluster-node archive truncate "
        f"--dir {directory} {recording_id} {position}) and the member catches up from them"
    )


@dataclass(frozen=True)
class Repair:
    """One change recovery made, for the log."""

    recording_id: int
    what: str
    old_stop_position: int
    new_stop_position: int


def recover(directory: Path, store: CatalogStore, now_ns: int | None = None) -> list[Repair]:
    """Reconcile the catalog with the segment files after a crash (see the module docstring).

    Damage (:func:`scan_tail`) raises :class:`ArchiveDamagedError` before anything is cut."""
    catalog = store.catalog
    now_ns = time.time_ns() if now_ns is None else now_ns
    repairs: list[Repair] = []
    scans = {}
    for d in catalog:
        scan = scan_tail(directory, d)
        if scan.damage is not None:
            raise ArchiveDamagedError(damage_line(directory, d.recording_id, scan.end, scan.damage))
        scans[d.recording_id] = scan
    for d in list(catalog):
        end = scans[d.recording_id].end
        if d.stop_position == NULL_POSITION:
            catalog.update_recording_stopped(d.recording_id, end, now_ns)
            repairs.append(Repair(d.recording_id, "active at crash: stop position recovered", NULL_POSITION, end))
            stop = end
        elif end < d.stop_position:
            catalog.update_recording_stopped(d.recording_id, end, d.stop_timestamp)
            repairs.append(
                Repair(
                    d.recording_id,
                    "data ends before the stop position (zeros from there: writes lost before they reached the disk)",
                    d.stop_position,
                    end,
                )
            )
            stop = end
        else:
            stop = d.stop_position
            if end > stop:
                repairs.append(Repair(d.recording_id, "data beyond the stop position removed", stop, stop))
        store.flush()
        truncate_segments(directory, d, stop, store.sync_level)
    return repairs
