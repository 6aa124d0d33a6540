"""The archive readers without Spark: the reference and the batch path agree with each other and
with what the synthetic archive wrote, and report bad archives by file and position."""

from __future__ import annotations

import struct
import zlib

import pytest

pytest.importorskip("numpy")
pytest.importorskip("pyarrow")

from cluster_node.archive.segments import HEADER_LENGTH, segment_file_name
from cluster_node.archive.spark.layout import ArchiveCorruptError, ArchiveNotFoundError
from cluster_node.archive.spark.reader import ArchiveSet
from cluster_node.pipeline.decoder import ClusterLogDecoder
from tests.support.synthetic_archive import build_log, write_archive, write_cluster


def batch_rows(archives: ArchiveSet) -> list[tuple]:
    import pyarrow as pa

    table = pa.Table.from_batches(list(archives.record_batches()), schema=None) if archives.tasks else None
    return [] if table is None else [tuple(r.values()) for r in table.to_pylist()]


@pytest.mark.parametrize("task_bytes", [64 * 1024, 16 * 1024 * 1024])
def test_reference_and_batch_rows_are_identical(agreeing_cluster, task_bytes):
    archives = ArchiveSet(
        [str(p) for p in agreeing_cluster.node_dirs], decoder=ClusterLogDecoder(), target_task_bytes=task_bytes
    )
    reference = list(archives.rows())
    assert reference == batch_rows(archives)
    assert len(reference) == 3 * len(agreeing_cluster.log.entries)


def test_rows_match_what_was_written(agreeing_cluster):
    log = agreeing_cluster.log
    archives = ArchiveSet([str(agreeing_cluster.node_dirs[1])], decoder=ClusterLogDecoder())
    names = archives.column_names
    rows = [dict(zip(names, r)) for r in archives.rows()]
    assert len(rows) == len(log.entries)
    assert any(e.fragments > 1 for e in log.entries)
    for row, e in zip(rows, log.entries):
        assert (row["node"], row["member_id"], row["stream_id"]) == ("node1", 1, 100)
        assert (row["position"], row["frame_length"], row["fragments"], row["transport_session_id"]) == (
            e.position,
            e.frame_length,
            e.fragments,
            e.session_id,
        )
        assert (row["leadership_term_id"], row["template_id"], row["message_type"]) == (
            e.leadership_term_id,
            e.template_id,
            e.message_type,
        )
        assert (row["cluster_session_id"], row["timestamp"]) == (e.cluster_session_id, e.timestamp)
        assert row["decode_error"] is None
        expected_payload = e.message[32:] if e.template_id == 1 else e.message
        assert row["payload"] == expected_payload
        recorded = bytearray(log.data[e.position : e.position + e.frame_length])
        offset = 0
        while offset < len(recorded):  # the frame hash reads every header's session id as zero
            recorded[offset + 12 : offset + 16] = bytes(4)
            offset += (struct.unpack_from("<i", recorded, offset)[0] + 31) & ~31
        assert row["frame_hash"] == zlib.crc32(recorded)


def test_raw_decoder_and_stream_filter(agreeing_cluster):
    node = str(agreeing_cluster.node_dirs[0])
    raw_log = list(ArchiveSet([node]).rows())
    assert [r[-3] for r in raw_log] == [e.message for e in agreeing_cluster.log.entries]
    everything = ArchiveSet([node], stream_ids=None)
    streams = {r[4] for r in everything.rows()}
    assert streams == {100, 107}
    assert list(everything.rows()) == batch_rows(everything)


def test_glob_and_archive_directory_paths(agreeing_cluster):
    root = agreeing_cluster.node_dirs[0].parent
    by_glob = ArchiveSet([str(root / "node*")])
    assert [loc.node for loc in by_glob.locations] == ["node0", "node1", "node2"]
    direct = ArchiveSet([str(agreeing_cluster.node_dirs[2] / "archive")])
    assert direct.locations[0].node == "node2" and direct.locations[0].member_id == 2


def test_not_an_archive(tmp_path):
    with pytest.raises(ArchiveNotFoundError, match="not an archive"):
        ArchiveSet([str(tmp_path)])
    with pytest.raises(ArchiveNotFoundError, match="no such directory"):
        ArchiveSet([str(tmp_path / "missing")])


def _segment(node_dir, base=0):
    return node_dir / "archive" / segment_file_name(0, base)


@pytest.mark.parametrize(
    "field_offset, value, reason",
    [
        (0, struct.pack("<i", 7), "shorter than a header"),
        (4, b"\x03", "frame version 3"),
        (6, struct.pack("<H", 9), "frame type 9"),
        (16, struct.pack("<i", 101), "stream id 101"),
        (20, struct.pack("<i", 12), "term id 12"),
    ],
)
def test_corrupt_header_names_file_and_position(tmp_path, field_offset, value, reason):
    log = build_log(seed=5, terms=1, messages_per_term=80)
    victim = log.entries[20]
    write_archive(tmp_path / "node0", log)
    path = _segment(tmp_path / "node0")
    data = bytearray(path.read_bytes())
    data[victim.position + field_offset : victim.position + field_offset + len(value)] = value
    path.write_bytes(data)
    archives = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder())
    for read in (lambda: list(archives.rows()), lambda: batch_rows(archives)):
        with pytest.raises(ArchiveCorruptError, match=reason) as info:
            read()
        assert info.value.position == victim.position
        assert info.value.path == str(path)


