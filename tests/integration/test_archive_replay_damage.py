"""A replay never sends a frame that fails its checksum: it ends there, and the archive reports
the damage (the node stops on it with DATA_DAMAGED), in the test's own trio loop."""

from __future__ import annotations

import pytest
import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.client import ArchiveClient, signal_is
from cluster_node.archive.codecs import RecordingSignal
from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.archive.frame_walk import iter_frames
from cluster_node.archive.segments import segment_file_name
from cluster_node.media.driver import open_media_driver
from tests.integration.test_archive_inloop import _record, _sid


@pytest.mark.parametrize("term,size", [("64k", 100), ("512k", 100), ("512k", 3000)])
async def test_a_replay_stops_before_a_damaged_frame_and_reports_it(tmp_path, term, size):
    term_length = {"64k": 64 * 1024, "512k": 512 * 1024}[term]
    adir = tmp_path / "archive"
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=term_length) as driver:
        config = ArchiveConfig(dir=adir, segment_file_length=4 * term_length)
        async with open_archive(driver, config) as archive:
            damaged: list[str] = []
            archive.on_data_damaged = damaged.append
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 2000, size=size, term=term)
            await client.stop_recording_by_identity(rid)
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, rid), 10)
            d = Catalog.from_bytes((adir / "archive.catalog").read_bytes()).get(rid)
            assert d.frame_checksums_from == 0
            frames = [f for f in iter_frames(adir, d) if f.frame_type == 1]
            victim = frames[len(frames) * 2 // 3]
            base = victim.position - victim.position % d.segment_file_length
            path = adir / segment_file_name(rid, base)
            data = bytearray(path.read_bytes())
            data[victim.position - base + 32 + len(victim.payload) // 2] ^= 0x10
            path.write_bytes(bytes(data))

            sub = driver.add_subscription("aeron:ipc", 60)
            replay_id = await client.start_replay(rid, 0, d.stop_position, "aeron:ipc", 60)
            got: list[tuple[int, bytes]] = []
            with trio.fail_after(20):
                while not damaged:
                    image = sub.image_by_session_id(_sid(replay_id))
                    if image is None or not image.poll(
                        lambda b, o, n, h: got.append((h.position, bytes(b[o : o + n]))), 100
                    ):
                        await sub.wait(0.02)
            assert f"recording {rid} in {adir} is damaged at position {victim.position}" in damaged[0]
            # Everything before the damaged frame, intact; nothing from it on.
            sent = {p: payload for p, payload in got}
            assert all(pos <= victim.position for pos in sent)
            assert victim.position + ((len(victim.payload) + 63) & ~31) not in sent
            for f in frames if size < 1408 else []:  # (fragmented messages arrive whole)
                if f.position + ((len(f.payload) + 63) & ~31) in sent:
                    assert sent[f.position + ((len(f.payload) + 63) & ~31)] == f.payload
            await client.close()


async def test_a_recording_written_without_checksums_has_them_from_where_it_is_extended(tmp_path):
    """An archive from before frame checksums (or with them off) left a recording without them;
    extended by one that writes them, its frames carry them from the extension's position on:
    verify says so, replays check them there, and the old frames are checked for structure."""
    from tests.integration.test_archive_processes import ipc_at, offer_all, wait_recorded

    term_length = 64 * 1024
    adir = tmp_path / "archive"
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=term_length) as driver:
        async with open_archive(
            driver, ArchiveConfig(dir=adir, segment_file_length=4 * term_length, frame_checksums=False)
        ):
            client = await ArchiveClient.connect(driver)
            rid, pub = await _record(client, driver, 1, 500)
            await client.stop_recording_by_identity(rid)
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, rid), 10)
            pub.close()
            await client.close()
        async with open_archive(driver, ArchiveConfig(dir=adir, segment_file_length=4 * term_length)) as archive:
            damaged: list[str] = []
            archive.on_data_damaged = damaged.append
            client = await ArchiveClient.connect(driver)
            d = await client.list_recording(rid)
            stop = d.stop_position
            await client.extend_recording(rid, "aeron:ipc", 1)
            pub = driver.add_publication(ipc_at(stop, d.initial_term_id, term_length), 1)
            await client.wait_for_signal(signal_is(RecordingSignal.EXTEND, rid), 10)
            await offer_all(pub, [b"%04d" % i * 25 for i in range(500)])
            await wait_recorded(client, rid, pub.position)
            pub.close()
            await client.wait_for_signal(signal_is(RecordingSignal.STOP, rid), 10)
            catalog = Catalog.from_bytes((adir / "archive.catalog").read_bytes())
            d = catalog.get(rid)
            assert d.frame_checksums_from == stop
            from cluster_node.archive.frame_walk import checks_text, verify_recording

            assert checks_text(d).startswith(f"structure only before position {stop}")
            assert verify_recording(adir, d).ok
            # A flipped bit after the extension point is found; the replay stops before it.
            frames = [f for f in iter_frames(adir, d) if f.frame_type == 1 and f.position > stop]
            victim = frames[len(frames) // 2]
            base = victim.position - victim.position % d.segment_file_length
            path = adir / segment_file_name(rid, base)
            data = bytearray(path.read_bytes())
            data[victim.position - base + 40] ^= 1
            path.write_bytes(bytes(data))
            result = verify_recording(adir, d)
            assert not result.ok and result.bad_position == victim.position
            sub = driver.add_subscription("aeron:ipc", 61)
            replay_id = await client.start_replay(rid, 0, d.stop_position, "aeron:ipc", 61)
            last = [0]
            with trio.fail_after(20):
                while not damaged:
                    image = sub.image_by_session_id(_sid(replay_id))
                    if image is None or not image.poll(lambda b, o, n, h: last.__setitem__(0, h.position), 100):
                        await sub.wait(0.02)
            assert f"damaged at position {victim.position}" in damaged[0]
            assert stop < last[0] <= victim.position
            await client.close()
