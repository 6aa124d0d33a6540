"""The sessions core's effects, and replies to clients (the reference's EgressPublisher).

A part of :class:`~cluster_node.consensus.agent.ConsensusAgent` (mixed into it). Session events
for the log are queued behind what is already queued; events for a client go out on its egress
publication, retried while the client's channel connects (bounded). A reply to a connect request
needs a publication of its own: those are rate-limited and held only briefly, since anyone who
reaches the ingress port can ask for one.
"""

from __future__ import annotations

import time

import structlog
import trio

from cluster_node.codecs import EGRESS_CODEC, NULL_VALUE
from cluster_node.consensus.session_effects import (
    AppendSessionEvent,
    AuthenticatorFailed,
    CloseEgress,
    ForeignMessage,
    SendEgress,
    TakeSnapshot,
)

log = structlog.get_logger("consensus")


ONE_SHOT_REPLIES_PER_S = 200


ONE_SHOT_REPLIES_OPEN = 64


ONE_SHOT_LINGER_S = 0.25
"""How long a one-shot reply's publication stays after its event went out (retransmits)."""


class EgressPublisher:
    """Session effects and egress sends (see the module docstring)."""

    async def _execute_sessions(self) -> None:
        for e in self.sessions.drain_effects():
            if type(e) is AppendSessionEvent:
                self._appends.append((e.message, lambda position, e=e: self.sessions.on_event_appended(e, position)))
            elif type(e) is SendEgress:
                pub = self._egress.get(e.cluster_session_id)
                if pub is None and e.cluster_session_id == NULL_VALUE and not self._one_shot_reply_allowed():
                    continue
                if pub is None:
                    try:
                        pub = self.driver.add_publication(
                            f"{e.response_channel}",
                            self.cfg.cluster.egress_stream_id if e.response_stream_id <= 0 else e.response_stream_id,
                            exclusive=False,
                        )
                    except Exception as ex:  # noqa: BLE001 - a client's bad channel
                        log.warning("egress channel refused", channel=e.response_channel, error=str(ex))
                        continue
                    if e.cluster_session_id != NULL_VALUE:
                        self._egress[e.cluster_session_id] = pub
                self._tasks.start_soon(self._send_egress, pub, e.message, e.cluster_session_id == NULL_VALUE)
            elif type(e) is CloseEgress:
                pub = self._egress.pop(e.cluster_session_id, None)
                if pub is not None:
                    self._tasks.start_soon(self._close_later, pub)
            elif type(e) is ForeignMessage:
                self.counters["errors"].add(1)
                self.input_errors.record(
                    f"foreign {e.kind}",
                    f"a {e.kind} for a session from an ingress image other than the session's own was dropped",
                    session=e.cluster_session_id,
                )
            elif type(e) is TakeSnapshot:
                position, can_append = self._leader_append_state()
                effects = self._control.on_admin_snapshot(time.monotonic_ns(), position, can_append)
                if effects is not None:
                    self._run_control(effects)
                else:
                    log.warning(
                        "admin request: snapshot not taken, the cluster is no longer ACTIVE",
                        session=e.cluster_session_id,
                    )
            elif type(e) is AuthenticatorFailed:
                self.counters["errors"].add(1)
                self.input_errors.record(
                    f"authenticator failed: {e.error.split(':')[0]}",
                    "the authenticator or authorisation service raised: the client is refused",
                    level="error",
                    error=e.error,
                )
        self._flush_appends()

    def _one_shot_reply_allowed(self) -> bool:
        """May a reply that needs a publication of its own (a REDIRECT or ERROR to a connect
        request) go out now? At most ONE_SHOT_REPLIES_PER_S a second and ONE_SHOT_REPLIES_OPEN
        at once: each costs a socket, a log buffer and counters for a few seconds, and connect
        requests cost their sender one datagram. A refused one is counted and said once."""
        now = time.monotonic_ns()
        rate = ONE_SHOT_REPLIES_PER_S
        self._reply_tokens = min(float(rate), self._reply_tokens + (now - self._reply_tokens_ns) / 1e9 * rate)
        self._reply_tokens_ns = now
        if self._reply_tokens >= 1.0 and self._one_shot_open < ONE_SHOT_REPLIES_OPEN:
            self._reply_tokens -= 1.0
            return True
        self.counters["errors"].add(1)
        self.input_errors.record(
            "connect reply dropped: rate",
            "a reply to a connect request was not sent: "
            f"more than {rate} a second or {ONE_SHOT_REPLIES_OPEN} under way",
        )
        return False

    async def _send_egress(self, pub, message, close_after: bool) -> None:
        """Send a session event, retrying while the client's egress connects (bounded)."""
        if close_after:
            self._one_shot_open += 1
            try:
                await self._send_egress_once(pub, message, True)
            finally:
                self._one_shot_open -= 1
        else:
            await self._send_egress_once(pub, message, False)

    async def _send_egress_once(self, pub, message, close_after: bool) -> None:
        data = EGRESS_CODEC.encode(message)
        sent = False
        # A client that asked is listening and connects within a round trip; a one-shot reply
        # (to a connect request) holds its publication only briefly, so that forged requests
        # naming channels nobody listens on free the reply budget soon (_one_shot_reply_allowed).
        with trio.move_on_after(1.0 if close_after else 5.0):
            while pub.offer(data) < 0:
                if pub.closed:
                    break
                await trio.sleep(0.005)
            else:
                sent = True
        fields = dict(
            event_type=type(message).__name__,
            session=getattr(message, "cluster_session_id", None),
            code=getattr(getattr(message, "code", None), "name", None),
        )
        if sent:
            log.debug("session event sent", **fields)
        elif close_after:
            self.input_errors.record(
                "connect reply not delivered",
                "a reply to a connect request was not delivered (nobody listened on its channel)",
                level="info",
                **fields,
            )
        else:
            log.info("session event not delivered", **fields)
        if close_after:
            await self._close_later(pub, ONE_SHOT_LINGER_S if sent else 0.0)

    async def _close_later(self, pub, linger_s: float = 1.0) -> None:
        await trio.sleep(linger_s)  # let the last event be sent (and retransmitted) first
        pub.close()
