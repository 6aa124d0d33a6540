"""Clients' messages into the consensus module (the reference's IngressAdapter).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). On the leader
a client's session message goes into the local log as it came, with the leader's timestamp
written into its header: runs of one session's messages a block at a time
(``consensus.message_runs``), anything else one message at a time. Connect, keep-alive, close,
challenge-response and admin requests go to the sessions core; a follower answers clients with
a redirect. Input that raises is counted, said once per kind and skipped: one client's (or
member's) bytes never end the node.
"""

from __future__ import annotations

import struct

import structlog

from cluster_node import codecs
from cluster_node.codecs import INGRESS_CODEC, SESSION_HEADER_LENGTH, SESSION_MESSAGE_TEMPLATE_ID, CodecError
from cluster_node.consensus import message_runs
from cluster_node.consensus.module import Role
from cluster_node.consensus.response_channel import response_channel_refusal

log = structlog.get_logger("consensus")


FRAGMENT_LIMIT = 256
"""At most this many fragments in one poll of any of the agent's subscriptions: one busy input
does not hold up the rest of the duty cycle."""

INGRESS_BLOCK = 64 * 1024
"""At most this many bytes of one client's session messages go into the log in one block (the
follower's log adapter steps over runs of client messages in blocks of the same size)."""

_TIMESTAMP_PACK = struct.Struct("<q").pack_into


