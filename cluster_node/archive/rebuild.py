"""Rebuild an archive's catalog from its segment files, for a catalog whose entries fail their
checksums (offline: ``cluster-node archive rebuild``).

A damaged catalog entry is never trusted by the archive (see ``cluster_node.archive.catalog``): the node
refuses to start. The segment files hold almost everything an entry says, so the entry is made
again from them:

==========================  ================================================================
recording id                the segment file names (``<id>-<base>.rec``)
start position              the first frame of the first segment file
stop position               the end of the well-formed frames of the last segment file
stream id, session id       the first frame's header
term length                 the term offsets and term ids of the first and last frames (the
                            damaged entry's value, or another recording's, when it agrees)
initial term id             the first frame's term id and position
segment file length         the file names and sizes (the damaged entry's or another
                            recording's value when it agrees, else the smallest that fits)
MTU                         the damaged entry's or another recording's when no frame is longer,
                            else the longest frame
frame checksums from        the first frame from which every frame's checksum matches
channels, timestamps, ids   the damaged entry when its body still decodes (they do not decide
                            anything the archive does), else another recording of the stream
==========================  ================================================================

Sound entries are kept as they are. The new catalog is written beside the old one and renamed
over it; the old file is kept as ``archive.catalog.damaged-<ns>``. Whatever the rebuild decided
is returned as lines for the operator. The data itself is not changed: ``archive verify`` then
says whether the segment files are sound.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.catalog_layout import (
    CATALOG_VERSION,
    DEFAULT_CAPACITY,
    CatalogError,
    RecordingDescriptor,
    RecordingState,
)
from cluster_node.archive.checksums import check_frames
from cluster_node.archive.segments import (
    DEFAULT_SEGMENT_LENGTH,
    FRAME_TYPE_DATA,
    HEADER_LENGTH,
    MAX_TERM_LENGTH,
    MIN_TERM_LENGTH,
    NULL_POSITION,
    align,
    parse_segment_file_name,
    scan_frames,
    segment_file_name,
    validate_segment_length,
)
from cluster_node.archive.storage import _fsync_dir
from cluster_node.media.private_files import create_new

__all__ = ["RebuildError", "RebuildResult", "rebuild_catalog"]

_HEADER = struct.Struct("<iBBHiiiiq")


class RebuildError(Exception):
    """The catalog cannot be rebuilt (the message says why)."""


@dataclass
class RebuildResult:
    rebuilt: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    old_catalog: Path | None = None


def _segment_ids(directory: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for name in os.listdir(directory):
        try:
            parsed = parse_segment_file_name(name)
        except ValueError:
            continue
        out.setdefault(parsed.recording_id, []).append(parsed.segment_base_position)
    return {rid: sorted(bases) for rid, bases in out.items()}


def _first_frame(data: bytes) -> int | None:
    """Offset of the first well-formed frame header in a segment file's bytes."""
    for off in range(0, len(data) - HEADER_LENGTH + 1, 32):
        flen, version, _f, ftype = struct.unpack_from("<iBBH", data, off)
        if flen >= HEADER_LENGTH and version == 0 and ftype <= FRAME_TYPE_DATA:
            return off
    return None


def _frames(data: bytes, offset: int, limit: int):
    pos = offset
    while pos + HEADER_LENGTH <= limit:
        header = _HEADER.unpack_from(data, pos)
        if header[0] < HEADER_LENGTH:
            return
        yield pos, header
        pos += align(header[0])


def _wrap_i32(n: int) -> int:
    return (n + (1 << 31)) % (1 << 32) - (1 << 31)


