"""The member's local log: one IPC publication per leadership term (or replay), and block copies.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). Every member
keeps its log in a local IPC publication created at the term's base position with the log
recording's initial term id and term length, so that a frame has the cluster's position
everywhere (the agent's module docstring draws the path). This module opens and closes those
publications (announcing each to the service with a JoinLog), knows when their readers have
joined (nothing is written before), appends queued entries in order, and copies whole blocks of
frames from an image to a publication: the leader's copier, a follower's log and a replay all
move the log that way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cluster_node import codecs
from cluster_node.codecs import LOG_CODEC, NULL_POSITION, encode_session_message
from cluster_node.media.channel import ChannelUri, parse

_BLOCK = 256 * 1024
"""The longest block a copy moves at once: a quarter of the log's term at most (see
:meth:`ConsensusAgent._copy`)."""


class _Refused(Exception):
    """A block copy found its destination full: the source keeps its position."""

    def __init__(self, code: int) -> None:
        self.code = code


@dataclass
class LocalLog:
    """One local log publication (IPC) and what must join it before it is written."""

    pub: object
    session_id: int
    readers: int
    joined: bool = False  # every reader has joined (once true, stays true)


class LocalLogs:
    """The local log publications and block copies (see the module docstring)."""

    def _log_channel(self, base: str, position: int) -> ChannelUri:
        """``base`` continuing the log recording at ``position``: same initial term id and term
        length, so every frame has the cluster's position."""
        return parse(base).starting_at(position, self.initial_term_id, self.term_length)

    def _local_channel(self, position: int, session_id: int) -> ChannelUri:
        return self._log_channel(f"aeron:ipc?session-id={session_id}|alias=log", position)

    def _new_local_session(self) -> int:
        """A session id for a new local log, never one used before in this process: a reader
        that still holds an ended local log must not take a new one for it."""
        while True:
            sid = self.rng.randrange(1, 2**31 - 1)
            if sid not in self._used_sessions:
                self._used_sessions.add(sid)
                return sid

    def _open_local_log(self, position: int, readers: int, replay_to: int = NULL_POSITION) -> LocalLog:
        """A new local log at ``position`` (a replay's when ``replay_to`` is given, else the live
        one, replacing the previous), announced to the service with a JoinLog."""
        if replay_to == NULL_POSITION and self.local is not None:
            self._close_local_log()
        session_id = self._new_local_session()
        pub = self.driver.add_publication(self._local_channel(position, session_id), self.log_stream_id)
        role = int(self.module.role) if self.module else 0
        join = codecs.JoinLog(
            position,
            replay_to,
            self.cfg.member_id,
            session_id,
            self.log_stream_id,
            replay_to != NULL_POSITION,
            role,
            f"aeron:ipc?session-id={session_id}",
        )
        if not self._send_service(join):
            self._join_unsent = join
        return LocalLog(pub, session_id, readers)

    def _close_local_log(self) -> None:
        if self.local is not None:
            self.local.pub.close()
            self.local = None
        if self._local_reader is not None:
            self._local_reader.close()
            self._local_reader = None
            self._local_reader_image = None

    @staticmethod
    def _joined(local: LocalLog | None) -> bool:
        if local is None:
            return False
        if local.joined:
            return True
        lb = local.pub.log
        try:
            local.joined = sum(1 for _ in lb.active_slots()) >= local.readers
        except Exception:  # noqa: BLE001 - a closed buffer
            return False
        return local.joined

    def _copy(self, image, pub, limit: int = 2**62, budget: int = 8) -> int:
        """Copy up to ``budget`` blocks of frames from ``image`` to ``pub`` (positions kept)."""

        def handler(buf, offset, length, position):
            r = pub.offer_block(buf, offset, length)
            if r < 0:
                raise _Refused(r)

        work = 0
        # A block must fit the destination's flow-control window (half a term) with its readers
        # caught up, or it is refused for ever: with a short term (64 KiB), a term's last 32 KiB
        # and its padding, received at once, made a block longer than the window and stalled the
        # follower's log. A quarter of a term also lets the next block go in while the readers
        # still read this one.
        block = min(_BLOCK, pub.max_block_length >> 1)
        for _ in range(budget):
            room = limit - image.position
            if room <= 0:
                break
            try:
                n = image.block_poll(handler, min(block, room))
            except _Refused:
                break
            if n <= 0:
                break
            work += 1
        if work:
            self._recording_progress_ns = time.monotonic_ns()
        return work

    def _flush_appends(self) -> None:
        """Append queued log entries in order; each entry's callback learns its position."""
        local = self.local
        if local is None or not self._appends or not self._joined(local):
            return
        pub = local.pub
        appends = self._appends
        i = 0
        try:
            for msg, on_done in appends:
                if type(msg) is bytearray:
                    data = msg
                elif type(msg) is codecs.SessionMessage:
                    h = msg.header
                    data = encode_session_message(h.leadership_term_id, h.cluster_session_id, h.timestamp, msg.payload)
                else:
                    data = LOG_CODEC.encode(msg)
                position = pub.offer(data)
                if position < 0:
                    break
                self._recording_progress_ns = self._now
                if on_done is not None:
                    on_done(position)
                i += 1
        finally:
            del appends[:i]
