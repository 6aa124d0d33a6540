"""Who gets a member's BackupResponse: backup queries through the authenticator (core)

A BackupResponse names the member's snapshot and log recordings, which its archive then serves:
it is the cluster's whole state. So a BackupQuery is treated as the reference's consensus module
treats one, as a session connect (its ``BACKUP`` action): the node's authenticator
(``consensus.auth``) sees its ``encoded_credentials`` and decides, and may challenge first::

    BackupQuery(correlation, response channel, credentials) ─► on_connect_request
                                                              on_connected_session ─┬─ authenticate ─► BackupResponse
        Challenge(correlation, session id, nonce)        ◄─────────────── challenge ┤
        ChallengeResponse(correlation, session id, answer) ─► on_challenge_response  └─ reject ──────► SessionEvent
                                                              on_challenged_session      AUTHENTICATION_REJECTED
                                                              (authenticate / reject as above)

The Challenge and the rejection go to the query's response channel (the reference's egress
messages: a BackupResponse has no error field); the ChallengeResponse comes on the member's
consensus channel, and is taken only from the image the query came on, with the query's
correlation id and the session id the Challenge named. A query is answered by any member, so
its session id is not a cluster session id (those are in the log): each member numbers its
backup queries from a random base far above any client session id, so the authenticator can
hold both kinds in one table.

With ``trusted`` (the cluster's member traffic is MAC'd: ``cluster.secret_file``) every query
is answered at once: it passed the MAC check, so its sender holds the cluster key, which lets
it speak as any member anyway (docs/security.md).

Bounds: at most ``capacity`` queries are being decided at once (more are refused with a
SessionEvent ERROR, "busy", which a backup takes as a reason to ask again later); a
query undecided after ``timeout_ns`` (``auth.challenge_timeout``) is rejected and forgotten,
the authenticator's entry with it (``forget``). A duplicate of a query being decided (same
image, same correlation id) is ignored.

Inputs: ``on_query``, ``on_challenge_response``, ``process`` (each duty cycle while
``pending``). Effects (``drain_effects``): :class:`AnswerBackup`, :class:`SendBackupReply`,
:class:`BackupAuthenticatorFailed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cluster_node.codecs import (
    CLIENT_PROTOCOL_VERSION,
    NULL_VALUE,
    BackupQuery,
    Challenge,
    ChallengeResponse,
    EventCode,
    SessionEvent,
)

__all__ = [
    "AnswerBackup",
    "SendBackupReply",
    "BackupAuthenticatorFailed",
    "BackupQueryAuth",
    "BACKUP_SESSION_ID_BASE",
    "MAX_PENDING_BACKUP_QUERIES",
]

BACKUP_SESSION_ID_BASE = 1 << 56
"""Backup query session ids start at a random point at or above this (client session ids count
up from 1 and never get near it)."""

MAX_PENDING_BACKUP_QUERIES = 16
"""Queries being authenticated at once; a backup asks one member at a time, so a few suffice."""

BUSY_REASON = "too many backup queries being authenticated: try again"


@dataclass(frozen=True, slots=True)
class AnswerBackup:
    """Send the BackupResponse (the authenticator accepted the asker as ``principal``)."""

    correlation_id: int
    response_channel: str
    response_stream_id: int
    principal: bytes


@dataclass(frozen=True, slots=True)
class SendBackupReply:
    """Send ``message`` (a Challenge, or a SessionEvent AUTHENTICATION_REJECTED) to the query's
    response channel; ``reason``: the rejection's reason ("" for a Challenge)."""

    response_channel: str
    response_stream_id: int
    message: Challenge | SessionEvent
    reason: str = ""


@dataclass(frozen=True, slots=True)
class BackupAuthenticatorFailed:
    """The authenticator raised while deciding on a query (the asker is rejected)."""

    error: str


@dataclass(slots=True)
class _Query:
    session_id: int
    correlation_id: int
    response_channel: str
    response_stream_id: int
    image_session_id: int
    started_ns: int
    challenged: bool = False
    done: bool = False


class _QueryProxy:
    """What the authenticator may do with one backup query, for the length of one call (the
    ``consensus.auth.SessionProxy`` interface)."""

    __slots__ = ("_auth", "query")

    def __init__(self, auth: BackupQueryAuth, query: _Query) -> None:
        self._auth = auth
        self.query: _Query | None = query

    @property
    def session_id(self) -> int:
        return self.query.session_id if self.query is not None else NULL_VALUE

    def challenge(self, encoded_challenge: bytes) -> bool:
        q = self.query
        if q is None or q.done:
            return False
        q.challenged = True
        self._auth._effects.append(
            SendBackupReply(
                q.response_channel,
                q.response_stream_id,
                Challenge(q.correlation_id, q.session_id, bytes(encoded_challenge)),
            )
        )
        return True

    def authenticate(self, encoded_principal: bytes | None) -> bool:
        q = self.query
        if q is None or q.done:
            return False
        self._auth._finish(q)
        self._auth.answered += 1
        self._auth._effects.append(
            AnswerBackup(q.correlation_id, q.response_channel, q.response_stream_id, bytes(encoded_principal or b""))
        )
        return True

    def reject(self, reason: str = "") -> None:
        q = self.query
        if q is not None and not q.done:
            self._auth._reject(q, reason or "authentication rejected")


