"""A flood of bad archive requests is counted, and logged once plus one summary (not once each)."""

from __future__ import annotations

import structlog
import trio

from cluster_node.archive.conductor import ArchiveConfig, open_archive
from cluster_node.media.driver import open_media_driver

TERM = 64 * 1024
FLOOD = 2000


async def test_a_flood_of_undecodable_requests_is_logged_once_and_summarised(tmp_path):
    with structlog.testing.capture_logs() as logs:
        async with open_media_driver(dir=tmp_path / "driver", ipc_term_length=TERM) as driver:
            async with open_archive(
                driver, ArchiveConfig(dir=tmp_path / "archive", segment_file_length=TERM)
            ) as archive:
                raw = driver.add_publication("aeron:ipc", 10)
                with trio.fail_after(30):
                    sent = 0
                    while sent < FLOOD:
                        if raw.offer(b"\x00garbage") > 0:
                            sent += 1
                        else:
                            await trio.sleep(0.001)
                    while archive.invalid_requests < FLOOD:
                        await trio.sleep(0.01)
                raw.close()
    lines = [e for e in logs if e["event"] == "undecodable archive request dropped"]
    # The first one at once; the rest in one summary when the archive closed.
    assert len(lines) == 2, lines[:5]
    assert "repeated" not in lines[0] and lines[1]["repeated"] == FLOOD - 1
