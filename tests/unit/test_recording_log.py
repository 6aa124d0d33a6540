"""recording.log: entry layout, TERM life cycle, truncation, torn tails, recovery plan, file shell."""

from __future__ import annotations

import struct

import pytest
import structlog
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster_node.consensus.recording_log import (
    CONSENSUS_MODULE_SERVICE_ID,
    ENTRY_ALIGNMENT,
    ENTRY_INVALID_FLAG,
    ENTRY_TYPE_SNAPSHOT,
    ENTRY_TYPE_TERM,
    Entry,
    RecordingLog,
    RecordingLogError,
    encode_entry,
)
from cluster_node.consensus.recording_log_file import RecordingLogFile


def _apply(buf: bytearray, writes) -> None:
    for offset, data in writes:
        assert offset <= len(buf)
        buf[offset : offset + len(data)] = data


def test_entry_layout_matches_the_reference_offsets() -> None:
    data = encode_entry(Entry(7, 3, 1024, 4096, 99, 0, ENTRY_TYPE_TERM))
    assert len(data) == ENTRY_ALIGNMENT
    rec, term, base, pos, ts, service, etype, ep_len = struct.unpack_from("<qqqqqiii", data)
    assert (rec, term, base, pos, ts, service, etype, ep_len) == (7, 3, 1024, 4096, 99, 0, 0, 0)


def test_invalid_flag_is_bit_31_of_the_entry_type() -> None:
    data = encode_entry(Entry(1, 0, 0, -1, 0, 0, ENTRY_TYPE_SNAPSHOT, is_valid=False))
    (etype,) = struct.unpack_from("<I", data, 44)
    assert etype == ENTRY_TYPE_SNAPSHOT | ENTRY_INVALID_FLAG


def test_archive_endpoint_grows_the_entry_in_64_byte_steps() -> None:
    data = encode_entry(Entry(1, 0, 0, 0, 0, 0, 2, archive_endpoint="h" * 20))
    assert len(data) == 128
    log = RecordingLog.decode(data)
    assert log.entries[0].archive_endpoint == "h" * 20


def test_appending_a_term_commits_the_previous_one_at_the_new_base() -> None:
    log = RecordingLog()
    buf = bytearray()
    _apply(buf, log.append_term(5, 0, 0, 100))
    assert log.last_term().log_position == -1
    _apply(buf, log.append_term(5, 2, 4096, 200))
    back = RecordingLog.decode(bytes(buf))
    assert [(e.leadership_term_id, e.term_base_log_position, e.log_position) for e in back.entries] == [
        (0, 0, 4096),
        (2, 4096, -1),
    ]
    with pytest.raises(RecordingLogError):
        log.append_term(5, 2, 8192, 0)  # not after the last term
    with pytest.raises(RecordingLogError):
        log.append_term(5, 3, 1024, 0)  # base before the last term's base


def test_term_queries_skip_invalid_entries() -> None:
    log = RecordingLog()
    log.append_term(1, 0, 0, 0)
    log.append_term(1, 2, 100, 0)
    log.append_term(1, 5, 300, 0)
    assert log.greatest_term_at_or_before(4).leadership_term_id == 2
    assert log.first_term_after(2).leadership_term_id == 5
    assert log.first_term_after(-1).leadership_term_id == 0
    assert log.greatest_term_at_or_before(-1) is None
    log.invalidate_terms_from(5)
    assert log.last_term().leadership_term_id == 2
    assert log.first_term_after(2) is None


def test_truncation_invalidates_later_terms_and_ends_the_cut_term() -> None:
    log = RecordingLog()
    buf = bytearray()
    _apply(buf, log.append_term(1, 0, 0, 0))
    _apply(buf, log.append_term(1, 1, 500, 0))
    _apply(buf, log.append_snapshot(9, 1, 500, 900, 0, CONSENSUS_MODULE_SERVICE_ID))
    _apply(buf, log.append_term(1, 3, 1000, 0))
    _apply(buf, log.truncate_to(700))
    back = RecordingLog.decode(bytes(buf))
    assert [e.leadership_term_id for e in back.term_entries()] == [0, 1]
    assert back.last_term().log_position == 700
    assert back.latest_snapshot() is None  # taken at 900, beyond the cut


