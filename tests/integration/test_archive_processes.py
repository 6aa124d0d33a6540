"""The archive between real processes: record, replay, live replay, extend, truncate, kill -9.

The archive runs in its own process (``tests/support/archive_peer.py``: a media driver plus an
archive). The test process opens its own media driver on the archive's driver directory, so it
shares the IPC streams: it talks to the archive with an :class:`ArchiveClient` over the local IPC
control channel, publishes IPC streams for it to record and subscribes to IPC replays.
Publishers of UDP streams are other processes (``tests/support/media_peer.py``).

Messages carry their sequence number (``media_peer.make_message``), so every replayed message is
checked for content and position without keeping a copy.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.client import ArchiveClient, ArchiveError, signal_is
from cluster_node.archive.codecs import NULL_VALUE, REPLAY_FOLLOW_LENGTH, ArchiveErrorCode, RecordingSignal
from cluster_node.archive.frame_walk import iter_frames, verify_recording
from cluster_node.media.driver import open_media_driver
from tests.support.archive_peer import start_peer
from tests.support.media_peer import make_message, size_fn
from tests.support.procs import Peer, free_udp_port

TERM = 256 * 1024


def expected_positions(sizes, count: int, term_length: int, start: int = 0) -> list[int]:
    """Stream position after each message (unfragmented), padding at term ends included."""
    out = []
    pos = start
    for i in range(count):
        aligned = (sizes(i) + 32 + 31) & ~31
        if (pos & (term_length - 1)) + aligned > term_length:
            pos = (pos | (term_length - 1)) + 1
        pos += aligned
        out.append(pos)
    return out


def ipc_at(position: int, initial_term_id: int, term_length: int, mtu: int = 1408) -> str:
    """An IPC channel whose publication starts at ``position`` of a stream."""
    term_id = initial_term_id + position // term_length
    return (
        f"aeron:ipc?term-length={term_length}|mtu={mtu}|init-term-id={initial_term_id}"
        f"|term-id={term_id}|term-offset={position % term_length}"
    )


async def offer_all(pub, messages, timeout: float = 60.0) -> int:
    with trio.fail_after(timeout):
        for m in messages:
            while True:
                r = pub.offer(m)
                if r > 0:
                    break
                await trio.sleep(0.0005)
    return pub.position


async def receive(sub, session_id: int, count: int, timeout: float = 60.0) -> list[tuple[bytes, int]]:
    """``count`` messages (payload, position) from the image of ``session_id``."""
    got: list[tuple[bytes, int]] = []

    def handler(buf, offset, length, header):
        got.append((bytes(buf[offset : offset + length]), header.position))

    with trio.fail_after(timeout):
        while len(got) < count:
            image = sub.image_by_session_id(session_id)
            if image is None or image.poll(handler, min(1000, count - len(got))) == 0:
                await sub.wait(0.05)
    return got


async def wait_recorded(client: ArchiveClient, recording_id: int, position: int, timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while await client.get_max_recorded_position(recording_id) < position:
            await trio.sleep(0.02)


def archive_dir(node: Path) -> Path:
    return node / "archive"


@pytest.fixture
def node(tmp_path):
    return tmp_path / "node"


def start_archive(node: Path, *extra: str, name: str = "archive") -> Peer:
    peer = start_peer(["--dir", str(node), "--term-length", str(TERM), *extra], name)
    peer.expect("READY", 30)
    return peer


async def test_record_100k_udp_messages_from_another_process_and_replay_a_range_to_ipc(node, tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    count = 100_000
    spec = "range:8:200"
    sizes = size_fn(spec, 8192)
    with start_archive(node) as archive:
        async with open_media_driver(dir=node / "driver") as driver:
            client = await ArchiveClient.connect(driver)
            await client.start_recording(channel, 1001)
            with Peer(
                [
                    "pub",
                    "--dir",
                    str(tmp_path / "pub"),
                    "--channel",
                    channel,
                    "--count",
                    str(count),
                    "--sizes",
                    spec,
                    "--term-length",
                    str(TERM),
                ],
                "pub",
            ) as pub:
                pub.expect("READY", 30)
                start = await client.wait_for_signal(signal_is(RecordingSignal.START), 30)
                recording_id = start.recording_id
                assert start.position == 0
                offered = int(pub.fields(pub.expect("OFFERED", 180))["position"])
                positions = expected_positions(sizes, count, TERM)
                assert offered == positions[-1]
                await wait_recorded(client, recording_id, offered, 120)
                # Replay [a, b): from the end of message 12,345 to the end of message 87,654.
                first, last = 12_345, 87_654
                a, b = positions[first - 1], positions[last]
                sub = driver.add_subscription("aeron:ipc", 7001)
                replay_id = await client.start_replay(recording_id, a, b - a, "aeron:ipc", 7001)
                got = await receive(sub, _sid(replay_id), last - first + 1, 120)
                for k, (payload, position) in enumerate(got):
                    i = first + k
                    assert payload == make_message(i, sizes(i)), f"message {i} differs"
                    assert position == positions[i], f"message {i} at {position}, recorded at {positions[i]}"
                # Nothing beyond b: the replay ends there (end of stream).
                image = sub.image_by_session_id(_sid(replay_id))
                with trio.fail_after(10):
                    while image is not None and not image.closed and not image.is_end_of_stream:
                        await sub.wait(0.05)
                assert image is None or image.position == b
            descriptor = await client.list_recording(recording_id)
            assert descriptor.start_position == 0 and descriptor.stream_id == 1001
            await client.close()
        assert archive.finish() == 0


def _sid(replay_session_id: int) -> int:
    low = replay_session_id & 0xFFFFFFFF
    return low - 2**32 if low & 0x80000000 else low


async def test_live_replay_follows_an_active_recording(node):
    with start_archive(node) as archive:
        async with open_media_driver(dir=node / "driver", ipc_term_length=TERM) as driver:
            client = await ArchiveClient.connect(driver)
            await client.start_recording("aeron:ipc", 1002)
            pub = driver.add_publication("aeron:ipc", 1002)
            start = await client.wait_for_signal(signal_is(RecordingSignal.START), 30)
            first = [make_message(i, 100) for i in range(2000)]
            await offer_all(pub, first)
            sub = driver.add_subscription("aeron:ipc", 7002)
            replay_id = await client.start_replay(start.recording_id, 0, REPLAY_FOLLOW_LENGTH, "aeron:ipc", 7002)
            got = await receive(sub, _sid(replay_id), 2000)
            assert [g[0] for g in got] == first
            # The replay keeps following as new messages are recorded.
            second = [make_message(i, 60) for i in range(2000, 5000)]
            await offer_all(pub, second)
            got2 = await receive(sub, _sid(replay_id), 3000)
            assert [g[0] for g in got2] == second
            assert got2[-1][1] == pub.position
            await client.stop_replay(replay_id)
            pub.close()
            stop = await client.wait_for_signal(signal_is(RecordingSignal.STOP, start.recording_id), 30)
            assert stop.position == got2[-1][1]
            await client.close()
        assert archive.finish() == 0


async def _record_ipc(client, driver, stream_id: int, messages, channel="aeron:ipc") -> tuple[int, int]:
    """Record ``messages`` published on a new IPC publication; return (recording id, stop)."""
    await client.start_recording("aeron:ipc", stream_id)
    pub = driver.add_publication(channel, stream_id)
    start = await client.wait_for_signal(signal_is(RecordingSignal.START), 30)
    await offer_all(pub, messages)
    await wait_recorded(client, start.recording_id, pub.position)
    pub.close()
    stop = await client.wait_for_signal(signal_is(RecordingSignal.STOP, start.recording_id), 30)
    await client.stop_recording("aeron:ipc", stream_id)
    return start.recording_id, stop.position


async def _replay_all(client, driver, recording_id: int, stream_id: int, count: int):
    d = await client.list_recording(recording_id)
    sub = driver.add_subscription("aeron:ipc", stream_id)
    replay_id = await client.start_replay(
        recording_id, d.start_position, d.stop_position - d.start_position, "aeron:ipc", stream_id
    )
    got = await receive(sub, _sid(replay_id), count)
    sub.close()
    return d, got


async def test_extend_joins_at_the_stop_position_and_a_wrong_position_is_refused(node):
    with start_archive(node) as archive:
        async with open_media_driver(dir=node / "driver", ipc_term_length=TERM) as driver:
            client = await ArchiveClient.connect(driver)
            old = [make_message(i, 300) for i in range(1500)]
            recording_id, stop = await _record_ipc(client, driver, 1003, old)
            d = await client.list_recording(recording_id)
            assert d.stop_position == stop

            # A publication at the wrong position is refused.
            await client.extend_recording(recording_id, "aeron:ipc", 1003)
            wrong = driver.add_publication(ipc_at(stop + 64 * 32, d.initial_term_id, TERM), 1003)
            refused = await client.wait_for_async_response(
                lambda r: r.relevant_id == ArchiveErrorCode.INVALID_EXTENSION, 30
            )
            assert "joins at position" in refused.error_message
            wrong.close()
            await client.stop_recording("aeron:ipc", 1003)
            assert (await client.list_recording(recording_id)).stop_position == stop

            # The right one extends the recording across the join.
            await client.extend_recording(recording_id, "aeron:ipc", 1003)
            pub = driver.add_publication(ipc_at(stop, d.initial_term_id, TERM), 1003)
            ext = await client.wait_for_signal(signal_is(RecordingSignal.EXTEND, recording_id), 30)
            assert ext.position == stop
            new = [make_message(i, 500) for i in range(1500, 3000)]
            await offer_all(pub, new)
            await wait_recorded(client, recording_id, pub.position)
            end = pub.position
            pub.close()
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, recording_id), 30)
            d2, got = await _replay_all(client, driver, recording_id, 7003, 3000)
            assert d2.stop_position == end
            assert [g[0] for g in got] == old + new
            positions = [g[1] for g in got]
            assert positions[1499] == stop and positions == sorted(positions)

            # Errors, not crashes: an active extension, unknown recordings, bad positions.
            with pytest.raises(ArchiveError) as e:
                await client.extend_recording(99, "aeron:ipc", 1003)
            assert e.value.error_code == ArchiveErrorCode.UNKNOWN_RECORDING
            with pytest.raises(ArchiveError, match="not 32-byte aligned"):
                await client.start_replay(recording_id, 16, 64, "aeron:ipc", 7003)
            with pytest.raises(ArchiveError, match="beyond the recorded position"):
                await client.start_replay(recording_id, end + 32, 64, "aeron:ipc", 7003)
            with pytest.raises(ArchiveError, match="runs past"):
                await client.start_replay(recording_id, 0, end + 32, "aeron:ipc", 7003)
            assert await client.list_recording(12345) is None
            await client.close()
        assert archive.finish() == 0


async def _after_replays_end(call):
    """``await call()`` once the archive no longer counts a replay of the recording as running:
    it ends a replay a moment after the subscriber has the last message (the replayer's own next
    step), so a request right after ``_replay_all`` may still be refused with "being replayed"."""
    with trio.fail_after(10):
        while True:
            try:
                return await call()
            except ArchiveError as e:
                if "being replayed" not in str(e):
                    raise
            await trio.sleep(0.01)


async def test_truncate_then_extend_gives_the_new_tail(node):
    with start_archive(node) as archive:
        async with open_media_driver(dir=node / "driver", ipc_term_length=TERM) as driver:
            client = await ArchiveClient.connect(driver)
            old = [make_message(i, 200) for i in range(3000)]
            recording_id, stop = await _record_ipc(client, driver, 1004, old)
            d, got = await _replay_all(client, driver, recording_id, 7004, 3000)
            cut = got[999][1]  # after message 999
            with pytest.raises(ArchiveError, match="not 32-byte aligned"):
                await _after_replays_end(lambda: client.truncate_recording(recording_id, cut + 8))
            with pytest.raises(ArchiveError, match="outside"):
                await client.truncate_recording(recording_id, stop + 32)
            await client.truncate_recording(recording_id, cut)
            assert await client.get_stop_position(recording_id) == cut
            await client.extend_recording(recording_id, "aeron:ipc", 1004)
            pub = driver.add_publication(ipc_at(cut, d.initial_term_id, TERM), 1004)
            await client.wait_for_signal(signal_is(RecordingSignal.EXTEND, recording_id), 30)
            with pytest.raises(ArchiveError, match="active"):
                await client.truncate_recording(recording_id, cut)
            new = [b"new" + make_message(i, 77) for i in range(1000, 2500)]
            await offer_all(pub, new)
            await wait_recorded(client, recording_id, pub.position)
            pub.close()
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, recording_id), 30)
            _d, got2 = await _replay_all(client, driver, recording_id, 7005, 2500)
            assert [g[0] for g in got2] == old[:1000] + new
            await client.close()
        assert archive.finish() == 0


async def test_kill_9_while_recording_at_full_rate_then_recover_and_extend(node, tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    spec = "range:8:400"
    sizes = size_fn(spec, 8192)
    archive = start_archive(node, "--segment-length", str(1024 * 1024))
    try:
        async with open_media_driver(dir=node / "driver", ipc_term_length=TERM) as driver:
            client = await ArchiveClient.connect(driver)
            await client.start_recording(channel, 1005)
            with Peer(
                [
                    "pub",
                    "--dir",
                    str(tmp_path / "pub"),
                    "--channel",
                    channel,
                    "--count",
                    "5000000",
                    "--stream",
                    "1005",
                    "--sizes",
                    spec,
                    "--term-length",
                    str(TERM),
                ],
                "pub",
            ) as pub:
                pub.expect("READY", 30)
                start = await client.wait_for_signal(signal_is(RecordingSignal.START), 30)
                recording_id = start.recording_id
                await wait_recorded(client, recording_id, 3 * 1024 * 1024 + 12345, 120)
                archive.kill()  # SIGKILL in the middle of recording
            await client.close()
    finally:
        archive.kill()

    # What is on disk before the restart: the catalog still says "active".
    catalog = Catalog.from_bytes((archive_dir(node) / "archive.catalog").read_bytes(), strict=False)
    assert catalog.get(recording_id).stop_position == -1

    archive = start_archive(node, "--segment-length", str(1024 * 1024), name="archive2")
    try:
        async with open_media_driver(dir=node / "driver", ipc_term_length=TERM) as driver:
            client = await ArchiveClient.connect(driver)
            d = await client.list_recording(recording_id)
            stop = d.stop_position
            assert stop > 3 * 1024 * 1024 and stop % 32 == 0
            # Catalog and segments agree, and every frame below the stop is intact and in order.
            descriptor = Catalog.from_bytes((archive_dir(node) / "archive.catalog").read_bytes()).get(recording_id)
            assert descriptor.stop_position == stop
            result = verify_recording(archive_dir(node), descriptor)
            assert result.ok, result
            i = 0
            last_end = 0
            for frame in iter_frames(archive_dir(node), descriptor):
                if frame.frame_type == 1:
                    assert frame.payload == make_message(i, sizes(i)), f"message {i} damaged"
                    i += 1
                last_end = frame.position + ((frame.frame_length + 31) & ~31)
            assert last_end == stop and i > 10_000

            # The recording can be extended again from the recovered stop position.
            await client.extend_recording(recording_id, "aeron:ipc", 1005)
            pub = driver.add_publication(ipc_at(stop, d.initial_term_id, d.term_buffer_length, d.mtu_length), 1005)
            await client.wait_for_signal(signal_is(RecordingSignal.EXTEND, recording_id), 30)
            tail = [make_message(j, sizes(j)) for j in range(i, i + 1000)]
            await offer_all(pub, tail)
            await wait_recorded(client, recording_id, pub.position)
            pub.close()
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, recording_id), 30)
            descriptor = Catalog.from_bytes((archive_dir(node) / "archive.catalog").read_bytes()).get(recording_id)
            assert verify_recording(archive_dir(node), descriptor).ok
            payloads = [f.payload for f in iter_frames(archive_dir(node), descriptor, stop) if f.frame_type == 1]
            assert payloads == tail
            await client.close()
        assert archive.finish() == 0
    finally:
        archive.kill()


def _read_range(directory: Path, recording_id: int, start: int, end: int) -> bytes:
    from cluster_node.archive.storage import SegmentReader

    d = Catalog.from_bytes((directory / "archive.catalog").read_bytes(), strict=False).get(recording_id)
    reader = SegmentReader(directory, d)
    out = bytearray()
    position = start
    while position < end:
        n = min(end, reader.segment_end(position)) - position
        out += reader.read(position, n)
        position += n
    reader.close()
    return bytes(out)


async def test_replication_between_two_archive_processes_over_udp_with_5_percent_loss(tmp_path):
    src_node, dst_node = tmp_path / "src", tmp_path / "dst"
    src_port, dst_port, repl_port, resp_port = (free_udp_port() for _ in range(4))
    lossy = ["--drop", "0.05"]
    src = start_archive(src_node, "--control-port", str(src_port), *lossy, "--seed", "3", name="src")
    dst = start_archive(
        dst_node,
        "--control-port",
        str(dst_port),
        "--replication-port",
        str(repl_port),
        "--response-port",
        str(resp_port),
        *lossy,
        "--seed",
        "4",
        name="dst",
    )
    src_control = f"aeron:udp?endpoint=127.0.0.1:{src_port}"
    try:
        async with (
            open_media_driver(dir=src_node / "driver", ipc_term_length=TERM) as src_driver,
            open_media_driver(dir=dst_node / "driver", ipc_term_length=TERM) as dst_driver,
        ):
            src_client = await ArchiveClient.connect(src_driver)
            dst_client = await ArchiveClient.connect(dst_driver)
            messages = [make_message(i, 40 + i % 900) for i in range(10_000)]
            src_id, src_stop = await _record_ipc(src_client, src_driver, 1010, messages)
            _d, got = await _replay_all(src_client, src_driver, src_id, 7010, 10_000)
            mid = got[5_999][1]

            # A new copy, up to a stop position in the middle.
            await dst_client.replicate(src_id, NULL_VALUE, src_control, stop_position=mid)
            started = await dst_client.wait_for_signal(signal_is(RecordingSignal.REPLICATE), 60)
            dst_id = started.recording_id
            await dst_client.wait_for_signal(signal_is(RecordingSignal.SYNC, dst_id), 120)
            await dst_client.wait_for_signal(signal_is(RecordingSignal.REPLICATE_END, dst_id), 30)
            assert not [r for r in dst_client.async_responses if r.code != 0]
            copy = await dst_client.list_recording(dst_id)
            assert copy.stop_position == mid and copy.start_position == 0
            assert _read_range(dst_node / "archive", dst_id, 0, mid) == _read_range(
                src_node / "archive", src_id, 0, mid
            )

            # Then only the missing tail, into the same recording.
            await dst_client.replicate(src_id, dst_id, src_control)
            ext = await dst_client.wait_for_signal(signal_is(RecordingSignal.EXTEND, dst_id), 60)
            assert ext.position == mid
            await dst_client.wait_for_signal(signal_is(RecordingSignal.REPLICATE_END, dst_id), 120)
            assert not [r for r in dst_client.async_responses if r.code != 0]
            copy = await dst_client.list_recording(dst_id)
            assert copy.stop_position == src_stop
            src_bytes = _read_range(src_node / "archive", src_id, 0, src_stop)
            assert _read_range(dst_node / "archive", dst_id, 0, src_stop) == src_bytes
            descriptor = Catalog.from_bytes((dst_node / "archive" / "archive.catalog").read_bytes()).get(dst_id)
            assert verify_recording(dst_node / "archive", descriptor).ok
            assert (copy.session_id, copy.stream_id, copy.initial_term_id) == (
                _d.session_id,
                _d.stream_id,
                _d.initial_term_id,
            )

            # Errors come back as errors: an unknown source recording.
            await dst_client.replicate(999, NULL_VALUE, src_control)
            err = await dst_client.wait_for_async_response(lambda r: r.code == 1, 30)
            assert "no recording 999" in err.error_message
            await src_client.close()
            await dst_client.close()
        assert src.finish() == 0 and dst.finish() == 0
    finally:
        src.kill()
        dst.kill()


async def test_a_replication_whose_channel_cannot_be_opened_fails_and_the_archive_goes_on(tmp_path):
    """The destination's own replication channel names a port another socket holds: that
    replication fails with an error response, and the archive process keeps serving (it used
    to die of the bind error, taking its cluster node with it)."""
    import socket

    src_node, dst_node = tmp_path / "src", tmp_path / "dst"
    src_port, dst_port, resp_port = (free_udp_port() for _ in range(3))
    src = start_archive(src_node, "--control-port", str(src_port), name="src")
    dst = start_archive(dst_node, "--control-port", str(dst_port), "--response-port", str(resp_port), name="dst")
    src_control = f"aeron:udp?endpoint=127.0.0.1:{src_port}"
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        taken.bind(("127.0.0.1", 0))
        busy_channel = f"aeron:udp?endpoint=127.0.0.1:{taken.getsockname()[1]}"
        async with (
            open_media_driver(dir=src_node / "driver", ipc_term_length=TERM) as src_driver,
            open_media_driver(dir=dst_node / "driver", ipc_term_length=TERM) as dst_driver,
        ):
            src_client = await ArchiveClient.connect(src_driver)
            dst_client = await ArchiveClient.connect(dst_driver)
            src_id, _stop = await _record_ipc(src_client, src_driver, 1020, [make_message(i, 64) for i in range(100)])
            await dst_client.replicate(src_id, NULL_VALUE, src_control, replication_channel=busy_channel)
            err = await dst_client.wait_for_async_response(lambda r: r.code == 1, 30)
            assert "already in use" in err.error_message
            assert dst.proc.poll() is None  # still running
            assert await dst_client.list_recordings() == []  # and answering
            await src_client.close()
            await dst_client.close()
        assert src.finish() == 0 and dst.finish() == 0
    finally:
        taken.close()
        src.kill()
        dst.kill()
