"""The simulator's clients: each sends messages to whoever it believes leads, follows redirects,
and takes the leader's acknowledgements (with sessions modelled, ``sim_sessions`` does the
sending). A mixin of :class:`tests.support.sim.Simulation`.
"""

from __future__ import annotations

from tests.support.sim_model import _ACK, _CLIENT, _INGRESS, _REDIRECT, MS


class Clients:
    """The client events of a :class:`~tests.support.sim.Simulation` (mixed into it)."""

    def _on_client(self, client: int) -> None:
        if not self.clients_active:
            return
        cfg = self.config
        if self.now_ns - self.client_last_reply_ns[client] > 300 * MS:
            self.client_leader[client] = self.rng.randrange(len(self.members))
            self.client_last_reply_ns[client] = self.now_ns
        target = self.client_leader[client]
        if self.sessions is not None:
            self.sessions.on_client(client, target)
        else:
            self.client_seq[client] += 1
            payload = b"c%d:%d" % (client, self.client_seq[client])
            if not (self.drop_rate and self.rng.random() < self.drop_rate):
                delay = self.rng.randint(cfg.delay_min_ns, cfg.delay_max_ns)
                self._schedule(delay, _INGRESS, (client, target, payload))
        self._schedule(cfg.client_interval_ns // 2 + self.rng.randrange(cfg.client_interval_ns), _CLIENT, (client,))

    def _on_ingress(self, client: int, member_id: int, payload: bytes) -> None:
        m = self.members[member_id]
        if not m.alive or self._deferred(m, _INGRESS, (client, member_id, payload)):
            return
        if m.core.on_ingress(client, payload, self.now_ns):
            self._run_core(m)
        else:
            leader = m.core.leader_member_id
            if leader >= 0:
                self._schedule(self.config.delay_min_ns, _REDIRECT, (client, leader))

    def _on_redirect(self, client: int, leader: int) -> None:
        self.client_leader[client] = leader
        self.client_last_reply_ns[client] = self.now_ns

    def _send_ack(self, member_id: int, client: int, payload: bytes, end: int) -> None:
        if self.drop_rate and self.rng.random() < self.drop_rate:
            return
        delay = self.rng.randint(self.config.delay_min_ns, self.config.delay_max_ns)
        self._schedule(delay, _ACK, (client, member_id, payload, end))

    def _on_ack(self, client: int, member_id: int, payload: bytes, end: int) -> None:
        self.acked[payload] = end
        self.client_leader[client] = member_id
        self.client_last_reply_ns[client] = self.now_ns
