"""Snapshots written to and read from a real archive: through the driver (the consensus module's
way) and through a separate IPC transport (the service thread's way)."""

from __future__ import annotations

import pytest
import trio

from cluster_node.archive.client import ArchiveClient
from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.media.driver import open_media_driver
from cluster_node.media.ipc import IpcTransport
from cluster_node.snapshot_io import (
    MAX_SNAPSHOT_RECORD_LENGTH,
    IpcDriver,
    SnapshotIOError,
    read_recording,
    record_snapshot,
)


async def test_record_and_read_back_through_driver_and_ipc_transport(tmp_path):
    async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=64 * 1024) as driver:
        async with open_archive(driver, ArchiveConfig(dir=tmp_path / "archive", segment_file_length=16 << 20)):
            client = await ArchiveClient.connect(driver)
            records = [b"", b"a" * 10, bytes(range(256)) * 40, b"z" * 100_000] + [b"r%d" % i for i in range(2000)]
            with trio.fail_after(30):
                rid = await record_snapshot(client, driver, records, 107)
                assert await read_recording(client, driver, rid) == records
            # The service thread's way: its own IPC transport and archive client.
            ipc = IpcTransport(driver.dir)
            try:
                idriver = IpcDriver(ipc)
                sclient = await ArchiveClient.connect(idriver)
                with trio.fail_after(30):
                    rid2 = await record_snapshot(sclient, idriver, records[:50], 106)
                    assert rid2 != rid
                    assert await read_recording(sclient, idriver, rid2) == records[:50]
                    assert await read_recording(sclient, idriver, rid) == records
                    with pytest.raises(SnapshotIOError, match="exceeds"):
                        await record_snapshot(sclient, idriver, [b"x" * (MAX_SNAPSHOT_RECORD_LENGTH + 1)], 106)
                    # A failed snapshot leaves the archive able to record the next one.
                    rid3 = await record_snapshot(sclient, idriver, [b"after"], 106)
                    assert await read_recording(sclient, idriver, rid3) == [b"after"]
                await sclient.close()
            finally:
                ipc.close()
            await client.close()