def test_torn_tail_is_reported_and_ignored() -> None:
    log = RecordingLog()
    buf = bytearray()
    _apply(buf, log.append_term(1, 0, 0, 0))
    _apply(buf, log.append_term(1, 1, 64, 0))
    whole = bytes(buf)
    for cut in range(ENTRY_ALIGNMENT + 1, len(whole)):
        back = RecordingLog.decode(whole[:cut])
        assert len(back.entries) == 1
        assert back.length == ENTRY_ALIGNMENT
        assert back.torn_tail_length == cut - ENTRY_ALIGNMENT
    zeros = RecordingLog.decode(whole + bytes(64))
    assert len(zeros.entries) == 2 and zeros.torn_tail_length == 64


def test_damage_followed_by_valid_entries_is_corruption() -> None:
    log = RecordingLog()
    buf = bytearray()
    _apply(buf, log.append_term(1, 0, 0, 0))
    _apply(buf, log.append_term(1, 1, 64, 0))
    buf[3] ^= 0xFF
    with pytest.raises(RecordingLogError):
        RecordingLog.decode(bytes(buf))


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=600))
def test_decoding_arbitrary_bytes_never_crashes(data: bytes) -> None:
    try:
        log = RecordingLog.decode(data)
    except RecordingLogError:
        return
    assert log.length + log.torn_tail_length == len(data)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5000)), max_size=12))
def test_patches_replayed_on_bytes_equal_the_in_memory_log(ops) -> None:
    log = RecordingLog()
    buf = bytearray()
    term = 0
    base = 0
    for kind, n in ops:
        if kind == 0:
            term += 1 + n % 3
            base += n
            _apply(buf, log.append_term(1, term, base, n))
        elif kind == 1 and log.last_term() is not None:
            _apply(buf, log.truncate_to(max(log.last_term().term_base_log_position, n)))
        elif kind == 2:
            _apply(buf, log.append_snapshot(2, term, base, base + n, n, -1))
        else:
            _apply(buf, log.invalidate_latest_snapshot())
    back = RecordingLog.decode(bytes(buf))
    assert [(e.leadership_term_id, e.log_position, e.is_valid, e.entry_type) for e in back.entries] == [
        (e.leadership_term_id, e.log_position, e.is_valid, e.entry_type) for e in log.entries
    ]
    assert bytes(buf) == log.encode()


def test_recovery_plan_uses_the_latest_complete_snapshot_set_and_last_term() -> None:
    log = RecordingLog()
    log.append_term(1, 0, 0, 0)
    log.append_snapshot(10, 0, 0, 640, 5, 0)
    log.append_snapshot(11, 0, 0, 640, 5, CONSENSUS_MODULE_SERVICE_ID)
    log.append_term(1, 4, 1024, 0)
    log.append_snapshot(12, 4, 1024, 2048, 6, CONSENSUS_MODULE_SERVICE_ID)  # no service entry
    plan = log.create_recovery_plan(service_count=1, log_start_position=0, log_stop_position=3000)
    assert plan.last_leadership_term_id == 4
    assert plan.last_term_base_log_position == 1024
    assert plan.appended_log_position == 3000
    assert plan.log_recording_id == 1
    assert [s.recording_id for s in plan.snapshots] == [11, 10]
    assert plan.committed_log_position == 640
    log.invalidate_latest_snapshot()
    plan = log.create_recovery_plan(1, 0, 3000)
    assert [s.recording_id for s in plan.snapshots] == [11, 10]  # the incomplete set was skipped


def test_recovery_plan_of_an_empty_log() -> None:
    plan = RecordingLog().create_recovery_plan(1, 0, 0)
    assert plan.last_leadership_term_id == -1 and plan.snapshots == () and plan.committed_log_position == 0


def test_file_shell_round_trips_and_repairs_a_torn_tail(tmp_path) -> None:
    with RecordingLogFile(tmp_path) as f:
        f.apply(f.log.append_term(3, 0, 0, 1))
        f.apply(f.log.append_term(3, 1, 128, 2))
    path = tmp_path / "recording.log"
    with open(path, "ab") as fh:
        fh.write(b"\x01" * 40)  # a torn append
    with structlog.testing.capture_logs() as logs, RecordingLogFile(tmp_path) as f:
        assert f.repaired_tail_length == 40
        assert [e.leadership_term_id for e in f.log.term_entries()] == [0, 1]
        assert f.log.entries[0].log_position == 128
    assert path.stat().st_size == 128
    (cut,) = [e for e in logs if e["event"] == "recording.log: a torn last entry cut off"]
    assert (cut["bytes"], cut["entries_kept"], cut["cut_from_offset"]) == (40, 2, 128)


# ------------------------------------------------------------------------------ retention


