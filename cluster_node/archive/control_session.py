"""A control session of the archive: one connected client, and the error a request it sent is refused with.

Apart from the conductor because every request handler (recording, replay, extent edits) answers
through it: responses and recording signals are queued (bounded: a client that does not read
loses responses, not the archive's memory) and sent by the session's response task.
"""

from __future__ import annotations

from collections import deque

import trio

from cluster_node.archive import codecs as c

_MAX_QUEUED_RESPONSES = 4096
_PROTOCOL_VERSION = c.PROTOCOL_SEMANTIC_VERSION
IDLE_WAIT_S = 5.0
"""How long an idle control or recording loop waits before it looks again on its own. Everything
it waits for wakes it (data, images coming and going, stop), so this only bounds the cost of a
wake-up lost to a race with a writer in another process; an idle archive wakes no more often."""


class ArchiveRequestError(Exception):
    """A request the archive refuses; becomes an ERROR ControlResponse."""

    def __init__(self, error_code: c.ArchiveErrorCode, message: str, code=c.ControlResponseCode.ERROR) -> None:
        super().__init__(message)
        self.error_code = error_code
        self.code = code


class ControlSession:
    """One connected client: its response publication and a bounded queue of outbound messages."""

    def __init__(self, control_session_id: int, publication, image_key: tuple) -> None:
        self.control_session_id = control_session_id
        self.publication = publication
        self.image_key = image_key
        self.auth = False
        """It connected over an ``auth=mac`` control channel: what the archive sends it (its
        responses, its replays) is MAC'd too."""
        self.queue: deque[bytes] = deque()
        self.wake = trio.Event()
        self.closed = False
        self.dropped = 0

    def send(self, message) -> None:
        if self.closed:
            return
        if len(self.queue) >= _MAX_QUEUED_RESPONSES:
            self.dropped += 1  # a client that does not read loses responses, not our memory
            return
        self.queue.append(c.encode_response(message))
        self.wake.set()

    def ok(self, correlation_id: int, relevant_id: int = 0) -> None:
        self.send(
            c.ControlResponse(
                control_session_id=self.control_session_id,
                correlation_id=correlation_id,
                relevant_id=relevant_id,
                code=c.ControlResponseCode.OK,
                version=_PROTOCOL_VERSION,
                error_message="",
            )
        )

    def error(self, correlation_id: int, error_code, message: str, code=c.ControlResponseCode.ERROR) -> None:
        if code == c.ControlResponseCode.ERROR:
            self.send(c.error_response(self.control_session_id, correlation_id, error_code, message))
        else:
            self.send(
                c.ControlResponse(
                    control_session_id=self.control_session_id,
                    correlation_id=correlation_id,
                    relevant_id=int(error_code),
                    code=code,
                    version=_PROTOCOL_VERSION,
                    error_message=message[:4000],
                )
            )

    def signal(self, correlation_id: int, recording_id: int, subscription_id: int, position: int, signal) -> None:
        self.send(
            c.RecordingSignalEvent(
                control_session_id=self.control_session_id,
                correlation_id=correlation_id,
                recording_id=recording_id,
                subscription_id=subscription_id,
                position=position,
                signal=signal,
            )
        )
