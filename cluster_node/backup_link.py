"""The I/O of the backup state machine (``consensus/backup.py``), shared by ``cluster-node
backup`` (``backup_node.py``) and a member seeding its empty directory (``consensus/agent.py``).

``BackupLink`` sends BackupQuery to the members' consensus endpoints and reads their
BackupResponses on a response endpoint of its own; ``retrieve_snapshot`` replicates one snapshot
recording from a member's archive into the local one; ``create_empty_recording`` makes the
empty log recording a seeded member starts from. Every channel comes from
``backup_channels.py``.
"""

from __future__ import annotations

import random

import structlog
import trio

from cluster_node import codecs
from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.archive.codecs import ControlResponseCode, RecordingSignal
from cluster_node.backup_channels import archive_control_channel, consensus_channel, response_channel
from cluster_node.codecs import CONSENSUS_CODEC, CodecError
from cluster_node.media.distinct_errors import DistinctErrors

__all__ = ["BackupLink", "retrieve_snapshot", "create_empty_recording"]

log = structlog.get_logger("cluster_node.backup")


class BackupLink:
    """Queries out to the members, their answers in (see the module docstring)."""

    def __init__(
        self,
        driver,
        members,
        *,
        consensus_stream_id: int,
        consensus_term_length: int,
        response_endpoint: str,
        auth: bool = False,
    ) -> None:
        self.driver = driver
        self.response_channel = response_channel(response_endpoint)
        self.response_stream_id = random.randrange(1_000_000, 2**31 - 1)
        self.subscription = driver.add_subscription(self.response_channel, self.response_stream_id)
        self.members = {m.id: m for m in members}
        self._pubs = {
            m.id: driver.add_publication(
                consensus_channel(m.consensus, consensus_term_length, auth), consensus_stream_id, exclusive=False
            )
            for m in members
        }
        self._unsent: dict[int, bytes] = {}
        self.errors = DistinctErrors("cluster_node.backup")
        """Bad datagrams on our response endpoint: counted, each kind said once, dropped."""

    def send_query(self, member_id: int, correlation_id: int) -> None:
        """Offered now or, while the member's channel connects, at each ``poll``."""
        query = codecs.BackupQuery(
            correlation_id, self.response_stream_id, codecs.CONSENSUS_PROTOCOL_VERSION, self.response_channel
        )
        self._unsent[member_id] = CONSENSUS_CODEC.encode(query)
        self._flush()

    def _flush(self) -> None:
        for member_id, data in list(self._unsent.items()):
            if self._pubs[member_id].offer(data) > 0:
                del self._unsent[member_id]

    def poll(self) -> list[codecs.BackupResponse]:
        self._flush()
        got: list[codecs.BackupResponse] = []

        def handler(buf, offset, length, header) -> None:
            try:
                msg = CONSENSUS_CODEC.decode(buf[offset : offset + length])
            except CodecError as e:
                self.errors.record(
                    "bad response", f"an undecodable message on the backup's response channel dropped: {e}"
                )
                return
            if type(msg) is codecs.BackupResponse:
                got.append(msg)
            else:
                self.errors.record(
                    f"unexpected {type(msg).__name__}",
                    "a message other than BackupResponse on "
                    f"the backup's response channel dropped: {type(msg).__name__}",
                )

        self.subscription.poll(handler, 16)
        return got

    async def wait(self, timeout_s: float) -> None:
        await self.subscription.wait(timeout_s)

    def close(self) -> None:
        for pub in self._pubs.values():
            pub.close()
        self.subscription.close()


async def retrieve_snapshot(
    archive: ArchiveClient,
    member,
    snapshot: codecs.BackupSnapshot,
    *,
    control_stream_id: int,
    timeout_s: float,
    auth: bool = False,
) -> int:
    """Replicate ``snapshot``'s recording from ``member``'s archive into a new local recording;
    its id. ArchiveError when the replication fails or does not end within ``timeout_s``."""
    await archive.replicate(
        snapshot.recording_id,
        codecs.NULL_VALUE,
        archive_control_channel(member.archive, auth),
        src_control_stream_id=control_stream_id,
    )
    correlation_id = archive.last_correlation_id
    with trio.move_on_after(timeout_s):
        while True:
            archive.poll()
            for s in list(archive.signals):
                if s.correlation_id == correlation_id and s.signal == RecordingSignal.REPLICATE_END:
                    archive.signals.remove(s)
                    failed = [
                        r
                        for r in archive.async_responses
                        if r.correlation_id == correlation_id and r.code == ControlResponseCode.ERROR
                    ]
                    if failed:
                        archive.async_responses.remove(failed[0])
                        raise ArchiveError(
                            f"snapshot recording {snapshot.recording_id} of member {member.id}: "
                            f"{failed[0].error_message}"
                        )
                    log.info(
                        "snapshot retrieved",
                        member=member.id,
                        src_recording_id=snapshot.recording_id,
                        dst_recording_id=s.recording_id,
                        log_position=snapshot.log_position,
                        service_id=snapshot.service_id,
                    )
                    return s.recording_id
            await archive.subscription.wait(0.05)
    raise ArchiveError(
        f"snapshot recording {snapshot.recording_id} of member {member.id} was not copied within {timeout_s}s"
    )


async def create_empty_recording(archive: ArchiveClient, driver, channel: str, stream_id: int) -> int:
    """An empty recording of ``channel`` (an IPC channel starting at the position the recording
    must start at): the archive records a publication nobody writes to, then stops."""
    await archive.start_recording("aeron:ipc", stream_id)
    pub = driver.add_publication(channel, stream_id)
    try:
        signal = await archive.wait_for_signal(lambda s: s.signal == RecordingSignal.START, 10.0)
    finally:
        await archive.stop_recording("aeron:ipc", stream_id)
        pub.close()
    return signal.recording_id
