"""Other members' messages into the consensus module (the reference's ConsensusAdapter).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). Every message
is checked at the door before the core sees it: decoded, from the configured host of the member
it claims to be from (the log image alike, from the leader's host), with no term beyond what the
core can reach, and from a member with our view of the cluster (the members digest). Termination
messages go to the termination protocol; a BackupQuery, from a backup or a member seeding an
empty directory on any host, is answered here with what this member holds, once the node's
authenticator accepts the asker (``consensus.backup_auth``; its ChallengeResponse comes here too).
"""

from __future__ import annotations

import time
import typing

import structlog
import trio

from cluster_node import codecs
from cluster_node.codecs import CONSENSUS_CODEC, EGRESS_CODEC, NULL_VALUE, CodecError
from cluster_node.consensus.backup_auth import (
    BACKUP_SESSION_ID_BASE,
    AnswerBackup,
    BackupAuthenticatorFailed,
    BackupQueryAuth,
    SendBackupReply,
)
from cluster_node.consensus.egress_publisher import ONE_SHOT_LINGER_S
from cluster_node.consensus.ingress_adapter import FRAGMENT_LIMIT
from cluster_node.consensus.module import MAX_TERM_JUMP
from cluster_node.media.channel import reply_channel_refusal

log = structlog.get_logger("consensus")


DIGESTED = frozenset({codecs.CanvassPosition, codecs.RequestVote, codecs.NewLeadershipTerm})
"""Election messages that carry the sender's ``members_digest`` (``NodeConfig.members_digest``)."""


_TERM_FIELDS = {
    t: tuple(f for f in t.__struct_fields__ if f.endswith("term_id")) for t in typing.get_args(codecs.ConsensusMessage)
}
"""The term fields of each consensus message, checked against the core's MAX_TERM_JUMP here, at
the door, for every message (TerminationPosition and TerminationAck never reach the core)."""


