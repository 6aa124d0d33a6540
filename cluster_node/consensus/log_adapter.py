"""A follower's log: the leader's log image copied into the local log, and the log adapter.

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). A follower
subscribes to the leader's log (live and catch-up destinations), copies the image's blocks into
its local log once it has checked the image comes from the leader's host, and reads its local
log back, bounded by the commit position, to apply what the leader applied: session opens and
closes, timer events, service messages and snapshot requests (the reference's LogAdapter). Runs
of client messages, nothing for the module, are stepped over as one. Replays at an election go
through the same adapter.
"""

from __future__ import annotations

import time

from cluster_node import codecs
from cluster_node.codecs import (
    LOG_CODEC,
    NULL_POSITION,
    SESSION_HEADER_LENGTH,
    SESSION_MESSAGE_TEMPLATE_ID,
    CodecError,
)
from cluster_node.consensus import effects as fx
from cluster_node.consensus import message_runs
from cluster_node.consensus.ingress_adapter import FRAGMENT_LIMIT, INGRESS_BLOCK
from cluster_node.consensus.module import Role
from cluster_node.media.subscription import StopPolling


class LogAdapter:
    """The follower's log subscription and the log adapter (see the module docstring)."""

    def _open_follower_log(self, e: fx.OpenLogSubscription) -> None:
        self._close_follower_log()
        self._follower_sub = self.driver.add_subscription(
            f"aeron:udp?control-mode=manual|session-id={e.log_session_id}{self._auth}", self.log_stream_id
        )
        self._follower_session = e.log_session_id
        self._follower_image = None

    def _close_follower_log(self) -> None:
        if self._follower_sub is not None:
            self._follower_sub.close()
        self._follower_sub = None
        self._follower_image = None
        if self._log_adapter_sub is not None and self.module is not None and self._replay is None:
            # Everything committed must reach our state before the log goes: a new leadership's
            # replay starts at the commit position, not where the adapter happened to be. A
            # snapshot waiting at an earlier position cannot be completed any more.
            self._abandon_snapshot("the log closed")
            for _ in range(10_000):
                if self._adapter_poll(self.module.commit_position) <= 0:
                    break
        if self.module is None or self.module.role != Role.LEADER:
            self._close_local_log()
        if self._log_adapter_sub is not None:
            self._log_adapter_sub.close()
            self._log_adapter_sub = None
            self._log_adapter_image = None

    def _on_local_log_entry(self, buf, offset, length, header) -> None:
        """Follower log adapter: a committed entry of the local log."""
        if length and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            # Nearly every entry: only a service message (negative session id) concerns the
            # module, so read the session id without building the message (per entry on every
            # follower, this was a fifth of its conductor's time at full load).
            if length >= SESSION_HEADER_LENGTH:
                prefix, _term_id, session_id, timestamp = codecs.unpack_session_header_from(buf, offset)
                if prefix == codecs.SESSION_PREFIX_WORD:
                    clock = self._clock
                    if timestamp > clock.floor:  # clock.observe, inline: once per entry
                        clock.floor = timestamp
                    if session_id < 0:
                        self.pending.on_log_service_message(session_id)
            return
        view = buf[offset : offset + length]
        try:
            msg = LOG_CODEC.decode(view)
        except CodecError:
            return
        t = type(msg)
        timestamp = getattr(msg, "timestamp", None)
        if timestamp is not None:
            self._clock.observe(timestamp)
        if t is codecs.SessionOpenEvent:
            self.sessions.on_log_session_open(msg, header.position)
        elif t is codecs.SessionCloseEvent:
            self.sessions.on_log_session_close(msg)
        elif t is codecs.TimerEvent:
            self.timers.on_log_timer_event(msg.correlation_id, header.position)
        elif (
            t is codecs.ClusterActionRequest
            and msg.action == codecs.ClusterAction.SNAPSHOT
            and msg.flags == codecs.CLUSTER_ACTION_FLAGS_DEFAULT
            and self._replay is None
        ):
            # A live snapshot request: our state must stay as of this entry until our service has
            # taken its snapshot here too (its ack carries the recording).
            self._begin_snapshot(header.position, msg.leadership_term_id)
            raise StopPolling
        elif t is codecs.ClusterActionRequest and msg.action == codecs.ClusterAction.PURGE_LOG and self._replay is None:
            self._on_log_purge_request(msg.flags, header.position)

    def _follower_work(self) -> int:
        work = 0
        sub = self._follower_sub
        if sub is not None:
            if self._follower_image is None:
                image = sub.image_by_session_id(self._follower_session)
                if image is not None and image is not self._refused_log_image:
                    from_leader = self._from_leader_host(image)
                    if from_leader is False:
                        self._refused_log_image = image  # (counted once; the log comes from the leader's host)
                    elif from_leader is None:
                        image = None  # no leader known yet: looked at again next pass
                if image is self._refused_log_image:
                    image = None
                if image is not None:
                    self._follower_image = image
                    self.module.on_log_image(image.position, time.monotonic_ns())
                    work += 1
            image = self._follower_image
            if image is not None and self.local is not None and self._joined(self.local):
                # An image that joined elsewhere than our log ends is not copied: the core saw its
                # join position (on_log_image) and leaves this log for catchup or an election.
                if image.position == self.local.pub.position:
                    work += self._copy(image, self.local.pub)
                if image.closed or image.is_end_of_stream:
                    self._follower_image = None
                    self.module.on_log_end_of_stream(time.monotonic_ns())
        # Log adapter: committed entries of the local log update sessions, timers, pending.
        if (
            self.local is not None
            and self.module.role != Role.LEADER
            and self._replay is None
            and self._snapshot is None
        ):
            self._adapt(self.local.session_id)
            work += self._adapter_poll(self.module.commit_position)
        return work

    def _adapt(self, session_id: int) -> None:
        """Point the log adapter at the local log of ``session_id`` (a replay or the live log)."""
        if self._log_adapter_sub is not None and self._log_adapter_session == session_id:
            return
        if self._log_adapter_sub is not None:
            self._log_adapter_sub.close()
        self._log_adapter_sub = self.driver.add_subscription(f"aeron:ipc?session-id={session_id}", self.log_stream_id)
        self._log_adapter_session = session_id
        self._log_adapter_image = None

    def _adapter_poll(self, limit: int) -> int:
        """Apply local log entries up to ``limit`` to sessions, timers and pending messages."""
        if self._log_adapter_sub is None:
            return 0
        if self._log_adapter_image is None:
            self._log_adapter_image = self._log_adapter_sub.image_by_session_id(self._log_adapter_session)
            if self._log_adapter_image is None:
                return 0
        image = self._log_adapter_image
        work = 0
        # A leading run of client messages (nothing for the module) is stepped over as one
        # (consensus.message_runs); the entries after it go one by one.
        if limit > image.position and image.frames_poll(
            self._skip_client_messages, min(limit - image.position, INGRESS_BLOCK)
        ):
            work = 1
        return work + image.bounded_poll(self._on_local_log_entry, limit, FRAGMENT_LIMIT)

    def _skip_client_messages(self, buf, offset, starts, length, position) -> int:
        end = message_runs.client_run(buf, offset, starts, length)
        if end:
            self._clock.observe(message_runs.last_timestamp(buf, offset, starts, end))
        return end

    def _adapter_position(self) -> int:
        image = self._log_adapter_image
        return image.position if image is not None else NULL_POSITION
