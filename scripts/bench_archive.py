#!/usr/bin/env python3
"""Archive benchmark: recording and replay throughput beside plain-Python file I/O.

    .venv/bin/python scripts/bench_archive.py [--quick] [--no-checksums]

Everything runs in one process, on files in a temporary directory (``--dir`` to choose one):

* **recording**, for 32-byte and 1 KiB messages, at sync levels 0 and 1: an IPC publication fills
  its window (half a term) with messages, then the archive's :class:`RecordingSession` drains it
  to segment files (``Image.block_poll`` + one ``pwrite`` per block); repeated until the volume is
  written. The figure is bytes recorded per second of recorder time (the time spent in
  ``RecordingSession.do_work``), i.e. how fast the archive can record a stream that arrives at
  full speed; the Python publisher's own time is not counted (it is reported separately as
  ``publisher_mb_per_s``: offering small messages from Python is far slower than recording them).
* **baseline write**: the same number of bytes written to a file with ``os.write`` in blocks of
  the recorder's average block size (and, for sync level 1, with ``fdatasync`` after each block).
* **replay**: the recording replayed by the archive (``open_archive``, ``ArchiveClient.start_replay``)
  to an IPC subscription in the same process that consumes whole blocks; bytes per second from
  the replay request to the last byte received.
* **baseline read**: the segment files read back with ``os.preadv`` in the replay's read size.

Recordings carry frame checksums as the archive's default does (``ArchiveConfig.frame_checksums``,
``cluster_node.archive.checksums``); ``--no-checksums`` records without them, for the cost side by side.

The page cache is warm in both the archive's and the baseline's runs, so the figures compare CPU
work, not disks. The last line printed is one JSON object. ``--quick`` finishes within 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio

from cluster_node.archive.catalog import Catalog
from cluster_node.archive.client import ArchiveClient
from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.archive.recorder import RecordingSession
from cluster_node.archive.storage import CatalogStore, SegmentWriter
from cluster_node.media.driver import open_media_driver

TERM = 16 * 1024 * 1024
SEGMENT = 128 * 1024 * 1024
BLOCK = 1024 * 1024
CHECKSUMS = ArchiveConfig.frame_checksums


class _Counter:
    def __init__(self) -> None:
        self.value = 0

    def set(self, v: int) -> None:
        self.value = v

    def close(self) -> None:
        pass


async def bench_record(directory: Path, message_size: int, total_bytes: int, sync_level: int) -> dict:
    """Record ``total_bytes`` of ``message_size`` messages; return figures and the recording's path."""
    rec_dir = directory / f"rec-{message_size}-s{sync_level}"
    async with open_media_driver(dir=directory / f"drv-{message_size}-{sync_level}", ipc_term_length=TERM) as driver:
        sub = driver.add_subscription("aeron:ipc", 5)
        pub = driver.add_publication("aeron:ipc", 5)
        while not sub.images:
            await sub.wait(0.05)
        image = sub.images[0]
        store = CatalogStore(rec_dir, sync_level)
        rid = store.catalog.add_recording(
            control_session_id=0,
            correlation_id=0,
            start_timestamp=time.time_ns(),
            start_position=0,
            initial_term_id=pub.initial_term_id,
            segment_file_length=SEGMENT,
            term_buffer_length=TERM,
            mtu_length=pub.mtu,
            session_id=pub.session_id,
            stream_id=5,
            stripped_channel="aeron:ipc",
            original_channel="aeron:ipc",
            source_identity="bench",
            frame_checksums=CHECKSUMS,
        )
        store.flush()
        d = store.catalog.get(rid)
        writer = SegmentWriter(rec_dir, d, 0, sync_level)
        blocks = []

        def progress(_rid, _pos):
            pass

        session = RecordingSession(
            recording_id=rid,
            image=image,
            writer=writer,
            position_counter=_Counter(),
            subscription_id=0,
            control_session_id=0,
            correlation_id=0,
            auto_stop=False,
            on_progress=progress,
            block_length=BLOCK,
            max_blocks_per_work=1,
        )
        message = bytes(range(256)) * (message_size // 256) + bytes(message_size % 256)
        record_s = 0.0
        publish_s = 0.0
        offer = pub.offer
        while pub.position < total_bytes:
            t0 = time.perf_counter()
            while offer(message) > 0 and pub.position < total_bytes:
                pass
            t1 = time.perf_counter()
            publish_s += t1 - t0
            while True:
                before = writer.position
                n = session.do_work()
                if n == 0:
                    break
                blocks.append(writer.position - before)
            record_s += time.perf_counter() - t1
        end = writer.position
        session.close()
        store.catalog.update_recording_stopped(rid, end, time.time_ns())
        store.close()
        pub.close()
        sub.close()
    return {
        "bytes": end,
        "record_mb_per_s": end / record_s / 1e6,
        "publisher_mb_per_s": end / publish_s / 1e6,
        "avg_block": end // max(1, len(blocks)),
        "dir": rec_dir,
        "recording_id": rid,
    }


def bench_write_baseline(directory: Path, total_bytes: int, block: int, sync: bool) -> float:
    path = directory / f"baseline-{block}-{int(sync)}.dat"
    data = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    t0 = time.perf_counter()
    while written < total_bytes:
        n = os.write(fd, data)
        if sync:
            os.fdatasync(fd)
        written += n
    elapsed = time.perf_counter() - t0
    os.close(fd)
    path.unlink()
    return written / elapsed / 1e6


def bench_read_baseline(rec_dir: Path, chunk: int) -> float:
    total = 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    files = sorted(p for p in rec_dir.iterdir() if p.suffix == ".rec")
    t0 = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        offset = 0
        while True:
            n = os.preadv(fd, [view], offset)
            if n <= 0:
                break
            offset += n
            total += n
        os.close(fd)
    return total / (time.perf_counter() - t0) / 1e6


async def bench_replay(directory: Path, rec_dir: Path, recording_id: int) -> dict:
    d = Catalog.from_bytes((rec_dir / "archive.catalog").read_bytes()).get(recording_id)
    async with open_media_driver(dir=directory / "drv-replay", ipc_term_length=TERM) as driver:
        async with open_archive(driver, ArchiveConfig(dir=rec_dir, segment_file_length=SEGMENT)):
            client = await ArchiveClient.connect(driver)
            sub = driver.add_subscription("aeron:ipc", 77)
            t0 = time.perf_counter()
            replay_id = await client.start_replay(recording_id, 0, d.stop_position, "aeron:ipc", 77)
            sid = replay_id & 0xFFFFFFFF
            sid = sid - 2**32 if sid & 0x80000000 else sid
            received = 0

            def consume(_buf, _off, length, _pos):
                nonlocal received
                received += length

            with trio.fail_after(120):
                while received < d.stop_position:
                    image = sub.image_by_session_id(sid)
                    if image is None or image.block_poll(consume, BLOCK) == 0:
                        await sub.wait(0.01)
            elapsed = time.perf_counter() - t0
            await client.close()
    return {"bytes": received, "replay_mb_per_s": received / elapsed / 1e6}


def recovery_scan_mb_per_s(term_length: int = 1 << 20, terms: int = 8) -> float:
    """How fast crash recovery walks a recording's frames (``cluster_node.archive.segments.scan_frames``,
    which the archive runs over an active recording's last segment on start), over 1 KiB
    frames in memory, best of three."""
    from cluster_node.archive.segments import _HEADER, scan_frames

    buf = bytearray(terms * term_length)
    pos = 0
    while pos + 1088 <= len(buf):
        term_offset = pos & (term_length - 1)
        if term_offset + 1088 > term_length:  # pad to the end of the term
            _HEADER.pack_into(
                buf, pos, term_length - term_offset, 0, 0xC0, 0, term_offset, 7, 100, pos // term_length, 0
            )
            pos += term_length - term_offset
            continue
        _HEADER.pack_into(buf, pos, 1056, 0, 0xC0, 1, term_offset, 7, 100, pos // term_length, 0)
        pos += 1056
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        end = scan_frames(buf, 0, len(buf), term_length=term_length, stream_id=100)
        best = min(best, time.perf_counter() - t)
    assert end > len(buf) - 2 * 1088, end
    return round(len(buf) / best / 1e6, 1)


async def main(args) -> dict:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bench-archive-"))
    base.mkdir(parents=True, exist_ok=True)
    volume = (32 if args.quick else 256) * 1024 * 1024
    sizes = {"32B": 32, "1KiB": 1024}
    results: dict = {"record": {}, "replay": {}}
    for label, size in sizes.items():
        for sync_level in (0, 1):
            vol = volume if sync_level == 0 else volume // 4
            r = await bench_record(base, size, vol, sync_level)
            w = bench_write_baseline(base, r["bytes"], r["avg_block"], sync=sync_level == 1)
            results["record"][f"{label}_sync{sync_level}"] = {
                "record_mb_per_s": round(r["record_mb_per_s"], 1),
                "publisher_mb_per_s": round(r["publisher_mb_per_s"], 1),
                "baseline_write_mb_per_s": round(w, 1),
                "avg_block_bytes": r["avg_block"],
                "bytes": r["bytes"],
            }
            print(
                f"record {label} sync{sync_level}: {r['record_mb_per_s']:.0f} MB/s "
                f"(plain write {w:.0f} MB/s, blocks {r['avg_block']} B; publisher {r['publisher_mb_per_s']:.0f} MB/s)",
                flush=True,
            )
            if sync_level == 0:
                rp = await bench_replay(base, r["dir"], r["recording_id"])
                rd = bench_read_baseline(r["dir"], min(BLOCK, TERM // 4))
                results["replay"][label] = {
                    "replay_mb_per_s": round(rp["replay_mb_per_s"], 1),
                    "baseline_read_mb_per_s": round(rd, 1),
                    "bytes": rp["bytes"],
                }
                print(f"replay {label}: {rp['replay_mb_per_s']:.0f} MB/s (plain read {rd:.0f} MB/s)", flush=True)
    rec = results["record"]
    rep = results["replay"]
    summary = {
        # Headline figures are for 1 KiB messages; every size is in "detail".
        "record_mb_per_s": {
            "sync0": rec["1KiB_sync0"]["record_mb_per_s"],
            "sync1": rec["1KiB_sync1"]["record_mb_per_s"],
        },
        "replay_mb_per_s": rep["1KiB"]["replay_mb_per_s"],
        "baseline": {
            "write_mb_per_s": rec["1KiB_sync0"]["baseline_write_mb_per_s"],
            "read_mb_per_s": rep["1KiB"]["baseline_read_mb_per_s"],
            "write_sync1_mb_per_s": rec["1KiB_sync1"]["baseline_write_mb_per_s"],
        },
        "record_32B_mb_per_s": {
            "sync0": rec["32B_sync0"]["record_mb_per_s"],
            "sync1": rec["32B_sync1"]["record_mb_per_s"],
        },
        "replay_32B_mb_per_s": rep["32B"]["replay_mb_per_s"],
        "recovery_scan_mb_per_s": recovery_scan_mb_per_s(),
        "detail": results,
        "quick": args.quick,
        "frame_checksums": CHECKSUMS,
    }
    if not args.dir:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    return summary


if __name__ == "__main__":
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller volumes, within 30 s")
    p.add_argument("--dir", help="directory for the files (default: a temporary one, removed after)")
    p.add_argument("--no-checksums", action="store_true", help="record without frame checksums")
    args = p.parse_args()
    CHECKSUMS = CHECKSUMS and not args.no_checksums
    summary = trio.run(main, args)
    from calibration import calibration

    summary["calibration"] = calibration()
    print(json.dumps(summary))
