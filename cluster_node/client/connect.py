"""Connecting a client to the leader: the states of the reference's ``AsyncConnect``.

Connecting (``AsyncConnect._connect``): one ingress
publication per member in ``ingress_endpoints``, and a connect request to each as soon as its
publication connects (the last known leader is given a moment first); the replies are read on the
egress subscription. A REDIRECT names the leader of the member's term: the leader of the newest
term heard of is asked at once, and the member that redirected is asked again after a pause that
grows with each redirect, so that a client arriving during an election keeps asking every member
until one leads. A request unanswered for ``message_timeout`` (at most a second) is sent again.
The whole connect has one deadline, ``connect_timeout`` (``open_cluster_client(connect_timeout=)``
overrides the config's); a reconnect has ``reconnect_timeout``.

A reconnect (``_reconnect``) is a connect with its own deadline, ``reconnect_timeout``, after
the leader went silent or the cluster timed the session out.

This is a part of :class:`cluster_node.client.cluster_client.ClusterClient` (its base class),
kept apart because it is the one part of the client that is a state machine of its own; it
reads and sets the client's session state (``cluster_session_id``, ``leader_member_id``,
``ingress_endpoints``, the ingress publication) as the rest of the client does.
"""

from __future__ import annotations

import time

import trio

from cluster_node.client.errors import (
    AuthenticationError,
    ClusterClientError,
    ClusterRejectedError,
    ConnectTimeoutError,
)
from cluster_node.codecs import (
    NULL_VALUE,
    Challenge,
    ChallengeResponse,
    EventCode,
    SessionCloseRequest,
    SessionConnectRequest,
    SessionEvent,
    encode_ingress,
)
from cluster_node.config import ConfigError, parse_ingress_endpoints
from cluster_node.media.library_log import library_logger
from cluster_node.media.publication import ExclusivePublication

log = library_logger("cluster_node.client")

_ASK_AGAIN_S = 0.05
"""A member that redirected is asked again after this pause, doubled each time it redirects."""
_ASK_AGAIN_MAX_S = 1.0
_RESEND_MAX_S = 1.0
"""A connect request unanswered this long is sent again (at most; less with a shorter
``message_timeout``)."""
POLL_S = 0.01
"""How often a connect looks whether a member's publication has connected."""
_PREFERRED_CONNECT_S = 0.25
"""A connect waits this long for the member it asks first before it takes any other that
connects (a publication to a running member connects within a round trip or two)."""


def udp_channel(endpoint: str) -> str:
    return f"aeron:udp?endpoint={endpoint}"


