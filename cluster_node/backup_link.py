"""The I/O of the backup state machine (``consensus/backup.py``), shared by ``cluster-node
backup`` (``backup_node.py``) and a member seeding its empty directory (``consensus/agent.py``).

``BackupLink`` sends BackupQuery to the members' consensus endpoints and reads their
BackupResponses on a response endpoint of its own (and a member's Challenge, answered with the
credentials it was given, or its refusal: ``consensus/backup_auth.py``); ``retrieve_snapshot``
replicates one snapshot recording from a member's archive into the local one; ``create_empty_recording`` makes the
empty log recording a seeded member starts from. Every channel comes from
``backup_channels.py``.
"""

from __future__ import annotations

import random

import msgspec
import structlog
import trio

from cluster_node import codecs
from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.archive.codecs import ControlResponseCode, RecordingSignal
from cluster_node.backup_channels import archive_control_channel, consensus_channel, response_channel
from cluster_node.codecs import CONSENSUS_CODEC, EGRESS_CODEC, CodecError, peek_template_id
from cluster_node.media.distinct_errors import DistinctErrors

__all__ = ["BackupLink", "retrieve_snapshot", "create_empty_recording"]

log = structlog.get_logger("cluster_node.backup")


class BackupLink:
    """Queries out to the members, their answers in (see the module docstring).

    Each query goes out with a correlation id of the link's own, one per member and query, so
    that a Challenge or a refusal (which name no member) is known to come from the member that
    was asked, and the ChallengeResponse goes back to that member only; the core's correlation
    id is put back into each BackupResponse. A refusal naming no id of ours (forged, or late) is
    bad input like any other. ``credentials`` (a client credentials supplier: the id sent in the
    query, the answer to a Challenge; ``cluster_node.client.credentials``) is None for none."""

    def __init__(
        self,
        driver,
        members,
        *,
        consensus_stream_id: int,
        consensus_term_length: int,
        response_endpoint: str,
        auth: bool = False,
        credentials=None,
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
        self.credentials = credentials
        self._unsent: dict[tuple[int, str], bytes] = {}
        self._asked: dict[int, tuple[int, int]] = {}
        """Our correlation id -> (member asked, the core's correlation id): the latest query to
        each member only (an answer to an older one is late anyway)."""
        self._refusals: list[tuple[int, str, bool]] = []
        self.errors = DistinctErrors("cluster_node.backup")
        """Bad datagrams on our response endpoint: counted, each kind said once, dropped."""

    def send_query(self, member_id: int, correlation_id: int) -> None:
        """Offered now or, while the member's channel connects, at each ``poll``."""
        for wire, (member, _) in list(self._asked.items()):
            if member == member_id:
                del self._asked[wire]
        wire = random.randrange(1 << 40, 1 << 62)
        self._asked[wire] = (member_id, correlation_id)
        credentials = self.credentials.encoded_credentials() if self.credentials is not None else b""
        query = codecs.BackupQuery(
            wire, self.response_stream_id, codecs.CONSENSUS_PROTOCOL_VERSION, self.response_channel, credentials
        )
        self._unsent[(member_id, "query")] = CONSENSUS_CODEC.encode(query)
        self._flush()

    def _flush(self) -> None:
        for key, data in list(self._unsent.items()):
            if self._pubs[key[0]].offer(data) > 0:
                del self._unsent[key]

    def drain_refusals(self) -> list[tuple[int, str, bool]]:
        """(member id, the member's one line, final) for each query refused since the last call;
        final: the credentials were refused (AUTHENTICATION_REJECTED), not final: the member
        could not decide now (ERROR: busy), ask again later."""
        refusals, self._refusals = self._refusals, []
        return refusals

    def _bad(self, key: str, message: str) -> None:
        self.errors.record(key, message)

    def _on_challenge(self, msg: codecs.Challenge) -> None:
        asked = self._asked.get(msg.correlation_id)
        if asked is None:
            self._bad("unexpected Challenge", "a Challenge answering no query of ours dropped")
            return
        member_id = asked[0]
        if self.credentials is None:
            self._refusals.append(
                (
                    member_id,
                    f"member {member_id} asks for credentials and this backup has none (backup.credentials_file)",
                    True,
                )
            )
            return
        try:
            answer = self.credentials.on_challenge(bytes(msg.encoded_challenge))
        except Exception as e:  # noqa: BLE001 - a supplier that cannot answer refuses
            self._refusals.append(
                (member_id, f"member {member_id} asks for an answer this backup cannot give: {e}", True)
            )
            return
        response = codecs.ChallengeResponse(msg.correlation_id, msg.cluster_session_id, answer)
        self._unsent[(member_id, "challenge")] = CONSENSUS_CODEC.encode(response)

    def _on_event(self, msg: codecs.SessionEvent) -> None:
        asked = self._asked.pop(msg.correlation_id, None)
        if asked is None or msg.code not in (codecs.EventCode.AUTHENTICATION_REJECTED, codecs.EventCode.ERROR):
            self._bad("unexpected SessionEvent", "a SessionEvent answering no query of ours dropped")
            return
        final = msg.code == codecs.EventCode.AUTHENTICATION_REJECTED
        self._refusals.append((asked[0], msg.detail or f"member {asked[0]} refused the query", final))

    def poll(self) -> list[codecs.BackupResponse]:
        self._flush()
        got: list[codecs.BackupResponse] = []

        def handler(buf, offset, length, header) -> None:
            data = buf[offset : offset + length]
            try:
                # A member's refusal and its Challenge are the client protocol's (egress) messages.
                egress = peek_template_id(data) in _EGRESS_TEMPLATES
                msg = (EGRESS_CODEC if egress else CONSENSUS_CODEC).decode(data)
            except CodecError as e:
                self._bad("bad response", f"an undecodable message on the backup's response channel dropped: {e}")
                return
            t = type(msg)
            if t is codecs.BackupResponse:
                asked = self._asked.get(msg.correlation_id)
                if asked is None:
                    return  # late: an answer to a query asked again since
                got.append(msgspec.structs.replace(msg, correlation_id=asked[1]))
            elif t is codecs.Challenge:
                self._on_challenge(msg)
            elif t is codecs.SessionEvent:
                self._on_event(msg)
            else:
                self._bad(
                    f"unexpected {t.__name__}",
                    f"a message other than BackupResponse on the backup's response channel dropped: {t.__name__}",
                )

        self.subscription.poll(handler, 16)
        self._flush()
        return got

    async def wait(self, timeout_s: float) -> None:
        await self.subscription.wait(timeout_s)

    def close(self) -> None:
        for pub in self._pubs.values():
            pub.close()
        self.subscription.close()


_EGRESS_TEMPLATES = frozenset({codecs.Challenge.TEMPLATE_ID, codecs.SessionEvent.TEMPLATE_ID})


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
