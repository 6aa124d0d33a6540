"""Writing a snapshot into an archive recording, and reading one back.

Both the consensus module (conductor thread) and the service container (service thread) store
their snapshots the same way, through the archive's control protocol and IPC:

* record: ask the archive to record ``aeron:ipc?session-id=S`` on the snapshot stream (106 for a
  service, 107 for the consensus module) with auto-stop, add the exclusive publication of that
  session, wait for the recording's START signal (the archive has joined, at position 0), offer
  the records (one message each, fragmented when larger than a frame), close the publication and
  wait for the STOP signal at the publication's final position. The recording then holds exactly
  the records, and its id names the snapshot in recording.log.
* read: ask for a replay of the whole recording, subscribe to that replay's session only (the
  archive waits for a subscriber before it sends), and collect every message until the
  recording's stop position.

``driver`` is anything with ``add_publication(channel, stream_id)`` and
``add_subscription(channel, stream_id)`` taking channel strings: the node's media driver, or the
service thread's IPC transport wrapped by :class:`IpcDriver`.
"""

from __future__ import annotations

import random

import trio

from cluster_node.archive.client import ArchiveClient, ArchiveError
from cluster_node.archive.codecs import RecordingSignal
from cluster_node.identifiers import StreamIds
from cluster_node.media.channel import parse

__all__ = [
    "IpcDriver",
    "SnapshotIOError",
    "record_snapshot",
    "read_recording",
    "SNAPSHOT_TERM_LENGTH",
    "MAX_SNAPSHOT_RECORD_LENGTH",
    "REPLAY_STREAM_ID",
]

SNAPSHOT_TERM_LENGTH = 16 * 1024 * 1024
MAX_SNAPSHOT_RECORD_LENGTH = SNAPSHOT_TERM_LENGTH // 8
"""The largest record a snapshot can hold (a publication's largest message: a term / 8)."""
REPLAY_STREAM_ID = StreamIds.REPLAY


class SnapshotIOError(Exception):
    """A snapshot could not be written or read (one line)."""


class IpcDriver:
    """An ``IpcTransport`` (the service thread's) with the driver's string-channel methods."""

    def __init__(self, ipc) -> None:
        self.ipc = ipc

    def add_publication(self, channel: str, stream_id: int, exclusive: bool = True):
        return self.ipc.add_publication(parse(channel), stream_id, exclusive)

    def add_subscription(self, channel: str, stream_id: int):
        return self.ipc.add_subscription(parse(channel), stream_id)


async def _signal(archive: ArchiveClient, predicate, timeout_s: float, what: str):
    """Wait for a recording signal matching ``predicate``; only that one is taken off the queue
    (the consensus agent reads the log recording's signals from the same client)."""
    with trio.move_on_after(timeout_s):
        while True:
            archive.poll()
            for s in archive.signals:
                if predicate(s):
                    archive.signals.remove(s)
                    return s
            await archive.subscription.wait(0.02)
    raise SnapshotIOError(f"no {what} signal from the archive within {timeout_s:g}s")


async def record_snapshot(
    archive: ArchiveClient,
    driver,
    records,
    stream_id: int,
    *,
    timeout_s: float = 10.0,
    rng: random.Random | None = None,
) -> int:
    """Record ``records`` (an iterable of bytes) as a new recording; its recording id."""
    records = list(records)
    for record in records:
        if len(record) > MAX_SNAPSHOT_RECORD_LENGTH:
            raise SnapshotIOError(
                f"a snapshot record of {len(record)} bytes exceeds the {MAX_SNAPSHOT_RECORD_LENGTH}-byte limit"
            )
    session_id = (rng or random.Random()).randrange(1, 2**31 - 1)
    source = f"aeron:ipc?session-id={session_id}"
    try:
        subscription_id = await archive.start_recording(source, stream_id, auto_stop=True)
    except ArchiveError as e:
        raise SnapshotIOError(f"the archive refused to record the snapshot: {e}") from None
    pub = driver.add_publication(
        f"aeron:ipc?alias=snapshot|term-length={SNAPSHOT_TERM_LENGTH}|session-id={session_id}", stream_id
    )
    recording_id = None
    try:
        start = await _signal(
            archive,
            lambda s: s.subscription_id == subscription_id and s.signal == RecordingSignal.START,
            timeout_s,
            "recording START",
        )
        recording_id = start.recording_id
        with trio.move_on_after(timeout_s) as scope:
            for record in records:
                while True:
                    result = pub.offer(record)
                    if result > 0:
                        break
                    if pub.closed:
                        raise SnapshotIOError("the snapshot publication closed while writing")
                    await trio.sleep(0.0005)  # back-pressure: the recorder is behind
        if scope.cancelled_caught:
            raise SnapshotIOError(f"the snapshot was not written within {timeout_s:g}s (archive back-pressure)")
        final = pub.position
        pub.close()
        stop = await _signal(
            archive,
            lambda s: s.recording_id == recording_id and s.signal == RecordingSignal.STOP,
            timeout_s,
            "recording STOP",
        )
        if stop.position != final:
            raise SnapshotIOError(
                f"snapshot recording {recording_id} stopped at {stop.position}, written up to {final}"
            )
        return recording_id
    except BaseException:
        if not pub.closed:
            pub.close()
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await archive.stop_recording(source, stream_id)
            except ArchiveError:
                pass
        raise


async def read_recording(
    archive: ArchiveClient, driver, recording_id: int, *, stream_id: int = REPLAY_STREAM_ID, timeout_s: float = 30.0
) -> list[bytes]:
    """Every message of a stopped recording, in order (a snapshot's records)."""
    try:
        start = await archive.get_start_position(recording_id)
        stop = await archive.get_stop_position(recording_id)
    except ArchiveError as e:
        raise SnapshotIOError(f"snapshot recording {recording_id}: {e}") from None
    if stop < 0:
        raise SnapshotIOError(f"snapshot recording {recording_id} is still active")
    if stop <= start:
        return []
    replay_session_id = await archive.start_replay(recording_id, start, stop - start, "aeron:ipc", stream_id)
    session_id = replay_session_id & 0xFFFFFFFF
    if session_id >= 2**31:
        session_id -= 2**32
    sub = driver.add_subscription(f"aeron:ipc?session-id={session_id}", stream_id)
    records: list[bytes] = []

    def on_fragment(buf, offset, length, header) -> None:
        records.append(bytes(buf[offset : offset + length]))

    try:
        with trio.move_on_after(timeout_s):
            while True:
                image = sub.image_by_session_id(session_id)
                if image is not None:
                    image.poll(on_fragment, 256)
                    if image.position >= stop:
                        return records
                    if image.closed or image.is_end_of_stream:
                        if not image.has_data():
                            raise SnapshotIOError(
                                f"snapshot recording {recording_id}: replay ended at {image.position} before {stop}"
                            )
                        continue
                await sub.wait(0.05)
        raise SnapshotIOError(f"snapshot recording {recording_id} was not read within {timeout_s:g}s")
    finally:
        sub.close()