class IngressAdapter:
    """Reading the ingress subscription (see the module docstring)."""

    def _on_ingress(self, buf, offset, length, header) -> None:
        m = self.module
        if length >= SESSION_HEADER_LENGTH and buf[offset] == SESSION_MESSAGE_TEMPLATE_ID:
            # The hot path: a client's session message goes into the log as it came, with the
            # leader's timestamp written into its header; no objects are built.
            prefix, term_id, session_id, _ts = codecs.unpack_session_header_from(buf, offset)
            if prefix != codecs.SESSION_PREFIX_WORD or length > codecs.MAX_MESSAGE_LENGTH:
                self.counters["errors"].add(1)
                return
            if not (m.election is None and m.role == Role.LEADER):
                self.sessions.on_ingress_not_leading(
                    term_id,
                    session_id,
                    leader_member_id=m.known_leader_member_id,
                    current_term_id=m.leadership_term_id,
                    now_ns=self._cluster_now,
                )
                return
            if not self.sessions.on_ingress(
                term_id, session_id, m.leadership_term_id, self._cluster_now, header.session_id
            ):
                return
            data = bytearray(buf[offset : offset + length])
            _TIMESTAMP_PACK(data, codecs.SESSION_TIMESTAMP_OFFSET, self._cluster_now)
            local = self.local
            if not self._appends and local is not None and local.joined:
                if local.pub.offer(data) > 0:
                    self._recording_progress_ns = self._now
                    return
            self._appends.append((data, None))
            return
        view = buf[offset : offset + length]
        try:
            msg = INGRESS_CODEC.decode(view)
        except CodecError as e:
            self.counters["errors"].add(1)
            log.debug("bad ingress message dropped", error=str(e))
            return
        t = type(msg)
        if t is codecs.SessionConnectRequest:
            refusal = response_channel_refusal(
                msg.response_channel,
                msg.response_stream_id,
                self._ingress_source_host(header.session_id),
                self.cfg.cluster.egress_stream_id,
            )
            if refusal is not None:
                # No answer at all: the channel it names is not one this member will send to.
                self.counters["errors"].add(1)
                self.input_errors.record(
                    f"connect refused: {refusal.split(':')[0]}", "connect request refused (no answer sent): " + refusal
                )
                return
            self.sessions.on_connect_request(
                msg,
                is_leader=m.is_leader,
                leader_member_id=m.known_leader_member_id,
                leadership_term_id=m.leadership_term_id,
                now_ns=self._cluster_now,
                image_session_id=header.session_id,
            )
        elif t is codecs.SessionKeepAlive:
            if m.is_leader:
                self.sessions.on_keep_alive(
                    msg.leadership_term_id,
                    msg.cluster_session_id,
                    m.leadership_term_id,
                    self._cluster_now,
                    header.session_id,
                )
            else:
                self.sessions.on_ingress_not_leading(
                    msg.leadership_term_id,
                    msg.cluster_session_id,
                    leader_member_id=m.known_leader_member_id,
                    current_term_id=m.leadership_term_id,
                    now_ns=self._cluster_now,
                )
        elif t is codecs.SessionCloseRequest:
            if m.is_leader:
                self.sessions.on_close_request(
                    msg.leadership_term_id,
                    msg.cluster_session_id,
                    m.leadership_term_id,
                    self._cluster_now,
                    header.session_id,
                )
            else:
                self.sessions.on_close_request_not_leading(msg.leadership_term_id, msg.cluster_session_id)
        elif t is codecs.ChallengeResponse:
            if m.election is None and m.role == Role.LEADER:
                self.sessions.on_challenge_response(
                    msg.correlation_id,
                    msg.cluster_session_id,
                    msg.encoded_credentials,
                    leadership_term_id=m.leadership_term_id,
                    leader_member_id=m.known_leader_member_id,
                    now_ns=self._cluster_now,
                    image_session_id=header.session_id,
                )
        elif t is codecs.AdminRequest:
            if m.election is None and m.role == Role.LEADER:
                self.sessions.on_admin_request(
                    msg,
                    current_term_id=m.leadership_term_id,
                    now_ns=self._cluster_now,
                    image_session_id=header.session_id,
                    can_snapshot=self._control.can_take_snapshot,
                )

    def _ingress_source_host(self, image_session_id: int) -> str | None:
        """The address the ingress image of ``image_session_id`` receives from (its first
        source, as the driver names it ``host:port``); None for an IPC image (same host)."""
        for image in self._ingress_sub.images:
            if image.session_id == image_session_id:
                return image.source_host
        return ""  # no such image (closed meanwhile): matches no host

    def _poll_ingress(self) -> int:
        """Clients' messages (:meth:`_poll_ingress_unguarded`); a message whose handling raises
        is skipped (the image has moved past it), counted and said once per kind, and the duty
        cycle goes on: one client's bytes never end the node."""
        try:
            return self._poll_ingress_unguarded()
        except Exception as e:  # noqa: BLE001 - see the docstring
            self._input_failed("ingress", e)
            return 1

    def _input_failed(self, stream: str, error: Exception) -> None:
        self.counters["errors"].add(1)
        self.input_errors.record(
            f"{stream} message failed: {type(error).__name__}",
            f"handling a {stream} message failed: it is skipped",
            level="error",
            error=repr(error),
            exc_info=error,
        )

    def _poll_ingress_unguarded(self) -> int:
        """Clients' messages: runs of session messages go into the log a block at a time
        (consensus.message_runs), everything else one message at a time (:meth:`_on_ingress`)."""
        sub = self._ingress_sub
        m = self.module
        local = self.local
        if self._appends or m.election is not None or m.role != Role.LEADER or local is None or not local.joined:
            return sub.poll(self._on_ingress, FRAGMENT_LIMIT)
        work = 0
        for image in sub.images:
            # Once a message waits in _appends (the log refused it), everything after it waits
            # behind it, as one by one: messages enter the log in the order they were taken.
            try:
                self._frames_image_session_id = image.session_id
                if not self._appends and image.frames_poll(self._on_ingress_frames, INGRESS_BLOCK):
                    work += 1
                    continue
            except Exception as e:  # noqa: BLE001 - a run that raises would be read again and again
                self._input_failed("ingress", e)
                image.close()  # that client's stream: its session times out
                continue
            work += image.poll(self._on_ingress, FRAGMENT_LIMIT)
        return work

    def _on_ingress_frames(self, buf, offset, starts, length, position) -> int:
        """``Image.frames_poll`` handler: the leading run of one session's messages into the
        log with one offer; returns the bytes taken (0: leave them to :meth:`_on_ingress`)."""
        count, end, term_id, session_id = message_runs.session_run(buf, offset, starts, length, self.local.pub.mtu)
        if count == 0:
            return 0
        m = self.module
        if not self.sessions.on_ingress(
            term_id, session_id, m.leadership_term_id, self._cluster_now, self._frames_image_session_id, count
        ):
            return end  # dropped, as one by one
        pub = self.local.pub
        count, end = message_runs.fit(starts, count, end, pub.block_room())
        if count == 0:
            return 0
        now = self._cluster_now
        position = pub.offer_frames(
            buf, offset, starts[:count], end, lambda b, off, s: message_runs.stamp_timestamps(b, off, s, now)
        )
        if position < 0:
            return 0
        self._recording_progress_ns = self._now
        return end