def test_stopped_recording_missing_data_is_corrupt(tmp_path):
    log = build_log(seed=5, terms=1, messages_per_term=80)
    write_archive(tmp_path / "node0", log)
    path = _segment(tmp_path / "node0")
    data = path.read_bytes()
    cut = log.entries[40].position
    path.write_bytes(data[:cut])
    archives = ArchiveSet([str(tmp_path / "node0")])
    for read in (lambda: list(archives.rows()), lambda: batch_rows(archives)):
        with pytest.raises(ArchiveCorruptError, match="data ends before the stop position") as info:
            read()
        assert info.value.position == cut


def test_active_recording_torn_tail_is_dropped_quietly(tmp_path):
    log = build_log(seed=5, terms=1, messages_per_term=120, large_every=7)
    write_archive(tmp_path / "node0", log, active=True)
    path = _segment(tmp_path / "node0")
    fragmented = next(e for e in log.entries[30:] if e.fragments > 1)
    # Cut inside the fragmented message's second frame: it and everything after it are not there yet.
    cut = fragmented.position + 1408 + HEADER_LENGTH + 10
    path.write_bytes(path.read_bytes()[:cut])
    archives = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder())
    reference = list(archives.rows())
    assert len(reference) == log.entries.index(fragmented)
    assert reference == batch_rows(archives)


def test_undecodable_message_is_a_row_not_a_crash(tmp_path):
    log = build_log(seed=5, terms=1, messages_per_term=60)
    victim = next(e for e in log.entries if e.message_type == "TimerEvent")
    write_archive(tmp_path / "node0", log, flip_byte_at=victim.position + HEADER_LENGTH)
    archives = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder())
    rows = [dict(zip(archives.column_names, r)) for r in archives.rows()]
    bad = [r for r in rows if r["decode_error"]]
    assert [r["position"] for r in bad] == [victim.position]
    assert bad[0]["message_type"] == "<undecodable>"
    assert list(archives.rows()) == batch_rows(archives)


def test_cut_short_and_divergent_cluster_expectations(tmp_path):
    log = build_log(seed=2, terms=2, messages_per_term=60)
    cluster = write_cluster(tmp_path, log, cut_short={1: log.terms[1].base_position})
    assert cluster.held_positions[1] == log.terms[1].base_position
    assert cluster.committed_position == log.message_boundary_at_or_before(log.end_position)
    rows = list(ArchiveSet([str(cluster.node_dirs[1])]).rows())
    assert len(rows) == len([e for e in log.entries if e.leadership_term_id == 0])


def test_frame_hash_and_byte_comparison_ignore_the_transport_session_id(tmp_path):
    """Each node records its own copy of the log under a session id of its own: the same log on
    two nodes differs in every frame header's session id field and nowhere else."""
    from cluster_node.archive.spark.frames import first_differing_byte

    log = build_log(seed=5, terms=2, messages_per_term=120, large_every=7)
    write_archive(tmp_path / "node0", log)
    write_archive(tmp_path / "node1", log)
    path = _segment(tmp_path / "node1")
    data = bytearray(path.read_bytes())
    offset = 0
    while offset + HEADER_LENGTH <= len(data):
        (flen,) = struct.unpack_from("<i", data, offset)
        if flen == 0:
            break
        data[offset + 12 : offset + 16] = struct.pack("<i", 424242)
        offset += (flen + 31) & ~31
    path.write_bytes(data)
    a = ArchiveSet([str(tmp_path / "node0")], decoder=ClusterLogDecoder())
    b = ArchiveSet([str(tmp_path / "node1")], decoder=ClusterLogDecoder())
    a_rows, b_rows = list(a.rows()), list(b.rows())
    names = a.column_names
    hash_at, session_at = names.index("frame_hash"), names.index("transport_session_id")
    assert [r[hash_at] for r in a_rows] == [r[hash_at] for r in b_rows]
    assert {r[session_at] for r in b_rows} == {424242}
    assert b_rows == batch_rows(b)
    fragmented = next(e for e in log.entries if e.fragments > 1)
    span = slice(fragmented.position, fragmented.position + fragmented.frame_length)
    original = bytes(log.data[span])
    assert first_differing_byte(original, bytes(data[span])) is None
    changed = bytearray(data[span])
    changed[1500] ^= 1  # inside the second fragment's payload
    assert first_differing_byte(original, bytes(changed)) == 1500
    assert first_differing_byte(original, original[:-1]) == len(original) - 1
