"""ArchiveClient: the control protocol from the client side (the consensus module, tools, tests).

A client owns a request publication to the archive's control channel and a response subscription
on its own response channel. ``connect`` sends ConnectRequest and waits for the archive to open
its response publication and answer with the control session id. Each request then carries that
id and a fresh correlation id; the matching response (or, for listings, the descriptors and the
closing response) is awaited with a deadline (``response_timeout_s``, 10 s by default, as the
reference). Correlation ids start at a random value so that clients sharing a response stream
cannot take each other's answers.

Messages that arrive while no request waits for them are not lost:

* recording signals go to :attr:`ArchiveClient.signals` (a bounded deque) and to ``on_signal``;
* ControlResponses nobody awaited (an extension refused when the image arrived, an error of a
  replication, ...) go to :attr:`ArchiveClient.async_responses`.

:meth:`poll` reads what has arrived without waiting (for a duty cycle); :meth:`wait_for_signal`
waits for a signal matching a predicate. An ERROR response raises :class:`ArchiveError`.

On IPC every client subscribes to its own response stream id (random unless given): an IPC
subscription sees every publication of its stream, and a client that is not reading must not
hold back the archive's answers to the others.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

import trio

from cluster_node.archive import codecs as c
from cluster_node.archive.codecs import ControlResponseCode, RecordingSignal
from cluster_node.media.channel import parse
from cluster_node.media.counters import CountersReader

__all__ = ["ArchiveClient", "ArchiveError", "find_recording_position_counter"]

_MAX_SIGNALS = 10_000


class ArchiveError(Exception):
    """The archive refused a request (or did not answer in time: ``code`` None)."""

    def __init__(
        self, message: str, code: ControlResponseCode | None = None, error_code: int = 0, correlation_id: int = 0
    ) -> None:
        super().__init__(message)
        self.code = code
        self.error_code = error_code
        self.correlation_id = correlation_id


def find_recording_position_counter(reader: CountersReader, recording_id: int) -> int | None:
    """Counter id of an active recording's position in a counters file, or None."""
    from cluster_node.archive.conductor import RECORDING_POSITION_TYPE_ID

    for info in reader.find(type_id=RECORDING_POSITION_TYPE_ID):
        if info.registration_id == recording_id:
            return info.counter_id
    return None


