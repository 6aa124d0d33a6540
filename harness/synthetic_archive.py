"""Synthetic node archives holding a cluster's replicated log, laid out byte for byte as the archive
lays them out, for the data pipeline's tests and benchmark.

:func:`build_log` writes one replicated log (stream 100) the way a leader's log publication
would: 32-byte data frame headers with the term id and term offset of each position, frames
32-byte aligned, a padding frame closing a transport term when the next message does not fit,
messages longer than ``mtu - 32`` split into B/.../E fragments, one continuous position across
leadership terms (each term's leader publishes with its own session id from the term's base
position on). Its messages are encoded with the cluster codecs: every leadership term starts with
a NewLeadershipTermEvent; clients' sessions open (SessionOpenEvent), send session messages and
close (SessionCloseEvent, client action or timeout), some stay open across an election; timers
fire (TimerEvent); services send messages of their own (negative cluster session ids); one
ClusterActionRequest asks for a snapshot. Everything is seeded.

:func:`write_archive` writes one node directory: ``archive/archive.catalog`` (through
``cluster_node.archive.catalog``) with the log recording and a small consensus-module snapshot recording on
stream 107 (which log readers must skip), and the segment files ``<recording_id>-<base>.rec``
holding the raw stream at ``position - base``. Padding frames are written header-only with the
rest of the term a hole of zeros, as the archive does. :func:`write_cluster` writes the nodes of a
cluster, optionally with one byte of one node changed (``diverge``) or a node holding only a
prefix of the log (``cut_short``), and says what a correct audit must find.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.segments import (
    FRAME_FLAG_BEGIN,
    FRAME_FLAG_END,
    FRAME_TYPE_DATA,
    FRAME_TYPE_PAD,
    HEADER_LENGTH,
    align,
    segment_file_name,
    segments_for_range,
    validate_segment_length,
)
from cluster_node.codecs import (
    LOG_CODEC,
    SNAPSHOT_CODEC,
    SNAPSHOT_TYPE_ID_CONSENSUS_MODULE,
    CloseReason,
    ClusterAction,
    ClusterActionRequest,
    ClusterTimeUnit,
    NewLeadershipTermEvent,
    SessionCloseEvent,
    SessionOpenEvent,
    SnapshotMark,
    SnapshotMarker,
    TimerEvent,
    encode_session_message,
)

__all__ = [
    "LOG_STREAM_ID",
    "SNAPSHOT_STREAM_ID",
    "Entry",
    "SessionInfo",
    "SyntheticCluster",
    "SyntheticLog",
    "TermInfo",
    "build_log",
    "build_uniform_log",
    "write_archive",
    "write_cluster",
]

LOG_STREAM_ID = 100
SNAPSHOT_STREAM_ID = 107
DEFAULT_TERM_LENGTH = 64 * 1024
DEFAULT_SEGMENT_LENGTH = 256 * 1024
DEFAULT_MTU = 1408
START_TIMESTAMP_NS = 1_700_000_000_000_000_000
_HEADER = struct.Struct("<iBBHiiiiq")
_NS_PER_UNIT = {ClusterTimeUnit.MILLIS: 1_000_000, ClusterTimeUnit.MICROS: 1_000, ClusterTimeUnit.NANOS: 1}


@dataclass(frozen=True)
class Entry:
    """One message of the log, as a correct reader must report it."""

    position: int
    frame_length: int
    """Recorded bytes from the first frame header to the end of the last frame (no trailing pad)."""
    fragments: int
    session_id: int
    """Transport session id: the log publication of the leader of the message's term."""
    leadership_term_id: int
    template_id: int
    message_type: str
    cluster_session_id: int | None
    timestamp: int
    message: bytes

    @property
    def end_position(self) -> int:
        return self.position + align(self.frame_length)


@dataclass
class TermInfo:
    leadership_term_id: int
    leader_member_id: int
    base_position: int
    log_session_id: int
    timestamp: int
    end_position: int = -1
    messages: int = 0
    """Every message of the term, the NewLeadershipTermEvent included."""
    session_messages: int = 0


@dataclass
class SessionInfo:
    cluster_session_id: int
    open_timestamp: int | None
    open_term: int | None
    close_timestamp: int | None = None
    close_reason: str | None = None
    messages: int = 0