def _reconstruct(
    directory: Path,
    rid: int,
    bases: list[int],
    hint: RecordingDescriptor | None,
    peers: list[RecordingDescriptor],
    notes: list[str],
) -> RecordingDescriptor:
    if hint is not None and hint.start_position in bases:
        # The entry's front was detached or purged to this segment base: files before it (left
        # by a detach, or by a purge a crash cut short) are not part of the recording.
        bases = [b for b in bases if b >= hint.start_position]
    files = {b: (directory / segment_file_name(rid, b)).read_bytes() for b in bases}
    base0 = bases[0]
    first = _first_frame(files[base0])
    if first is None:
        raise RebuildError(f"recording {rid}: no frame in {segment_file_name(rid, base0)}: nothing to rebuild from")
    start = base0 + first
    h0 = _HEADER.unpack_from(files[base0], first)
    _flen, _v, _fl, _t, term_offset0, session_id, stream_id, term_id0, _rv = h0
    last_base = bases[-1]
    last_data = files[last_base]
    last_first = first if last_base == base0 else 0
    frames_last = list(_frames(last_data, last_first, len(last_data)))
    probe = frames_last[-1] if frames_last else (first, h0)
    probe_position = last_base + probe[0] if frames_last else start
    probe_term_offset, probe_term_id = probe[1][4], probe[1][7]

    candidates = [x for x in ([hint.term_buffer_length] if hint else []) + [p.term_buffer_length for p in peers]]
    t = MIN_TERM_LENGTH
    while t <= MAX_TERM_LENGTH:
        candidates.append(t)
        t *= 2
    term_length = None
    for tl in candidates:
        if tl <= 0 or tl & (tl - 1) or not MIN_TERM_LENGTH <= tl <= MAX_TERM_LENGTH:
            continue
        if start & (tl - 1) != term_offset0 or probe_position & (tl - 1) != probe_term_offset:
            continue
        if _wrap_i32(probe_term_id - term_id0) != (probe_position // tl) - (start // tl):
            continue
        term_length = tl
        break
    if term_length is None:
        raise RebuildError(f"recording {rid}: no term length fits its frames' term offsets and term ids")
    initial_term_id = _wrap_i32(term_id0 - start // term_length)
    start_term_base = start - (start & (term_length - 1))
    if start_term_base != base0:
        raise RebuildError(f"recording {rid}: its first segment file does not start on its first term")

    sizes = [len(files[b]) for b in bases]
    seg_candidates = ([hint.segment_file_length] if hint else []) + [p.segment_file_length for p in peers]
    seg_candidates += [DEFAULT_SEGMENT_LENGTH] + [term_length << k for k in range(0, 15)]
    segment_length = None
    for seg in seg_candidates:
        try:
            validate_segment_length(seg, term_length)
        except ValueError:
            continue
        if any(size > seg for size in sizes):
            continue
        if any((b - base0) % seg for b in bases) or any(b2 - b1 != seg for b1, b2 in zip(bases, bases[1:])):
            continue
        segment_length = seg
        break
    if segment_length is None:
        raise RebuildError(f"recording {rid}: no segment length fits its segment files")

    stop = last_base + scan_frames(last_data, last_first, len(last_data), term_length=term_length, stream_id=stream_id)
    longest = 0
    checksums_from = NULL_POSITION
    for b in bases:
        data = files[b]
        off = first if b == base0 else 0
        limit = stop - b if b == last_base else len(data)
        for pos, header in _frames(data, off, limit):
            if header[3] == FRAME_TYPE_DATA:
                longest = max(longest, header[0])
            end = pos + (align(header[0]) if header[3] == FRAME_TYPE_DATA else HEADER_LENGTH)
            ok = end <= len(data) and check_frames(data, pos, end) < 0
            if ok and checksums_from == NULL_POSITION:
                checksums_from = b + pos
            elif not ok:
                checksums_from = NULL_POSITION
    mtu_candidates = ([hint.mtu_length] if hint else []) + [p.mtu_length for p in peers]
    mtu = next((m for m in mtu_candidates if longest <= m <= 65504), max(1408, align(longest)))

    same_stream = next((p for p in peers if p.stream_id == stream_id), None)
    source = hint or same_stream
    mtimes = [int((directory / segment_file_name(rid, b)).stat().st_mtime_ns) for b in (base0, last_base)]
    d = RecordingDescriptor(
        control_session_id=source.control_session_id if source else 0,
        correlation_id=source.correlation_id if source else 0,
        recording_id=rid,
        start_timestamp=hint.start_timestamp if hint else mtimes[0],
        stop_timestamp=hint.stop_timestamp if hint and hint.stop_timestamp >= 0 else mtimes[1],
        start_position=start,
        stop_position=stop,
        initial_term_id=initial_term_id,
        segment_file_length=segment_length,
        term_buffer_length=term_length,
        mtu_length=mtu,
        session_id=session_id,
        stream_id=stream_id,
        stripped_channel=source.stripped_channel if source else "",
        original_channel=source.original_channel if source else "",
        source_identity=source.source_identity if source else "",
        frame_checksums_from=checksums_from,
    )
    if hint is not None:
        changed = [
            name
            for name in d.__struct_fields__
            if name != "frame_checksums_from" and getattr(hint, name) != getattr(d, name)
        ]
        if changed:
            notes.append(
                f"recording {rid}: from the segment files, unlike the damaged entry: "
                + ", ".join(f"{n} {getattr(hint, n)} -> {getattr(d, n)}" for n in changed)
            )
    else:
        notes.append(
            f"recording {rid}: no readable entry: channels and ids "
            + ("from recording " + str(same_stream.recording_id) if same_stream else "left empty")
        )
    return d


def rebuild_catalog(directory: Path) -> RebuildResult:
    """Rebuild ``directory``'s catalog (see the module docstring). The caller holds the
    directory's lock: no archive may run on it."""
    directory = Path(directory)
    path = directory / "archive.catalog"
    result = RebuildResult()
    old: Catalog | None = None
    capacity = DEFAULT_CAPACITY
    if path.exists():
        data = path.read_bytes()
        capacity = max(capacity, len(data))
        try:
            old = Catalog.from_bytes(data, strict=False)
        except CatalogError as e:
            result.notes.append(f"catalog header unreadable ({e}): every recording is rebuilt from its segment files")
    segments = _segment_ids(directory)
    sound: dict[int, tuple[RecordingDescriptor, RecordingState]] = {}
    hints: list[RecordingDescriptor] = []
    next_id = 0
    if old is not None:
        for d, state in old.all_records():
            sound[d.recording_id] = (d, state)
        hints = [dr.hint for dr in old.damaged if dr.hint is not None]
        next_id = old.next_recording_id
    missing = sorted(set(segments) - set(sound))
    if old is not None and not old.damaged and not missing:
        result.kept = sorted(sound)
        result.notes.append(
            "every catalog entry is sound and every recording with segment files has one: nothing to rebuild"
        )
        return result
    unmatched = [h for h in hints if h.recording_id not in sound and h.recording_id not in segments]
    peers = [sound[r][0] for r in sorted(sound) if sound[r][1] == RecordingState.VALID]
    rebuilt: dict[int, RecordingDescriptor] = {}
    for rid in missing:
        hint = next((h for h in hints if h.recording_id == rid), None)
        if (
            hint is None
            and len(unmatched) == 1
            and len([r for r in missing if not any(h.recording_id == r for h in hints)]) == 1
        ):
            hint = unmatched.pop()  # its recording id is what was damaged
            result.notes.append(
                f"recording {rid}: the damaged entry that read as recording {hint.recording_id} is its entry"
            )
        rebuilt[rid] = _reconstruct(directory, rid, segments[rid], hint, peers, result.notes)
    for h in hints:
        if h.recording_id not in sound and h.recording_id not in rebuilt and h in unmatched:
            result.notes.append(
                f"a damaged entry reading as recording {h.recording_id} has no segment files: "
                "its id stays reserved, as a deleted recording"
            )
    new = Catalog.create(capacity)
    ids = sorted(set(sound) | set(rebuilt))
    for rid in ids:
        if rid in sound:
            d, state = sound[rid]
            result.kept.append(rid)
        else:
            d, state = rebuilt[rid], RecordingState.VALID
            result.rebuilt.append(rid)
        _add(new, d, state)
    for h in unmatched:
        if h.recording_id not in ids and h.recording_id >= 0:
            _add(new, msgspec_replace(h, stop_position=h.start_position), RecordingState.DELETED)
    highest = max([next_id - 1, *ids, *(h.recording_id for h in hints)], default=-1)
    new.set_next_recording_id(max(next_id, highest + 1))
    assert new.version == CATALOG_VERSION
    tmp = directory / "archive.catalog.rebuild"
    fd = create_new(tmp)  # 0600, never through a link (the archive's own files are private)
    try:
        os.write(fd, new.to_bytes())
        os.fsync(fd)
    finally:
        os.close(fd)
    if path.exists():
        kept = directory / f"archive.catalog.damaged-{time.time_ns()}"
        os.replace(path, kept)
        result.old_catalog = kept
    os.replace(tmp, path)
    _fsync_dir(directory)
    return result


def msgspec_replace(d: RecordingDescriptor, **changes) -> RecordingDescriptor:
    import msgspec

    return msgspec.structs.replace(d, **changes)


def _add(catalog: Catalog, d: RecordingDescriptor, state: RecordingState) -> None:
    catalog.add_recording(
        control_session_id=d.control_session_id,
        correlation_id=d.correlation_id,
        start_timestamp=d.start_timestamp,
        start_position=d.start_position,
        initial_term_id=d.initial_term_id,
        segment_file_length=d.segment_file_length,
        term_buffer_length=d.term_buffer_length,
        mtu_length=d.mtu_length,
        session_id=d.session_id,
        stream_id=d.stream_id,
        stripped_channel=d.stripped_channel,
        original_channel=d.original_channel,
        source_identity=d.source_identity,
        stop_position=d.stop_position,
        stop_timestamp=d.stop_timestamp,
        grow=True,
        recording_id=d.recording_id,
        state=state,
        frame_checksums_from=d.frame_checksums_from,
    )
