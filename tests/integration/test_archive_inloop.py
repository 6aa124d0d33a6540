"""The archive in the test's own trio loop (driver, archive and client together): the control
operations the process tests do not cover, and bad input."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from cluster_node.archive.client import ArchiveClient, ArchiveError, signal_is
from cluster_node.archive.codecs import ArchiveErrorCode, RecordingSignal
from cluster_node.archive.conductor import RECORDING_POSITION_TYPE_ID, ArchiveConfig, open_archive
from cluster_node.archive.storage import ArchiveStorageError, list_segments
from cluster_node.media.counters import CountersReader
from cluster_node.media.driver import open_media_driver

TERM = 64 * 1024


async def _record(client, driver, stream_id, count, size=100, term="64k"):
    await client.start_recording("aeron:ipc", stream_id)
    pub = driver.add_publication(f"aeron:ipc?term-length={term}", stream_id)
    start = await client.wait_for_signal(signal_is(RecordingSignal.START), 10)
    with trio.fail_after(20):
        for i in range(count):
            while pub.offer(i.to_bytes(4, "little") * (size // 4)) < 0:
                await trio.sleep(0.001)
        while await client.get_max_recorded_position(start.recording_id) < pub.position:
            await trio.sleep(0.01)
    return start.recording_id, pub


async def test_control_operations_and_bad_requests(tmp_path):
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        config = ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM)
        async with open_archive(driver, config) as archive:
            with pytest.raises(ArchiveStorageError, match="in use by another archive"):
                async with open_archive(driver, config):
                    pass
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 3000)
            # The recording position is a counter in the driver's counters file.
            with CountersReader.open(driver.counters.path) as reader:
                (info,) = [c for c in reader.find(type_id=RECORDING_POSITION_TYPE_ID) if c.registration_id == rid]
                assert info.value == pub.position
            assert await client.get_recording_position(rid) == pub.position
            assert await client.get_stop_position(rid) == -1
            with pytest.raises(ArchiveError) as e:
                await client.truncate_recording(rid, 0)
            assert e.value.error_code == ArchiveErrorCode.ACTIVE_RECORDING
            with pytest.raises(ArchiveError) as e:
                await client.start_recording("aeron:ipc", 1)
            assert e.value.error_code == ArchiveErrorCode.ACTIVE_SUBSCRIPTION

            # A bounded replay stops at its limit counter's value, and moves on when it moves.
            limit = driver.counters.allocate("replay limit", 1000)
            limit.set(160 * 10)
            sub = driver.add_subscription("aeron:ipc", 50)
            replay_id = await client.bounded_replay(rid, 0, 1 << 40, limit.counter_id, "aeron:ipc", 50)
            got = []
            image = None
            with trio.fail_after(10):
                while len(got) < 10:
                    image = sub.image_by_session_id(_sid(replay_id))
                    if image is None or not image.poll(lambda b, o, n, h: got.append(h.position), 100):
                        await sub.wait(0.02)
            await trio.sleep(0.1)
            image.poll(lambda b, o, n, h: got.append(h.position), 100)
            assert len(got) == 10 and got[-1] == 1600
            limit.set(160 * 20)
            with trio.fail_after(10):
                while len(got) < 20:
                    if not image.poll(lambda b, o, n, h: got.append(h.position), 100):
                        await sub.wait(0.02)
            # Stop it by recording: StopAllReplays.
            await client.stop_all_replays(rid)
            with pytest.raises(ArchiveError) as e:
                await client.stop_replay(12345)
            assert e.value.error_code == ArchiveErrorCode.UNKNOWN_REPLAY

            # Stop by identity, then purge.
            assert await client.stop_recording_by_identity(rid) is True
            stop = await client.wait_for_signal(signal_is(RecordingSignal.STOP, rid), 10)
            assert stop.position == pub.position
            assert await client.stop_recording_by_identity(rid) is False
            with trio.fail_after(5):
                while archive.replays:
                    await trio.sleep(0.01)
            assert list_segments(tmp_path / "archive", rid)
            await client.purge_recording(rid)
            await client.wait_for_signal(signal_is(RecordingSignal.DELETE, rid), 10)
            assert await client.list_recording(rid) is None
            assert list_segments(tmp_path / "archive", rid) == []
            with pytest.raises(ArchiveError) as e:
                await client.start_replay(rid, 0, 64, "aeron:ipc", 50)
            assert e.value.error_code == ArchiveErrorCode.UNKNOWN_RECORDING

            # Garbage and requests for unknown control sessions are counted and dropped.
            raw = driver.add_publication("aeron:ipc", 10)
            with trio.fail_after(5):
                while raw.offer(b"\x93\x3d\xff") < 0:
                    await trio.sleep(0.01)
                while raw.offer(b"\x00garbage") < 0:
                    await trio.sleep(0.01)
                while archive.invalid_requests < 2:
                    await trio.sleep(0.01)
            await client.keep_alive()  # the archive still serves
            raw.close()
            await client.close()


def _sid(replay_session_id: int) -> int:
    low = replay_session_id & 0xFFFFFFFF
    return low - 2**32 if low & 0x80000000 else low


@pytest.mark.parametrize("term", ["64k", "512k"])
async def test_a_replay_is_a_stream_of_its_own_in_every_frame(tmp_path, term):
    """Every replayed frame carries the replay's session and stream ids, whether the replay found
    its frames by a walk (64 KiB terms: reads of a quarter term, 16 KiB) or with numpy (512 KiB
    terms: 128 KiB reads): a recording of the replay stream must hold frames of that stream (crash
    recovery checks it)."""
    from cluster_node.media.frames import DATA_HEADER

    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        async with open_archive(driver, ArchiveConfig(dir=tmp_path / "archive", segment_file_length=4 * 1024 * 1024)):
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 5, 20000, size=96, term=term)  # 128-byte frames
            end = pub.position
            sub = driver.add_subscription("aeron:ipc", 77)
            replay_id = await client.start_replay(rid, 0, end, "aeron:ipc", 77)
            sid = replay_id & 0xFFFFFFFF
            sid = sid - 2**32 if sid & 0x80000000 else sid
            seen = []

            def on_block(buf, offset, length, position):
                i = offset
                while i < offset + length:
                    flen, _v, _f, ftype, _toff, fsid, fstream, _term, _r = DATA_HEADER.unpack_from(buf, i)
                    if ftype == 1:
                        seen.append((fsid, fstream))
                    i += (flen + 31) & ~31 if ftype == 1 else flen

            received = 0
            with trio.fail_after(20):
                while received < end:
                    image = sub.image_by_session_id(sid)
                    n = image.block_poll(on_block, 1 << 20) if image is not None else 0
                    received += n
                    if not n:
                        await sub.wait(0.05)
            assert len(seen) == 20000
            assert set(seen) == {(sid, 77)}
            await client.close()


async def test_record_now_writes_what_the_image_has_in_the_callers_step(tmp_path):
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        config = ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM)
        async with open_archive(driver, config) as archive:
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 10)
            assert archive.record_now(rid) == 0  # nothing new
            assert archive.record_now(rid + 1000) == 0  # not a recording: nothing, no error
            assert pub.offer(b"x" * 100) > 0
            # No yield between the offer and the check: only record_now can have written it.
            assert archive.record_now(rid) == 160
            assert archive.recorded_position(rid) == (pub.position, True)
            await client.stop_recording("aeron:ipc", 1)
            with trio.fail_after(10):
                while archive.recorded_position(rid)[1]:
                    await trio.sleep(0.01)
            assert pub.offer(b"y" * 100) > 0
            assert archive.record_now(rid) == 0  # stopped: no longer recorded
            await client.close()


async def test_a_recording_written_by_record_now_is_not_rung_for_each_append_and_still_ends(tmp_path):
    """Once a duty cycle writes a recording itself (record_now after each append), the recording
    task stops marking its image parked, so the writer's appends ring nobody (a wasted step of
    that task per log entry otherwise); end of stream still wakes it and ends the recording."""
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        config = ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM)
        async with open_archive(driver, config) as archive:
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 10)
            (rs,) = archive.recording_subscriptions.values()
            assert rs.subscription.writers_ring  # nobody invokes it yet: appends ring it
            assert pub.offer(b"x" * 100) > 0
            assert archive.record_now(rid) == 160
            with trio.fail_after(10):
                # Its task idles again, now without parking the image.
                while rs.subscription.writers_ring:
                    await trio.sleep(0.005)
                await trio.testing.wait_all_tasks_blocked()
            parked = [s for s in pub.log.active_slots() if s[4]]
            assert parked == []  # no parked reader: an append rings nobody
            for _ in range(5):
                assert pub.offer(b"y" * 100) > 0
                assert archive.record_now(rid) == 160
            assert archive.recorded_position(rid) == (pub.position, True)
            pub.close()  # end of stream rings every reader, parked or not
            with trio.fail_after(10):
                while archive.recorded_position(rid)[1]:
                    await trio.sleep(0.01)
            assert archive.recorded_position(rid) == (pub.position, False)
            await client.close()


async def test_control_sessions_are_bounded_and_a_request_that_raises_is_answered_and_counted(tmp_path, monkeypatch):
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        config = ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM, max_control_sessions=2)
        async with open_archive(driver, config) as archive:
            first = await ArchiveClient.connect(driver)
            second = await ArchiveClient.connect(driver)
            with pytest.raises(ArchiveError):
                await ArchiveClient.connect(driver, response_timeout_s=1.0)  # refused: no answer
            assert [e.key for e in archive.errors.entries()] == ["connect refused: max_control_sessions"]
            await second.close()
            await trio.testing.wait_all_tasks_blocked()

            def broken(session, request):
                raise RuntimeError("a fault the request's checks missed")

            monkeypatch.setattr(archive, "_on_ListRecordingsRequest", broken, raising=False)
            with pytest.raises(ArchiveError) as e:
                await first.list_recordings(0, 10)
            assert "ListRecordingsRequest failed: RuntimeError" in str(e.value)
            assert any(k.key.startswith("request failed: ListRecordingsRequest") for k in archive.errors.entries())
            with pytest.raises(ArchiveError, match="unknown recording 7"):  # the session still answers
                await first.get_recording_position(7)
            await first.close()


async def test_segments_of_an_active_recording_are_purged_detached_and_attached_over_the_protocol(tmp_path):
    """The front of a live recording goes while it records; the file it writes stays; a replay
    from the new start reads the rest; a request outside the rules is an error, nothing moves."""
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
        config = ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM)
        async with open_archive(driver, config):
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 3000)
            adir = tmp_path / "archive"
            recorded = await client.get_max_recorded_position(rid)
            assert recorded > 4 * TERM
            current_base = recorded - recorded % TERM
            with pytest.raises(ArchiveError, match="in use"):
                await client.purge_segments(rid, current_base + TERM)
            with pytest.raises(ArchiveError, match="segment boundary"):
                await client.purge_segments(rid, TERM + 32)
            assert await client.get_start_position(rid) == 0
            await client.detach_segments(rid, 2 * TERM)
            assert await client.get_start_position(rid) == 2 * TERM
            assert list_segments(adir, rid)[0] == 0  # detached, still there
            assert await client.attach_segments(rid) == 2
            assert await client.get_start_position(rid) == 0
            assert await client.purge_segments(rid, current_base) == current_base // TERM
            assert list_segments(adir, rid)[0] == current_base
            assert await client.get_start_position(rid) == current_base
            assert await client.delete_detached_segments(rid) == 0
            with pytest.raises(ArchiveError, match="precedes the recording's start"):
                await client.start_replay(rid, 0, 64, "aeron:ipc", 51)
            # The recording goes on in the file that was kept.
            for i in range(200):
                while pub.offer(i.to_bytes(4, "little") * 25) < 0:
                    await trio.sleep(0.001)
            with trio.fail_after(10):
                while await client.get_max_recorded_position(rid) < pub.position:
                    await trio.sleep(0.01)
            sub = driver.add_subscription("aeron:ipc", 52)
            replay_id = await client.start_replay(rid, current_base, pub.position - current_base, "aeron:ipc", 52)
            got = []
            with trio.fail_after(10):
                while not got or got[-1] < pub.position:
                    image = sub.image_by_session_id(_sid(replay_id))
                    if image is None or not image.poll(lambda b, o, n, h: got.append(h.position), 100):
                        await sub.wait(0.02)
            assert got[-1] == pub.position
            await client.close()