class ArchiveClient:
    """A connected control session. Create with :meth:`connect`; ``await close()`` when done."""

    def __init__(self, driver, publication, subscription, response_timeout_s: float) -> None:
        self.driver = driver
        self.publication = publication
        self.subscription = subscription
        self.response_timeout_s = response_timeout_s
        self.control_session_id = -1
        self._rng = random.Random()
        self._next_correlation_id = self._rng.randrange(1 << 40, 1 << 60)
        self._waiting: dict[int, list] = {}
        self.signals: deque[c.RecordingSignalEvent] = deque(maxlen=_MAX_SIGNALS)
        self.async_responses: deque[c.ControlResponse] = deque(maxlen=_MAX_SIGNALS)
        self.on_signal: Callable[[c.RecordingSignalEvent], None] | None = None
        self.invalid_responses = 0
        self.last_correlation_id = -1
        self.closed = False

    # ------------------------------------------------------------------ connect / close

    @classmethod
    async def connect(
        cls,
        driver,
        *,
        control_channel: str = "aeron:ipc",
        control_stream_id: int = c.CONTROL_REQUEST_STREAM_ID,
        response_channel: str = "aeron:ipc",
        response_stream_id: int | None = None,
        response_timeout_s: float = 10.0,
    ) -> ArchiveClient:
        """Connect to the archive listening on ``control_channel``; ArchiveError on timeout."""
        if response_stream_id is None:
            response_stream_id = (
                random.randrange(1_000_000, 2**31 - 1)
                if parse(response_channel).is_ipc
                else c.CONTROL_RESPONSE_STREAM_ID
            )
        subscription = driver.add_subscription(response_channel, response_stream_id)
        publication = driver.add_publication(control_channel, control_stream_id)
        client = cls(driver, publication, subscription, response_timeout_s)
        try:
            correlation_id = client._new_correlation_id()
            request = c.ConnectRequest(
                correlation_id=correlation_id,
                response_stream_id=response_stream_id,
                version=c.PROTOCOL_SEMANTIC_VERSION,
                response_channel=response_channel,
            )
            await client._send(request)
            response = await client._await(correlation_id)
            client.control_session_id = response.relevant_id
        except BaseException:
            publication.close()
            subscription.close()
            raise
        return client

    async def close(self) -> None:
        """Close the control session (the archive keeps recordings and replays running)."""
        if self.closed:
            return
        self.closed = True
        if self.control_session_id >= 0:
            self.publication.offer(c.encode_request(c.CloseSessionRequest(control_session_id=self.control_session_id)))
        self.publication.close()
        self.subscription.close()

    # ------------------------------------------------------------------ plumbing

    def _new_correlation_id(self) -> int:
        self._next_correlation_id += 1
        return self._next_correlation_id

    async def _send(self, request) -> None:
        data = c.encode_request(request)
        with trio.move_on_after(self.response_timeout_s):
            pause = 0.0002
            while True:
                result = self.publication.offer(data)
                if result > 0:
                    return
                if result < -3:
                    raise ArchiveError("the control publication is closed")
                await trio.sleep(pause)
                pause = min(pause * 2, 0.01)
        raise ArchiveError(
            f"could not send {type(request).__name__} within {self.response_timeout_s}s (is the archive running?)"
        )

    def _on_message(self, buf, offset, length, header) -> None:
        try:
            msg = c.decode_response(buf[offset : offset + length])
        except c.ArchiveCodecError:
            self.invalid_responses += 1
            return
        if self.control_session_id >= 0 and msg.control_session_id != self.control_session_id:
            return  # another client's session on a shared response stream
        if isinstance(msg, c.RecordingSignalEvent):
            self.signals.append(msg)
            if self.on_signal is not None:
                self.on_signal(msg)
            return
        waiting = self._waiting.get(msg.correlation_id)
        if waiting is not None:
            waiting.append(msg)
        elif isinstance(msg, c.ControlResponse):
            self.async_responses.append(msg)

    def poll(self, fragment_limit: int = 64) -> int:
        """Read arrived responses and signals without waiting; return how many."""
        return self.subscription.poll(self._on_message, fragment_limit)

    async def _await(self, correlation_id: int, listing: bool = False):
        """The ControlResponse for ``correlation_id`` (with ``listing``: descriptors before it)."""
        got: list = []
        self._waiting[correlation_id] = got
        try:
            with trio.move_on_after(self.response_timeout_s):
                while True:
                    self.poll()
                    for i, msg in enumerate(got):
                        if isinstance(msg, c.ControlResponse):
                            if msg.code == ControlResponseCode.ERROR:
                                raise ArchiveError(msg.error_message, msg.code, msg.relevant_id, correlation_id)
                            if listing:
                                return got[:i], msg
                            return msg
                    await self.subscription.wait(0.05)
            raise ArchiveError(
                f"no response from the archive within {self.response_timeout_s}s", None, 0, correlation_id
            )
        finally:
            self._waiting.pop(correlation_id, None)

    async def _request(self, cls, **fields) -> c.ControlResponse:
        correlation_id = self._new_correlation_id()
        self.last_correlation_id = correlation_id  # a replication's signals carry it
        await self._send(cls(control_session_id=self.control_session_id, correlation_id=correlation_id, **fields))
        return await self._await(correlation_id)

    # ------------------------------------------------------------------ recording

    async def start_recording(
        self, channel: str, stream_id: int, *, local: bool = True, auto_stop: bool = False
    ) -> int:
        """Record every image of ``channel``/``stream_id``; returns the subscription id."""
        r = await self._request(
            c.StartRecordingRequest2,
            stream_id=stream_id,
            source_location=c.SourceLocation.LOCAL if local else c.SourceLocation.REMOTE,
            auto_stop=auto_stop,
            channel=channel,
        )
        return r.relevant_id

    async def extend_recording(
        self, recording_id: int, channel: str, stream_id: int, *, local: bool = True, auto_stop: bool = False
    ) -> int:
        """Append the next image of ``channel``/``stream_id`` to a stopped recording; it must join at
        the recording's stop position (else an INVALID_EXTENSION error arrives asynchronously)."""
        r = await self._request(
            c.ExtendRecordingRequest2,
            recording_id=recording_id,
            stream_id=stream_id,
            source_location=c.SourceLocation.LOCAL if local else c.SourceLocation.REMOTE,
            auto_stop=auto_stop,
            channel=channel,
        )
        return r.relevant_id

    async def stop_recording(self, channel: str, stream_id: int) -> None:
        await self._request(c.StopRecordingRequest, stream_id=stream_id, channel=channel)

    async def stop_recording_by_identity(self, recording_id: int) -> bool:
        """Stop the recording of ``recording_id``; False if it was not active."""
        r = await self._request(c.StopRecordingByIdentityRequest, recording_id=recording_id)
        return r.relevant_id == 1

    # ------------------------------------------------------------------ queries

    async def list_recording(self, recording_id: int) -> c.RecordingDescriptorMessage | None:
        correlation_id = self._new_correlation_id()
        await self._send(
            c.ListRecordingRequest(
                control_session_id=self.control_session_id, correlation_id=correlation_id, recording_id=recording_id
            )
        )
        got: list = []
        self._waiting[correlation_id] = got
        try:
            with trio.move_on_after(self.response_timeout_s):
                while True:
                    self.poll()
                    for msg in got:
                        if isinstance(msg, c.RecordingDescriptorMessage):
                            return msg
                        if msg.code == ControlResponseCode.RECORDING_UNKNOWN:
                            return None
                        raise ArchiveError(msg.error_message, msg.code, msg.relevant_id, correlation_id)
                    await self.subscription.wait(0.05)
            raise ArchiveError(f"no response from the archive within {self.response_timeout_s}s")
        finally:
            self._waiting.pop(correlation_id, None)

    async def list_recordings(
        self, from_recording_id: int = 0, count: int = 1000
    ) -> list[c.RecordingDescriptorMessage]:
        correlation_id = self._new_correlation_id()
        await self._send(
            c.ListRecordingsRequest(
                control_session_id=self.control_session_id,
                correlation_id=correlation_id,
                from_recording_id=from_recording_id,
                record_count=count,
            )
        )
        descriptors, _end = await self._await(correlation_id, listing=True)
        return descriptors

    async def get_recording_position(self, recording_id: int) -> int:
        """Live position of an active recording; NULL_POSITION (-1) when it is not active."""
        return (await self._request(c.RecordingPositionRequest, recording_id=recording_id)).relevant_id

    async def get_stop_position(self, recording_id: int) -> int:
        return (await self._request(c.StopPositionRequest, recording_id=recording_id)).relevant_id

    async def get_start_position(self, recording_id: int) -> int:
        return (await self._request(c.StartPositionRequest, recording_id=recording_id)).relevant_id

    async def get_max_recorded_position(self, recording_id: int) -> int:
        return (await self._request(c.MaxRecordedPositionRequest, recording_id=recording_id)).relevant_id

    async def find_last_matching_recording(
        self, min_recording_id: int, channel_fragment: str, stream_id: int, session_id: int
    ) -> int:
        r = await self._request(
            c.FindLastMatchingRecordingRequest,
            min_recording_id=min_recording_id,
            session_id=session_id,
            stream_id=stream_id,
            channel=channel_fragment,
        )
        return r.relevant_id

    async def keep_alive(self) -> None:
        await self._request(c.KeepAliveRequest)

    # ------------------------------------------------------------------ replay

    async def start_replay(
        self,
        recording_id: int,
        position: int,
        length: int,
        replay_channel: str,
        replay_stream_id: int,
        *,
        file_io_max_length: int = 0,
    ) -> int:
        """Replay ``length`` bytes from ``position`` (REPLAY_FOLLOW_LENGTH or -1: follow a live
        recording); returns the replay session id, whose low 32 bits are the replay's session id."""
        r = await self._request(
            c.ReplayRequest,
            recording_id=recording_id,
            position=position,
            length=length,
            replay_stream_id=replay_stream_id,
            file_io_max_length=file_io_max_length,
            replay_token=c.NULL_VALUE,
            replay_channel=replay_channel,
        )
        return r.relevant_id

    async def bounded_replay(
        self,
        recording_id: int,
        position: int,
        length: int,
        limit_counter_id: int,
        replay_channel: str,
        replay_stream_id: int,
        *,
        file_io_max_length: int = 0,
    ) -> int:
        r = await self._request(
            c.BoundedReplayRequest,
            recording_id=recording_id,
            position=position,
            length=length,
            limit_counter_id=limit_counter_id,
            replay_stream_id=replay_stream_id,
            file_io_max_length=file_io_max_length,
            replay_token=c.NULL_VALUE,
            replay_channel=replay_channel,
        )
        return r.relevant_id

    async def stop_replay(self, replay_session_id: int) -> None:
        await self._request(c.StopReplayRequest, replay_session_id=replay_session_id)

    async def stop_all_replays(self, recording_id: int = c.NULL_VALUE) -> None:
        await self._request(c.StopAllReplaysRequest, recording_id=recording_id)

    # ------------------------------------------------------------------ truncate, purge

    async def truncate_recording(self, recording_id: int, position: int) -> None:
        await self._request(c.TruncateRecordingRequest, recording_id=recording_id, position=position)

    async def purge_recording(self, recording_id: int) -> None:
        await self._request(c.PurgeRecordingRequest, recording_id=recording_id)

    async def detach_segments(self, recording_id: int, new_start_position: int) -> None:
        """Move the start forward to a segment base; the files before it stay, detached."""
        await self._request(c.DetachSegmentsRequest, recording_id=recording_id, new_start_position=new_start_position)

    async def delete_detached_segments(self, recording_id: int) -> int:
        """Delete the detached segment files; how many there were."""
        return (await self._request(c.DeleteDetachedSegmentsRequest, recording_id=recording_id)).relevant_id

    async def purge_segments(self, recording_id: int, new_start_position: int) -> int:
        """Detach up to ``new_start_position`` (a segment base) and delete those files; how many."""
        return (
            await self._request(
                c.PurgeSegmentsRequest, recording_id=recording_id, new_start_position=new_start_position
            )
        ).relevant_id

    async def attach_segments(self, recording_id: int) -> int:
        """Take back the detached files that join the start; how many."""
        return (await self._request(c.AttachSegmentsRequest, recording_id=recording_id)).relevant_id

    # ------------------------------------------------------------------ replication

    async def replicate(
        self,
        src_recording_id: int,
        dst_recording_id: int,
        src_control_channel: str,
        *,
        src_control_stream_id: int = c.CONTROL_REQUEST_STREAM_ID,
        stop_position: int = c.NULL_POSITION,
        replication_channel: str = "",
        live_destination: str = "",
    ) -> int:
        """Ask this archive to copy ``src_recording_id`` of the archive at ``src_control_channel``
        into ``dst_recording_id`` (NULL_VALUE: a new recording; else extend it from its stop
        position), up to ``stop_position`` (NULL_POSITION: the source's end). Returns the
        replication id; progress arrives as signals (REPLICATE/EXTEND, SYNC, REPLICATE_END, STOP)."""
        r = await self._request(
            c.ReplicateRequest2,
            src_recording_id=src_recording_id,
            dst_recording_id=dst_recording_id,
            stop_position=stop_position,
            channel_tag_id=c.NULL_VALUE,
            subscription_tag_id=c.NULL_VALUE,
            src_control_stream_id=src_control_stream_id,
            file_io_max_length=0,
            replication_session_id=c.NULL_VALUE,
            src_control_channel=src_control_channel,
            live_destination=live_destination,
            replication_channel=replication_channel,
            encoded_credentials=b"",
            src_response_channel="",
        )
        return r.relevant_id

    async def stop_replication(self, replication_id: int) -> None:
        await self._request(c.StopReplicationRequest, replication_id=replication_id)

    # ------------------------------------------------------------------ signals

    async def wait_for_signal(
        self, predicate: Callable[[c.RecordingSignalEvent], bool], timeout_s: float | None = None
    ) -> c.RecordingSignalEvent:
        """The first signal (already received or arriving) that matches ``predicate``; the
        matching signal and those before it are removed from :attr:`signals`."""
        timeout_s = self.response_timeout_s if timeout_s is None else timeout_s
        with trio.move_on_after(timeout_s):
            while True:
                self.poll()
                while self.signals:
                    s = self.signals.popleft()
                    if predicate(s):
                        return s
                await self.subscription.wait(0.05)
        raise ArchiveError(f"no matching recording signal within {timeout_s}s")

    async def wait_for_async_response(
        self, predicate: Callable[[c.ControlResponse], bool], timeout_s: float | None = None
    ) -> c.ControlResponse:
        timeout_s = self.response_timeout_s if timeout_s is None else timeout_s
        with trio.move_on_after(timeout_s):
            while True:
                self.poll()
                for r in list(self.async_responses):
                    if predicate(r):
                        self.async_responses.remove(r)
                        return r
                await self.subscription.wait(0.05)
        raise ArchiveError(f"no matching control response within {timeout_s}s")


def signal_is(signal: RecordingSignal, recording_id: int | None = None) -> Callable[[c.RecordingSignalEvent], bool]:
    """A predicate for :meth:`ArchiveClient.wait_for_signal`."""
    return lambda s: s.signal == signal and (recording_id is None or s.recording_id == recording_id)