@dataclass
class BackupQueryAuth:
    """Backup queries of one member being authenticated (see the module docstring)."""

    authenticator: Any
    member_id: int
    timeout_ns: int
    session_id_base: int
    """A random value at or above BACKUP_SESSION_ID_BASE (the shell draws it)."""
    trusted: bool = False
    capacity: int = MAX_PENDING_BACKUP_QUERIES
    pending: dict[int, _Query] = field(default_factory=dict)
    answered: int = 0
    rejected: int = 0
    _next_id: int = 0
    _effects: list = field(default_factory=list)

    def drain_effects(self) -> list:
        effects, self._effects = self._effects, []
        return effects

    def on_query(self, msg: BackupQuery, image_session_id: int, now_ns: int) -> None:
        """A query whose response channel the shell checked (a plain endpoint of its sender's
        host)."""
        if self.trusted:
            self.answered += 1
            self._effects.append(AnswerBackup(msg.correlation_id, msg.response_channel, msg.response_stream_id, b""))
            return
        for q in self.pending.values():
            if q.image_session_id == image_session_id and q.correlation_id == msg.correlation_id:
                return  # asked again while being decided: the first one's answer will come
        session_id = self.session_id_base + self._next_id
        self._next_id += 1
        q = _Query(
            session_id, msg.correlation_id, msg.response_channel, msg.response_stream_id, image_session_id, now_ns
        )
        if len(self.pending) >= self.capacity:
            # ERROR, not AUTHENTICATION_REJECTED: nothing is wrong with the asker, who asks again.
            self._reject(q, BUSY_REASON, EventCode.ERROR)
            return
        self.pending[session_id] = q
        try:
            self.authenticator.on_connect_request(session_id, bytes(msg.encoded_credentials), now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the authenticator is the operator's code
            self._failed(q, e)
            return
        self._decide(q, now_ns)

    def on_challenge_response(self, msg: ChallengeResponse, image_session_id: int, now_ns: int) -> bool:
        """True when ``msg`` answers a Challenge of ours (from the query's own image, with its
        correlation id); anything else is the shell's to count as bad input."""
        q = self.pending.get(msg.cluster_session_id)
        if (
            q is None
            or not q.challenged
            or q.correlation_id != msg.correlation_id
            or q.image_session_id != image_session_id
        ):
            return False
        try:
            self.authenticator.on_challenge_response(q.session_id, bytes(msg.encoded_credentials), now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the operator's code
            self._failed(q, e)
            return True
        self._decide(q, now_ns)
        return True

    def process(self, now_ns: int) -> int:
        """Ask the authenticator again about every undecided query; reject those older than
        the timeout."""
        if not self.pending:
            return 0
        for q in list(self.pending.values()):
            if now_ns - q.started_ns > self.timeout_ns:
                self._forget(q)
                self._reject(q, f"not authenticated within {self.timeout_ns // 1_000_000} ms")
            else:
                self._decide(q, now_ns)
        return 1

    def _decide(self, q: _Query, now_ns: int) -> None:
        proxy = _QueryProxy(self, q)
        try:
            if q.challenged:
                self.authenticator.on_challenged_session(proxy, now_ns // 1_000_000)
            else:
                self.authenticator.on_connected_session(proxy, now_ns // 1_000_000)
        except Exception as e:  # noqa: BLE001 - the operator's code
            if not q.done:
                self._failed(q, e)
        finally:
            proxy.query = None  # a proxy the authenticator kept can do nothing more

    def _failed(self, q: _Query, error: Exception) -> None:
        self._effects.append(BackupAuthenticatorFailed(f"{type(error).__name__}: {error}"))
        self._forget(q)
        self._reject(q, "authenticator error")

    def _forget(self, q: _Query) -> None:
        forget = getattr(self.authenticator, "forget", None)
        if forget is not None:
            forget(q.session_id)

    def _finish(self, q: _Query) -> None:
        q.done = True
        self.pending.pop(q.session_id, None)

    def _reject(self, q: _Query, reason: str, code: EventCode = EventCode.AUTHENTICATION_REJECTED) -> None:
        self._finish(q)
        self.rejected += 1
        reason = reason[:200]
        self._effects.append(
            SendBackupReply(
                q.response_channel,
                q.response_stream_id,
                SessionEvent(
                    q.session_id,
                    q.correlation_id,
                    NULL_VALUE,
                    NULL_VALUE,
                    code,
                    CLIENT_PROTOCOL_VERSION,
                    f"member {self.member_id}: {reason}",
                ),
                reason,
            )
        )