@dataclass
class SyntheticLog:
    data: bytearray
    """The stream's bytes from position 0 to ``end_position`` (padding bodies are zeros)."""
    entries: list[Entry]
    terms: list[TermInfo]
    sessions: dict[int, SessionInfo]
    term_length: int
    mtu: int
    time_unit: ClusterTimeUnit
    initial_term_id: int = 0

    @property
    def end_position(self) -> int:
        return len(self.data)

    def entries_before(self, position: int) -> list[Entry]:
        return [e for e in self.entries if e.end_position <= position]

    def message_boundary_at_or_before(self, position: int) -> int:
        """End of the last message that ends at or before ``position`` (0 if none)."""
        end = 0
        for e in self.entries:
            if e.end_position > position:
                break
            end = e.end_position
        return end

    def payload_byte_position(self, entry: Entry, offset: int = 0) -> int:
        """Stream position of byte ``offset`` of an unfragmented entry's message (inside its frame)."""
        if entry.fragments != 1:
            raise ValueError("pick an unfragmented entry")
        return entry.position + HEADER_LENGTH + offset


class _LogWriter:
    def __init__(self, term_length: int, mtu: int, initial_term_id: int, stream_id: int) -> None:
        self.term_length = term_length
        self.mtu = mtu
        self.initial_term_id = initial_term_id
        self.stream_id = stream_id
        self.data = bytearray()
        self.max_message = min(term_length // 8, 16 * 1024 * 1024)

    @property
    def position(self) -> int:
        return len(self.data)

    def _header(self, frame_length: int, flags: int, frame_type: int, session_id: int, position: int) -> bytes:
        term_offset = position % self.term_length
        term_id = self.initial_term_id + position // self.term_length
        return _HEADER.pack(frame_length, 0, flags, frame_type, term_offset, session_id, self.stream_id, term_id, 0)

    def append(self, message: bytes, session_id: int) -> tuple[int, int, int]:
        """Append one message; return (position, frame_length span, fragments)."""
        if len(message) > self.max_message:
            raise ValueError(f"message of {len(message)} bytes exceeds {self.max_message}")
        chunk = self.mtu - HEADER_LENGTH
        chunks = [message[i : i + chunk] for i in range(0, len(message), chunk)] or [b""]
        required = sum(align(HEADER_LENGTH + len(c)) for c in chunks)
        term_offset = self.position % self.term_length
        if term_offset + required > self.term_length:
            pad = self.term_length - term_offset
            self.data += self._header(pad, FRAME_FLAG_BEGIN | FRAME_FLAG_END, FRAME_TYPE_PAD, session_id, self.position)
            self.data += bytes(pad - HEADER_LENGTH)
        start = self.position
        for i, c in enumerate(chunks):
            flags = (FRAME_FLAG_BEGIN if i == 0 else 0) | (FRAME_FLAG_END if i == len(chunks) - 1 else 0)
            frame_length = HEADER_LENGTH + len(c)
            self.data += self._header(frame_length, flags, FRAME_TYPE_DATA, session_id, self.position)
            self.data += c
            self.data += bytes(align(frame_length) - frame_length)
        last_frame_length = HEADER_LENGTH + len(chunks[-1])
        span = self.position - start - align(last_frame_length) + last_frame_length
        return start, span, len(chunks)


def build_log(
    *,
    seed: int = 1,
    terms: int = 3,
    messages_per_term: int = 300,
    sessions_per_term: int = 3,
    term_length: int = DEFAULT_TERM_LENGTH,
    mtu: int = DEFAULT_MTU,
    time_unit: ClusterTimeUnit = ClusterTimeUnit.NANOS,
    leaders: list[int] | None = None,
    large_every: int = 41,
    timer_every: int = 53,
    service_every: int = 67,
    seconds_per_term: float = 3.0,
    election_seconds: float = 1.5,
) -> SyntheticLog:
    """A log of ``terms`` leadership terms, each ~``messages_per_term`` messages long."""
    rng = random.Random(seed)
    writer = _LogWriter(term_length, mtu, 0, LOG_STREAM_ID)
    leaders = leaders or [t % 3 for t in range(terms)]
    unit_ns = _NS_PER_UNIT[time_unit]
    now_ns = START_TIMESTAMP_NS
    entries: list[Entry] = []
    term_infos: list[TermInfo] = []
    sessions: dict[int, SessionInfo] = {}
    open_sessions: list[int] = []
    next_session_id = 1
    next_correlation_id = 1000
    service_session_id = -1
    mean_gap_ns = int(seconds_per_term * 1e9 / max(1, messages_per_term))

    def ts() -> int:
        return now_ns // unit_ns

    def add(message: bytes, term: TermInfo, template_id: int, message_type: str, cluster_session_id, timestamp) -> None:
        position, span, fragments = writer.append(message, term.log_session_id)
        entries.append(
            Entry(
                position,
                span,
                fragments,
                term.log_session_id,
                term.leadership_term_id,
                template_id,
                message_type,
                cluster_session_id,
                timestamp,
                message,
            )
        )
        term.messages += 1

    for t in range(terms):
        if t:
            now_ns += int(election_seconds * 1e9)
        term = TermInfo(t, leaders[t], writer.position, 1000 + 17 * t + rng.randrange(10), ts())
        term_infos.append(term)
        add(
            LOG_CODEC.encode(
                NewLeadershipTermEvent(
                    t, writer.position, ts(), writer.position, term.leader_member_id, term.log_session_id, time_unit, 1
                )
            ),
            term,
            24,
            "NewLeadershipTermEvent",
            None,
            ts(),
        )
        for _ in range(sessions_per_term):
            cluster_session_id = next_session_id
            next_session_id += 1
            next_correlation_id += 1
            now_ns += rng.randrange(1, mean_gap_ns + 2)
            add(
                LOG_CODEC.encode(
                    SessionOpenEvent(
                        t,
                        next_correlation_id,
                        cluster_session_id,
                        ts(),
                        102,
                        f"aeron:udp?endpoint=127.0.0.1:{19000 + cluster_session_id}",
                    )
                ),
                term,
                21,
                "SessionOpenEvent",
                cluster_session_id,
                ts(),
            )
            sessions[cluster_session_id] = SessionInfo(cluster_session_id, ts(), t)
            open_sessions.append(cluster_session_id)
        if t == 1:
            now_ns += rng.randrange(1, mean_gap_ns + 2)
            add(
                LOG_CODEC.encode(ClusterActionRequest(t, writer.position, ts(), ClusterAction.SNAPSHOT)),
                term,
                23,
                "ClusterActionRequest",
                None,
                ts(),
            )
        budget = messages_per_term - term.messages - 2
        for i in range(max(0, budget)):
            now_ns += rng.randrange(1, 2 * mean_gap_ns + 2)
            if timer_every and i % timer_every == timer_every - 1:
                next_correlation_id += 1
                add(LOG_CODEC.encode(TimerEvent(t, next_correlation_id, ts())), term, 20, "TimerEvent", None, ts())
                continue
            if service_every and i % service_every == service_every - 1:
                sid = service_session_id
                service_session_id -= 1
            else:
                sid = rng.choice(open_sessions)
            size = (
                rng.randrange(2500, 5000)
                if large_every and i % large_every == large_every - 1
                else rng.randrange(0, 200)
            )
            payload = rng.randbytes(size)
            add(encode_session_message(t, sid, ts(), payload), term, 1, "SessionMessage", sid, ts())
            term.session_messages += 1
            info = sessions.get(sid)
            if info is None:
                info = sessions[sid] = SessionInfo(sid, None, None)
            info.messages += 1
        # Close some sessions at the end of the term; one (the newest) stays open across the election.
        for cluster_session_id in list(open_sessions[:-1]):
            now_ns += rng.randrange(1, mean_gap_ns + 2)
            reason = CloseReason.CLIENT_ACTION if cluster_session_id % 2 else CloseReason.TIMEOUT
            add(
                LOG_CODEC.encode(SessionCloseEvent(t, cluster_session_id, ts(), reason)),
                term,
                22,
                "SessionCloseEvent",
                cluster_session_id,
                ts(),
            )
            sessions[cluster_session_id].close_timestamp = ts()
            sessions[cluster_session_id].close_reason = reason.name
            open_sessions.remove(cluster_session_id)
        term.end_position = writer.position
    return SyntheticLog(writer.data, entries, term_infos, sessions, term_length, mtu, time_unit)


def build_uniform_log(
    messages: int, *, payload_length: int = 64, term_length: int = 4 * 1024 * 1024, seed: int = 7
) -> SyntheticLog:
    """A large log fast (for benchmarks): one term, one NewLeadershipTermEvent, one session, then
    ``messages - 2`` session messages of ``payload_length`` bytes. Entries are not kept."""
    rng = random.Random(seed)
    writer = _LogWriter(term_length, DEFAULT_MTU, 0, LOG_STREAM_ID)
    term = TermInfo(0, 0, 0, 4242, START_TIMESTAMP_NS)
    writer.append(
        LOG_CODEC.encode(
            NewLeadershipTermEvent(0, 0, START_TIMESTAMP_NS, 0, 0, term.log_session_id, ClusterTimeUnit.NANOS, 1)
        ),
        term.log_session_id,
    )
    writer.append(
        LOG_CODEC.encode(SessionOpenEvent(0, 1, 1, START_TIMESTAMP_NS, 102, "aeron:udp?endpoint=127.0.0.1:19001")),
        term.log_session_id,
    )
    payload = rng.randbytes(payload_length)
    frame_length = HEADER_LENGTH + 32 + payload_length
    aligned = align(frame_length)
    header = _HEADER.pack
    data = writer.data
    zeros = bytes(aligned - frame_length)
    ts = START_TIMESTAMP_NS
    remaining = messages - 2
    while remaining > 0:
        position = len(data)
        term_offset = position % term_length
        term_id = position // term_length
        if term_offset + aligned > term_length:
            pad = term_length - term_offset
            data += header(pad, 0, 0xC0, FRAME_TYPE_PAD, term_offset, term.log_session_id, LOG_STREAM_ID, term_id, 0)
            data += bytes(pad - HEADER_LENGTH)
            continue
        count = min(remaining, (term_length - term_offset) // aligned)
        parts = []
        for k in range(count):
            ts += 1000
            parts.append(
                header(
                    frame_length,
                    0,
                    0xC0,
                    FRAME_TYPE_DATA,
                    term_offset + k * aligned,
                    term.log_session_id,
                    LOG_STREAM_ID,
                    term_id,
                    0,
                )
            )
            parts.append(encode_session_message(0, 1, ts, payload))
            parts.append(zeros)
        data += b"".join(parts)
        remaining -= count
    term.end_position = len(data)
    term.messages = messages
    return SyntheticLog(data, [], [term], {}, term_length, DEFAULT_MTU, ClusterTimeUnit.NANOS)


def _snapshot_recording_bytes(term_length: int) -> bytes:
    w = _LogWriter(term_length, DEFAULT_MTU, 5, SNAPSHOT_STREAM_ID)
    for mark in (SnapshotMark.BEGIN, SnapshotMark.END):
        w.append(
            SNAPSHOT_CODEC.encode(
                SnapshotMarker(SNAPSHOT_TYPE_ID_CONSENSUS_MODULE, 4096, 1, 0, mark, ClusterTimeUnit.NANOS, 1)
            ),
            77,
        )
    return bytes(w.data)


def write_archive(
    node_dir: str | Path,
    log: SyntheticLog,
    *,
    stop_position: int | None = None,
    segment_length: int = DEFAULT_SEGMENT_LENGTH,
    flip_byte_at: int | None = None,
    with_snapshot_recording: bool = True,
    active: bool = False,
) -> Path:
    """Write ``node_dir/archive/`` holding ``log[0:stop_position]`` as recording 0 on stream 100.

    ``flip_byte_at``: a stream position whose byte is inverted in this node's copy. ``active``:
    leave the recording without a stop position (as if the node were still recording).
    """
    validate_segment_length(segment_length, log.term_length)
    stop = log.end_position if stop_position is None else stop_position
    archive_dir = Path(node_dir) / "archive"
    archive_dir.mkdir(parents=True, exist_ok=True)
    catalog = Catalog.create(capacity=64 * 1024)
    common = dict(
        control_session_id=1,
        mtu_length=log.mtu,
        stripped_channel="aeron:udp?endpoint=127.0.0.1:20330",
        original_channel="aeron:udp?endpoint=127.0.0.1:20330|term-length=64k",
        source_identity="127.0.0.1:20330",
    )
    log_recording_id = catalog.add_recording(
        correlation_id=11,
        start_timestamp=START_TIMESTAMP_NS,
        start_position=0,
        initial_term_id=log.initial_term_id,
        segment_file_length=segment_length,
        term_buffer_length=log.term_length,
        session_id=log.terms[0].log_session_id,
        stream_id=LOG_STREAM_ID,
        stop_position=-1 if active else stop,
        stop_timestamp=-1 if active else START_TIMESTAMP_NS + 10**10,
        **common,
    )
    data = log.data[:stop]
    if flip_byte_at is not None:
        if not 0 <= flip_byte_at < stop:
            raise ValueError(f"byte {flip_byte_at} is not in [0, {stop})")
        data = bytearray(data)
        data[flip_byte_at] ^= 0xFF
    _write_segments(archive_dir, log_recording_id, data, 0, stop, log.term_length, segment_length)
    if with_snapshot_recording:
        snapshot = _snapshot_recording_bytes(log.term_length)
        snapshot_id = catalog.add_recording(
            correlation_id=12,
            start_timestamp=START_TIMESTAMP_NS,
            start_position=0,
            initial_term_id=5,
            segment_file_length=segment_length,
            term_buffer_length=log.term_length,
            session_id=77,
            stream_id=SNAPSHOT_STREAM_ID,
            stop_position=len(snapshot),
            stop_timestamp=START_TIMESTAMP_NS + 1,
            **common,
        )
        _write_segments(archive_dir, snapshot_id, snapshot, 0, len(snapshot), log.term_length, segment_length)
    (archive_dir / "archive.catalog").write_bytes(catalog.to_bytes())
    return archive_dir


def _write_segments(
    directory: Path,
    recording_id: int,
    data: bytes | bytearray,
    start: int,
    stop: int,
    term_length: int,
    segment_length: int,
) -> None:
    for base in segments_for_range(start, start, stop, term_length, segment_length):
        end = min(stop, base + segment_length)
        (directory / segment_file_name(recording_id, base)).write_bytes(data[base:end])


@dataclass
class SyntheticCluster:
    log: SyntheticLog
    node_dirs: list[Path]
    held_positions: list[int]
    """Per node: the end of the last message it holds."""
    committed_position: int
    """The majority-held position: what a correct audit reports as committed."""
    diverged: tuple[int, int] | None = None
    """(node index, stream position) of the changed byte, if any."""
    divergent_entry: Entry | None = None
    extra: dict = field(default_factory=dict)

    def committed_length(self, node: int) -> int:
        return min(self.held_positions[node], self.committed_position)


def write_cluster(
    root: str | Path,
    log: SyntheticLog | None = None,
    *,
    nodes: int = 3,
    cut_short: dict[int, int] | None = None,
    diverge: tuple[int, int] | None = None,
    segment_length: int = DEFAULT_SEGMENT_LENGTH,
    active: frozenset[int] = frozenset(),
) -> SyntheticCluster:
    """Write ``root/node<i>`` for each node.

    ``cut_short``: node index -> a position; that node holds the log only up to the last message
    ending at or before it. ``diverge``: (node index, stream position) of one byte to invert in
    that node's copy. ``active``: nodes whose recording has no stop position.
    """
    log = log or build_log()
    root = Path(root)
    cut_short = cut_short or {}
    node_dirs: list[Path] = []
    held: list[int] = []
    for i in range(nodes):
        stop = log.end_position
        if i in cut_short:
            stop = log.message_boundary_at_or_before(cut_short[i])
        node_dir = root / f"node{i}"
        flip = diverge[1] if diverge and diverge[0] == i else None
        write_archive(
            node_dir, log, stop_position=stop, segment_length=segment_length, flip_byte_at=flip, active=i in active
        )
        node_dirs.append(node_dir)
        held.append(log.message_boundary_at_or_before(stop))
    majority = nodes // 2 + 1
    committed = sorted(held, reverse=True)[majority - 1]
    divergent_entry = None
    if diverge:
        for e in log.entries:
            if e.position <= diverge[1] < e.position + e.frame_length:
                divergent_entry = e
                break
    return SyntheticCluster(log, node_dirs, held, committed, diverge, divergent_entry)