class ConsensusAdapter:
    """Member messages: source checks, dispatch, backup queries (see the module docstring)."""

    _SENDER = {
        codecs.CanvassPosition: "follower_member_id",
        codecs.RequestVote: "candidate_member_id",
        codecs.Vote: "follower_member_id",
        codecs.NewLeadershipTerm: "leader_member_id",
        codecs.AppendPosition: "follower_member_id",
        codecs.CommitPosition: "leader_member_id",
        codecs.CatchupPosition: "follower_member_id",
        codecs.TerminationAck: "member_id",
    }

    def _on_consensus(self, buf, offset, length, header) -> None:
        try:
            msg = CONSENSUS_CODEC.decode(buf[offset : offset + length])
        except CodecError as e:
            self.counters["errors"].add(1)
            log.debug("bad consensus message dropped", error=str(e))
            return
        t = type(msg)
        if t is codecs.BackupQuery:
            # From a backup or a member seeding its empty directory, on any host: it names no
            # member, and is answered only on a channel of the host it came from.
            self._on_backup_query(msg, header.session_id)
            return
        if t is codecs.ChallengeResponse:
            self._on_backup_challenge_response(msg, header.session_id)
            return
        if not self._from_claimed_host(msg, header.session_id):
            return
        fields = _TERM_FIELDS.get(t)
        if fields:
            m = self.module
            limit = max(m.leadership_term_id, m.candidate_term_id, m.log_leadership_term_id) + MAX_TERM_JUMP
            if any(getattr(msg, f) > limit for f in fields):
                self.counters["errors"].add(1)
                log.debug("consensus message from an unreachable term dropped", message=t.__name__)
                return
        if t in DIGESTED and msg.members_digest not in (0, self._members_digest):
            self._on_members_mismatch(msg)
            return
        if t is codecs.TerminationPosition or t is codecs.TerminationAck:
            self._on_termination_message(msg)
            return
        if t is codecs.BackupResponse:
            return  # meant for a backup's own channel, never a member's
        if t is codecs.CatchupPosition and msg.catchup_endpoint:
            # The follower's catchup endpoint as it bound it (config may say port 0).
            self._catchup_endpoints[msg.follower_member_id] = msg.catchup_endpoint
        attr = self._SENDER.get(type(msg))
        # StopCatchup and TerminationPosition come from the leader and name no sender.
        sender = getattr(msg, attr) if attr is not None else self.module.leader_member_id
        self.module.on_message(sender, msg, time.monotonic_ns())

    def _from_claimed_host(self, msg, session_id: int) -> bool:
        """Did ``msg`` come from the configured host of the member it claims to be from (the
        leader for the messages that name no sender)? A member's driver sends from its own
        host (``publication_bind_host``), so another host speaking as a member is a forgery (or
        a member's datagram sent on by a third party): dropped, counted, said once per kind.
        A member configured with a wildcard host names no address and is not checked."""
        attr = self._SENDER.get(type(msg))
        # (The leader's messages that name no sender: the leader as the election knows it.)
        sender = getattr(msg, attr) if attr is not None else self.module.known_leader_member_id
        if attr is None and sender not in self._member_hosts:
            # A leader's message while this member knows no leader (an election under way): it
            # may be the leader's own (a TerminationPosition meeting a member that restarts its
            # election), so it passes when it comes from any member's host and the core, which
            # knows which messages it can use without a leader, decides.
            return self._from_a_member_host(session_id, msg)
        if sender not in self._member_hosts:
            expected = ""  # no such member
        else:
            expected = self._member_hosts[sender]
            if expected is None:
                return True
        host = self._image_host(session_id)
        if host == expected:
            return True
        self.counters["errors"].add(1)
        self.input_errors.record(
            f"consensus message from another host: {type(msg).__name__}",
            "consensus message from a host that is not the configured host of the member it claims to be from: dropped",
            member=sender,
            source=host,
            expected=expected,
        )
        return False

    def _from_a_member_host(self, session_id: int, msg) -> bool:
        """Did ``msg`` come from the configured host of some member (any host when a member is
        configured with a wildcard host)?"""
        hosts = set(self._member_hosts.values())
        host = self._image_host(session_id)
        if None in hosts or host in hosts:
            return True
        self.counters["errors"].add(1)
        self.input_errors.record(
            f"consensus message from another host: {type(msg).__name__}",
            "consensus message from a host that is not any member's configured host: dropped",
            source=host,
        )
        return False

    def _image_host(self, session_id: int) -> str:
        images = self._consensus_sub.images
        if images is not self._consensus_images:
            # An image's source never changes; the tuple of images is replaced when one comes
            # or goes, so this is rebuilt then (a forged image can reuse a gone one's session).
            self._consensus_images = images
            self._consensus_hosts = {i.session_id: i.source_host for i in images}
        return self._consensus_hosts.get(session_id, "")

    def _from_leader_host(self, image) -> bool | None:
        """A log image (live or catch-up replay, which the leader's archive sends from the
        leader's process) is used only when it comes from the leader's configured host.
        None while no leader is known (nothing to compare with yet)."""
        leader = self.module.known_leader_member_id
        expected = self._log_hosts.get(leader)
        if expected is None:
            return None
        if None in expected or image.source_host in expected:
            return True
        self.counters["errors"].add(1)
        self.input_errors.record(
            "log image from another host",
            "log image from a host that is not the leader's: not used",
            leader=leader,
            source=image.source_host,
            expected=sorted(expected),
        )
        return False

    def _on_backup_query(self, msg: codecs.BackupQuery, image_session_id: int) -> None:
        """Answer a backup (or a member seeding its empty directory) with what it needs to copy
        the cluster: our log recording, terms, commit-position counter and latest snapshot set.
        Any member answers, once the authenticator accepts the asker (``_backup_queries``); the
        answer names the leader, whom the asker then prefers."""
        source = ""
        for image in self._consensus_sub.images:
            if image.session_id == image_session_id:
                source = image.source_host
        refusal = reply_channel_refusal(msg.response_channel, source)
        if refusal is not None:
            self.counters["errors"].add(1)
            self.input_errors.record(
                f"backup query refused: {refusal.split(':')[0]}", "backup query refused (no answer sent): " + refusal
            )
            return
        auth = self._backup_queries()
        auth.on_query(msg, image_session_id, time.monotonic_ns())
        self._backup_auth_effects(auth)

    def _backup_queries(self) -> BackupQueryAuth:
        """Backup queries being authenticated (consensus.backup_auth), made at first use: a
        member answers them while it seeds, before its duty cycle runs."""
        auth = getattr(self, "_backup_auth", None)
        if auth is None:
            auth = self._backup_auth = BackupQueryAuth(
                self.sessions.authenticator,
                self.cfg.member_id,
                self.cfg.auth.challenge_timeout_ns,
                BACKUP_SESSION_ID_BASE + self.rng.randrange(BACKUP_SESSION_ID_BASE),
                # MAC'd member traffic: only holders of the cluster key reach us (docs/security.md).
                trusted=self.cfg.cluster.member_auth,
            )
        return auth

    def _on_backup_challenge_response(self, msg: codecs.ChallengeResponse, image_session_id: int) -> None:
        """A backup's answer to our Challenge (clients answer theirs on the ingress)."""
        auth = self._backup_queries()
        if not auth.on_challenge_response(msg, image_session_id, time.monotonic_ns()):
            self.counters["errors"].add(1)
            self.input_errors.record(
                "challenge response for no backup query",
                "a ChallengeResponse on the consensus channel answering no challenge of ours was dropped",
                session=msg.cluster_session_id,
            )
            return
        self._backup_auth_effects(auth)

    def _backup_auth_work(self) -> int:
        """Each duty cycle while queries are being decided: the authenticator asked again, the
        timeout applied."""
        auth = getattr(self, "_backup_auth", None)
        if auth is None or not auth.pending:
            return 0
        work = auth.process(time.monotonic_ns())
        self._backup_auth_effects(auth)
        return work

    def _backup_auth_effects(self, auth: BackupQueryAuth) -> None:
        for e in auth.drain_effects():
            t = type(e)
            if t is AnswerBackup:
                data = CONSENSUS_CODEC.encode(self.backup_response(e.correlation_id))
                self._send_backup_reply(e.response_channel, e.response_stream_id, data)
            elif t is SendBackupReply:
                if e.reason:
                    # Refusals are the asker's problem, not this member's: said once per reason,
                    # counted in the distinct-error table, not in the member's error counter.
                    self.input_errors.record(
                        f"backup query refused: {e.reason}",
                        "a backup query was refused by the authenticator (no answer but the refusal)",
                        reason=e.reason,
                    )
                self._send_backup_reply(e.response_channel, e.response_stream_id, EGRESS_CODEC.encode(e.message))
            elif t is BackupAuthenticatorFailed:
                self.counters["errors"].add(1)
                self.input_errors.record(
                    f"authenticator failed: {e.error.split(':')[0]}",
                    "the authenticator raised on a backup query: the backup is refused",
                    level="error",
                    error=e.error,
                )

    def _send_backup_reply(self, channel: str, stream_id: int, data: bytes) -> None:
        """One message to a backup's response channel, on a publication of its own (rate-bounded)."""
        if not self._one_shot_reply_allowed():
            return
        try:
            pub = self.driver.add_publication(channel, stream_id, exclusive=False)
        except Exception as e:  # noqa: BLE001 - an asker's bad channel
            self.input_errors.record("backup query refused: channel", "backup query refused: " + str(e))
            return
        self._tasks.start_soon(self._send_one_shot, pub, data)

    def backup_response(self, correlation_id: int) -> codecs.BackupResponse:
        """What this member holds, as a BackupResponse (see ``_on_backup_query``)."""
        rl = self.recording_log_file.log
        m = self.module
        terms = [e for e in rl.term_entries() if e.recording_id == self.recording_id]
        first = terms[0] if terms else None
        last = rl.last_term()
        plan = rl.create_recovery_plan(self.service_count, 0, 0, self.recording_id)
        snapshots = tuple(
            codecs.BackupSnapshot(
                s.recording_id,
                s.leadership_term_id,
                s.term_base_log_position,
                s.log_position,
                s.timestamp,
                s.service_id,
            )
            for s in plan.snapshots
        )
        leader = m.known_leader_member_id if m is not None else NULL_VALUE
        return codecs.BackupResponse(
            correlation_id=correlation_id,
            log_recording_id=self.recording_id,
            log_leadership_term_id=first.leadership_term_id if first else NULL_VALUE,
            log_term_base_log_position=first.term_base_log_position if first else 0,
            last_leadership_term_id=last.leadership_term_id if last else NULL_VALUE,
            last_term_base_log_position=last.term_base_log_position if last else 0,
            commit_position_counter_id=self.counters["commit-pos"].counter_id,
            leader_member_id=leader,
            member_id=self.cfg.member_id,
            snapshots=snapshots,
            cluster_members=self.cfg.members_text,
            commit_position=self.counters["commit-pos"].get(),
            log_start_position=self.log_start_position,
        )

    async def _send_one_shot(self, pub, data: bytes) -> None:
        """Offer ``data`` once the asker's channel connects (bounded), then close it."""
        self._one_shot_open += 1
        try:
            with trio.move_on_after(1.0):
                while pub.offer(data) < 0 and not pub.closed:
                    await trio.sleep(0.005)
            await self._close_later(pub, ONE_SHOT_LINGER_S)
        finally:
            self._one_shot_open -= 1

    def _on_members_mismatch(self, msg) -> None:
        """A member whose view of the cluster (cluster id, members list) differs from ours: its
        election messages are dropped, counted, and said once per member and digest, loudly,
        since the cluster cannot elect with it until an operator fixes one of the configs."""
        sender = getattr(msg, self._SENDER.get(type(msg), ""), None)
        self.counters["errors"].add(1)
        if sender not in self.module.member_by_id:
            # Not a member with another view: a message naming a member id we have never had is
            # bad input (anyone who reaches the port can send it), said once per kind.
            self.input_errors.record(
                f"consensus message from a non-member: {type(msg).__name__}",
                "a consensus message naming a member id not in cluster.members was dropped",
                member=sender,
            )
            return
        key = (sender, msg.members_digest)
        if key not in self._mismatches_said and len(self._mismatches_said) < 64:
            self._mismatches_said.add(key)
            log.error(
                "a member's view of the cluster differs from ours: its election messages are dropped "
                "(check cluster.members and node.cluster_id in every member's config)",
                member=sender,
                their_digest=msg.members_digest,
                our_digest=self._members_digest,
                our_members=self.cfg.members_text,
            )

    def _poll_consensus(self) -> int:
        """Other members' messages, guarded as the ingress is (``IngressAdapter._poll_ingress``) (a member's bytes may be
        forged)."""
        try:
            return self._consensus_sub.poll(self._on_consensus, FRAGMENT_LIMIT) + self._backup_auth_work()
        except Exception as e:  # noqa: BLE001 - see IngressAdapter._poll_ingress
            self._input_failed("consensus", e)
            return 1