def _with_snapshots(positions, service_count=1):
    rl = RecordingLog()
    rl.append_term(0, 0, 0, 1)
    rid = 10
    for p in positions:
        for service_id in range(service_count):
            rl.append_snapshot(rid, 0, 0, p, 2, service_id)
            rid += 1
        rl.append_snapshot(rid, 0, 0, p, 2, -1)
        rid += 1
    return rl


def test_retention_keeps_the_newest_sets_and_names_the_recordings_of_the_others():
    rl = _with_snapshots([1000, 2000, 3000, 4000])
    floor, writes, recordings = rl.retention(1, 2)
    assert floor == 3000
    assert recordings == [10, 11, 12, 13]
    assert [s[0].log_position for s in rl.snapshot_sets(1)] == [4000, 3000]
    # The patches are what the file must say: decoding the patched bytes gives the same entries.
    data = bytearray(_with_snapshots([1000, 2000, 3000, 4000]).encode())
    for offset, patch in writes:
        data[offset : offset + len(patch)] = patch
    assert RecordingLog.decode(bytes(data)).entries == rl.entries
    # Applied again (a crash before the archive removed them): the same recordings, no patch.
    assert rl.retention(1, 2) == (3000, (), [10, 11, 12, 13])


def test_retention_keeps_the_log_while_there_are_fewer_sets_than_retained():
    rl = _with_snapshots([1000])
    assert rl.retention(1, 2) == (-1, (), [])
    assert rl.retention(1, 1)[0] == 1000


def test_retention_leaves_an_invalidated_latest_snapshot_recording_alone():
    rl = _with_snapshots([1000, 2000, 3000])
    rl.invalidate_latest_snapshot()  # the operator's: 3000 is bad
    floor, _writes, recordings = rl.retention(1, 2)
    assert floor == 1000 and recordings == []
    assert 14 not in recordings and 15 not in recordings


def test_retention_counts_only_complete_sets():
    rl = _with_snapshots([1000, 2000])
    rl.append_snapshot(99, 0, 0, 3000, 2, -1)  # a consensus module snapshot without its service's
    floor, _writes, recordings = rl.retention(1, 2)
    assert floor == 1000 and recordings == []


def test_sorted_copy_puts_entries_in_append_order_and_keeps_invalid_ones():
    # Written out of order (by hand, or merged from two files): the bytes are built directly.
    data = b"".join(
        encode_entry(e)
        for e in [
            Entry(7, 1, 500, -1, 1, 0, ENTRY_TYPE_TERM),
            Entry(21, 0, 0, 300, 2, -1, ENTRY_TYPE_SNAPSHOT),
            Entry(20, 0, 0, 300, 2, 0, ENTRY_TYPE_SNAPSHOT),
            Entry(7, 0, 0, 500, 1, 0, ENTRY_TYPE_TERM),
        ]
    )
    rl = RecordingLog.decode(data)
    rl._invalidate(lambda e: e.recording_id == 20)
    ordered = rl.sorted_copy()
    assert [(e.leadership_term_id, e.entry_type, e.service_id, e.is_valid) for e in ordered.entries] == [
        (0, 0, 0, True),
        (0, 1, 0, False),
        (0, 1, -1, True),
        (1, 0, 0, True),
    ]
    assert RecordingLog.decode(ordered.encode()).entries == ordered.entries


def test_seeded_log_holds_the_latest_set_and_the_terms_from_it_on():
    rl = RecordingLog()
    rl.append_term(7, 0, 0, 1)
    rl.append_snapshot(10, 0, 0, 1000, 2, 0)
    rl.append_snapshot(11, 0, 0, 1000, 2, -1)
    rl.append_term(7, 1, 1500, 1)
    rl.append_snapshot(12, 1, 1500, 2000, 2, 0)
    rl.append_snapshot(13, 1, 1500, 2000, 2, -1)
    rl.append_term(7, 2, 2500, 1)
    seeded = rl.seeded_from_latest_snapshot(1)
    assert [(e.entry_type, e.leadership_term_id, e.recording_id) for e in seeded.entries] == [
        (0, 1, 7),
        (1, 1, 12),
        (1, 1, 13),
        (0, 2, 7),
    ]
    plan = seeded.create_recovery_plan(1, 0, 3000, 7)
    assert plan.snapshots[0].log_position == 2000 and plan.last_leadership_term_id == 2
    with pytest.raises(RecordingLogError, match="no complete valid snapshot set"):
        RecordingLog().seeded_from_latest_snapshot(1)