class AsyncConnect:
    """The connect and reconnect of :class:`ClusterClient` (its base class; see the module docstring)."""

    def _add_ingress(self, endpoint: str) -> ExclusivePublication:
        return self.driver.add_publication(udp_channel(endpoint), self._ingress_stream_id)

    def _replace_ingress(self, pub: ExclusivePublication | None) -> None:
        old, self._ingress = self._ingress, pub
        if old is not None and old is not pub:
            old.close()

    async def _connect(self, deadline_ns: int) -> None:
        """Open a session with the leader before ``deadline_ns`` (the states of the reference's
        ``AsyncConnect``, asking every member at once as it does).

        Every member in ``ingress_endpoints`` gets a publication and, once it is connected, a
        connect request. A member's REDIRECT names the leader of its term: the leader of the
        newest term heard of is asked at once, the member that redirected again after a pause
        (longer each time, up to ``_ASK_AGAIN_MAX_S``), so that a client that arrives during an
        election asks around until one is elected. A member that does not answer within
        ``message_timeout`` (capped at ``_RESEND_MAX_S``) is asked again: the leader answers
        nothing to a request it refuses and rate limits its REDIRECTs, and a datagram may be
        lost. The leader may so get two requests of ours and open two sessions: the first OK is
        kept and any other is closed (``_send_close``). An OK from a member whose term
        is older than the newest leader heard of is a deposed leader's: closed, and the
        newest leader asked instead."""
        self._connecting = True
        self._connect_ids = {}
        self._connect_replies = []
        started_ns = time.monotonic_ns()
        resend_ns = min(self._message_timeout_ns, int(_RESEND_MAX_S * 1e9))
        pubs: dict[int, ExclusivePublication] = {}
        pub_endpoints: dict[int, str] = {}
        next_ask_ns: dict[int, int] = {}
        """When each member is to be asked (again); absent: as soon as its publication connects."""
        pause_s: dict[int, float] = {}
        heard: dict[int, str] = {}
        """What each member last said, for the timeout's message."""
        unanswered: set[int] = set()
        """Members with a request of ours they have not answered yet."""
        newest_term, newest_leader = NULL_VALUE, NULL_VALUE
        if self.leader_member_id in self.ingress_endpoints:
            # The last known leader first: the others only if it does not answer soon.
            for mid in self.ingress_endpoints:
                if mid != self.leader_member_id:
                    next_ask_ns[mid] = started_ns + int(_PREFERRED_CONNECT_S * 1e9)
        try:
            while True:
                self.poll_egress()
                replies, self._connect_replies = self._connect_replies, []
                now = time.monotonic_ns()
                for member_id, reply in replies:
                    unanswered.discard(member_id)
                    if isinstance(reply, Challenge):
                        pub = pubs.get(member_id)
                        if pub is not None:
                            self._answer_challenge(pub, reply)
                            unanswered.add(member_id)
                            # The verdict comes next: no new connect request (a new challenge) meanwhile.
                            next_ask_ns[member_id] = now + max(resend_ns, int(_ASK_AGAIN_MAX_S * 1e9))
                        continue
                    code = reply.code
                    if code == EventCode.OK:
                        leader = reply.leader_member_id if reply.leader_member_id != NULL_VALUE else member_id
                        if (
                            newest_leader not in (NULL_VALUE, leader)
                            and reply.leadership_term_id < newest_term
                            and member_id in pubs
                        ):
                            self._send_close(pubs[member_id], reply.leadership_term_id, reply.cluster_session_id)
                            heard[member_id] = f"deposed leader of term {reply.leadership_term_id}"
                            continue
                        pub = pubs.pop(member_id, None)
                        if pub is None:
                            continue  # a member no longer in the cluster's list: not one to keep
                        self._set_session(reply.cluster_session_id, reply.leadership_term_id, leader)
                        self._replace_ingress(pub)
                        self._last_leader_sign_ns = time.monotonic_ns()
                        self._answered()
                        self._next_keep_alive_ns = time.monotonic_ns() + self._keep_alive_interval_ns
                        log.info(
                            "connected",
                            session=self.cluster_session_id,
                            term=self.leadership_term_id,
                            leader=self.leader_member_id,
                        )
                        return
                    if code == EventCode.REDIRECT:
                        self._redirect_endpoints(reply)
                        term, leader = reply.leadership_term_id, reply.leader_member_id
                        heard[member_id] = "no leader" if leader == NULL_VALUE else f"leader {leader}, term {term}"
                        if leader != NULL_VALUE and term >= newest_term:
                            if (term, leader) != (newest_term, newest_leader) or leader == member_id:
                                if leader not in unanswered or leader == member_id:
                                    # The new leader (or one finishing its election): now, unless
                                    # a request of ours is on its way to it (two would open two
                                    # sessions).
                                    next_ask_ns[leader] = now
                            newest_term, newest_leader = term, leader
                            for mid in self.ingress_endpoints:
                                # Members first heard of here: after the leader has had its moment.
                                next_ask_ns.setdefault(mid, now + int(_PREFERRED_CONNECT_S * 1e9))
                        if leader == NULL_VALUE:
                            pause = pause_s.get(member_id, _ASK_AGAIN_S)
                            next_ask_ns[member_id] = now + int(pause * 1e9)
                            pause_s[member_id] = min(pause * 2, _ASK_AGAIN_MAX_S)
                        elif leader == member_id:
                            next_ask_ns[member_id] = now + int(_ASK_AGAIN_S * 1e9)
                        else:
                            # The named leader is asked meanwhile; this member only if it is not
                            # the leader after all (a leader gone: the member learns of it).
                            next_ask_ns[member_id] = now + int(_ASK_AGAIN_MAX_S * 1e9)
                        continue
                    if code == EventCode.AUTHENTICATION_REJECTED:
                        raise AuthenticationError(
                            f"authentication rejected: {reply.detail or 'no reason given'}", reply.detail
                        )
                    raise ClusterRejectedError(
                        f"the cluster refused the connection ({EventCode(code).name}): {reply.detail or 'no detail'}"
                    )
                # One publication per member (a REDIRECT may have named others).
                for mid, ep in self.ingress_endpoints.items():
                    if pub_endpoints.get(mid) != ep:
                        if mid in pubs:
                            pubs.pop(mid).close()
                        pubs[mid] = self._add_ingress(ep)
                        pub_endpoints[mid] = ep
                for mid in [m for m in pubs if m not in self.ingress_endpoints]:
                    pubs.pop(mid).close()
                    pub_endpoints.pop(mid, None)
                if now >= deadline_ns:
                    members = self._what_members_said(pubs, heard)
                    raise ConnectTimeoutError(f"no leader within {(now - started_ns) / 1e9:.1f}s ({members})", members)
                wake_ns = deadline_ns
                for mid, pub in pubs.items():
                    if not pub.is_connected:
                        continue
                    due = next_ask_ns.get(mid, now)
                    if due <= now:
                        if self._send_connect_request(mid, pub):
                            heard.setdefault(mid, "no answer")
                            unanswered.add(mid)
                            due = next_ask_ns[mid] = now + resend_ns
                        else:
                            due = now + int(POLL_S * 1e9)
                    wake_ns = min(wake_ns, due)
                if any(not p.is_connected for p in pubs.values()):
                    wake_ns = min(wake_ns, now + int(POLL_S * 1e9))
                wait_s = max(0.0, (wake_ns - time.monotonic_ns()) / 1e9)
                if wait_s > 0:
                    with trio.move_on_after(wait_s):
                        await self._egress.wait(wait_s)
                else:
                    await trio.lowlevel.checkpoint()
        finally:
            for p in pubs.values():
                if p is not self._ingress:
                    p.close()
            self._connecting = False
            self._connect_replies = []

    def _answer_challenge(self, pub: ExclusivePublication, challenge: Challenge) -> None:
        """Answer a Challenge on the publication the connect request went on (the leader takes
        the answer from that image only). A supplier that cannot answer raises AuthenticationError."""
        try:
            answer = self.credentials.on_challenge(bytes(challenge.encoded_challenge))
        except AuthenticationError:
            raise
        except Exception as ex:  # noqa: BLE001 - the application's supplier
            raise AuthenticationError(f"the credentials supplier failed to answer the challenge: {ex}") from None
        msg = encode_ingress(ChallengeResponse(challenge.correlation_id, challenge.cluster_session_id, bytes(answer)))
        for _ in range(3):
            if pub.offer(msg) > 0:
                return
        log.warning("challenge response not sent (back-pressure)", session=challenge.cluster_session_id)

    def _send_connect_request(self, member_id: int, pub: ExclusivePublication) -> bool:
        correlation_id = next(self._correlation_ids)
        request = encode_ingress(
            SessionConnectRequest(
                correlation_id,
                self._egress_stream_id,
                self._protocol_version,
                self.egress_channel,
                bytes(self.credentials.encoded_credentials()),
            )
        )
        if pub.offer(request) < 0:
            return False
        self._connect_ids[correlation_id] = member_id
        self.connect_requests_sent += 1
        return True

    def _send_close(self, pub: ExclusivePublication, term_id: int, session_id: int) -> None:
        msg = encode_ingress(SessionCloseRequest(term_id, session_id))
        for _ in range(3):
            if pub.offer(msg) > 0:
                break
        self.spare_sessions_closed += 1
        log.info("closed a spare session", session=session_id, term=term_id)

    def _what_members_said(self, pubs: dict[int, ExclusivePublication], heard: dict[int, str]) -> str:
        said = []
        for mid, ep in sorted(self.ingress_endpoints.items()):
            pub = pubs.get(mid)
            what = heard.get(mid) or ("no answer" if pub is not None and pub.is_connected else "unreachable")
            said.append(f"{mid}={ep} {what}")
        return "; ".join(said)

    def _redirect_endpoints(self, reply: SessionEvent) -> None:
        """Take the members' ingress endpoints a REDIRECT carries (the cluster's own list)."""
        detail = reply.detail.strip()
        if "=" not in detail:
            return
        try:
            endpoints = parse_ingress_endpoints(detail, "REDIRECT detail")
        except ConfigError:
            self.egress_errors += 1
            return
        if endpoints:
            self.ingress_endpoints = endpoints

    async def _reconnect(self) -> None:
        """A new session after the leader went silent or the cluster timed ours out; closes the
        client if it cannot."""
        old = self.cluster_session_id
        log.warning(
            "reconnecting",
            session=old,
            leader=self.leader_member_id,
            silent_for_ms=(time.monotonic_ns() - self._last_leader_sign_ns) // 1_000_000,
        )
        self._replace_ingress(None)
        self.cluster_session_id = NULL_VALUE
        self._answered()
        self.reconnects += 1
        give_up_ns = time.monotonic_ns() + self._reconnect_timeout_ns
        last_error = "no attempt made"
        while not self._closed:
            now = time.monotonic_ns()
            if now >= give_up_ns:
                self._close_locally(f"could not reconnect within {self._reconnect_timeout_ns / 1e9:g}s: {last_error}")
                return
            try:
                await self._connect(give_up_ns)
            except ConnectTimeoutError as ex:
                last_error = str(ex)
                continue
            except ClusterRejectedError as ex:
                # This client was accepted before, so the refusal is the session limit: the new
                # leader may still hold sessions of clients that have moved on (ours among them),
                # until its session timeout. Ask again, as for a leader not yet elected.
                last_error = str(ex)
                await trio.sleep(min(_ASK_AGAIN_MAX_S, max(0.0, (give_up_ns - time.monotonic_ns()) / 1e9)))
                continue
            except ClusterClientError as ex:
                self._close_locally(str(ex))
                return
            log.info("reconnected", old_session=old, session=self.cluster_session_id, leader=self.leader_member_id)
            if self.on_reconnect is not None:
                self.on_reconnect(self.cluster_session_id)
            return
