"""Who may open a session and who may send admin requests (core)

The leader asks an :class:`Authenticator` about every connect request (the reference's
``io.aeron.security.Authenticator``) and an :class:`AuthorisationService` about every admin
request (the reference's ``AuthorisationService``). Both are chosen in the node config
(``[auth]``, see ``cluster_node.auth``); both run on the leader only, in its duty cycle, so they
must answer at once (no I/O that waits).

An authenticator sees a connecting session through these calls, all with the cluster's time in
milliseconds:

* ``on_connect_request(session_id, encoded_credentials, now_ms)``: the client's connect request
  arrived (the session is CONNECTED);
* ``on_connected_session(proxy, now_ms)``: right after that and then each duty cycle while the
  session stays CONNECTED: decide with ``proxy.authenticate(principal)``, ``proxy.challenge(
  bytes)`` or ``proxy.reject(reason)``, or leave it for later;
* ``on_challenge_response(session_id, encoded_credentials, now_ms)``: the client answered the
  challenge (only from the ingress image the connect request came on);
* ``on_challenged_session(proxy, now_ms)``: right after that and then each duty cycle while the
  session stays CHALLENGED: decide as above.

A session still undecided after the cluster's session timeout is rejected by the leader itself.
An authenticated session is opened: its principal goes into the log's SessionOpenEvent
(``encoded_principal``), so every member's service sees the same one, also in a replay.

Built in here: :class:`NullAuthenticator` (everyone, empty principal: the reference's default)
and :class:`SharedSecretAuthenticator` (a challenge-response over a per-client key), and
:class:`AllowListAuthorisation` (admin requests of listed principals; nobody by default).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "Authenticator",
    "SessionProxy",
    "NullAuthenticator",
    "SharedSecretAuthenticator",
    "AuthorisationService",
    "AllowListAuthorisation",
    "DenyAllAuthorisation",
    "challenge_answer",
    "NONCE_BYTES",
    "MAX_CLIENT_ID_BYTES",
]

NONCE_BYTES = 32
MAX_CLIENT_ID_BYTES = 128


@runtime_checkable
class SessionProxy(Protocol):
    """What an authenticator may do with a session it is asked about."""

    @property
    def session_id(self) -> int: ...

    def challenge(self, encoded_challenge: bytes) -> bool:
        """Send the client a Challenge; the session becomes CHALLENGED."""
        ...

    def authenticate(self, encoded_principal: bytes) -> bool:
        """Accept the client as ``encoded_principal``: the session is opened."""
        ...

    def reject(self, reason: str = "") -> None:
        """Refuse the client: it is told AUTHENTICATION_REJECTED with ``reason``."""
        ...


@runtime_checkable
class Authenticator(Protocol):
    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None: ...

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None: ...

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None: ...

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None: ...


@runtime_checkable
class AuthorisationService(Protocol):
    def is_authorised(
        self, protocol_id: int, action_id: int, request_type: object, encoded_principal: bytes
    ) -> bool: ...


class NullAuthenticator:
    """Every client is accepted at once with an empty principal (the reference's default)."""

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        pass

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        pass

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        proxy.authenticate(b"")

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        proxy.authenticate(b"")


def challenge_answer(key: bytes, nonce: bytes, client_id: bytes) -> bytes:
    """What a client holding ``key`` answers to ``nonce``: HMAC-SHA256(key, nonce || id). The
    id is inside the MAC so that an answer cannot be moved to another client's connect."""
    return hmac.new(key, nonce + client_id, hashlib.sha256).digest()


@dataclass(slots=True)
class _Pending:
    client_id: bytes
    key: bytes | None
    refusal: str = ""
    nonce: bytes = b""
    challenged_at_ms: int = 0
    verdict: bool | None = None
    """None: no answer yet; True/False: the answer matched / did not."""


@dataclass(slots=True)
class SharedSecretAuthenticator:
    """A challenge-response over a key per client.

    The client sends its id (UTF-8) as the connect request's credentials. The leader challenges
    it with a fresh random nonce of :data:`NONCE_BYTES`; the client answers
    :func:`challenge_answer` with its key; the principal is the client id. A nonce is used for
    one answer only and dies with its session, so an answer recorded from an earlier connect
    fails (its nonce is not this one's). A challenge unanswered for ``challenge_timeout_ms`` is
    rejected. ``random_bytes(n)`` is injected (``secrets.token_bytes`` in a node).
    """

    keys: dict[bytes, bytes]
    """client id -> key."""
    random_bytes: Callable[[int], bytes]
    challenge_timeout_ms: int = 5_000
    _pending: dict[int, _Pending] = field(default_factory=dict)

    def on_connect_request(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        client_id = bytes(encoded_credentials)
        if not client_id:
            self._pending[session_id] = _Pending(b"", None, "no credentials: this cluster needs a client id and key")
            return
        key = self.keys.get(client_id)
        # One reason for an unknown id and a wrong key: which ids exist is not told to strangers.
        refusal = "" if key is not None else "unknown client id or wrong key"
        self._pending[session_id] = _Pending(client_id, key, refusal)

    def on_connected_session(self, proxy: SessionProxy, now_ms: int) -> None:
        p = self._pending.get(proxy.session_id)
        if p is None or p.refusal:
            self._pending.pop(proxy.session_id, None)
            proxy.reject(p.refusal if p is not None else "no connect request seen")
            return
        p.nonce = self.random_bytes(NONCE_BYTES)
        p.challenged_at_ms = now_ms
        if not proxy.challenge(p.nonce):
            self._pending.pop(proxy.session_id, None)

    def on_challenge_response(self, session_id: int, encoded_credentials: bytes, now_ms: int) -> None:
        p = self._pending.get(session_id)
        if p is None or not p.nonce or p.verdict is not None:
            return
        expected = challenge_answer(p.key or b"", p.nonce, p.client_id)
        p.verdict = hmac.compare_digest(expected, bytes(encoded_credentials))
        p.nonce = b""  # one answer per challenge

    def on_challenged_session(self, proxy: SessionProxy, now_ms: int) -> None:
        p = self._pending.get(proxy.session_id)
        if p is None:
            proxy.reject("challenge lost")
            return
        if p.verdict is True:
            del self._pending[proxy.session_id]
            proxy.authenticate(p.client_id)
        elif p.verdict is False:
            del self._pending[proxy.session_id]
            proxy.reject("unknown client id or wrong key")
        elif now_ms - p.challenged_at_ms > self.challenge_timeout_ms:
            del self._pending[proxy.session_id]
            proxy.reject(f"challenge not answered within {self.challenge_timeout_ms} ms")

    def forget(self, session_id: int) -> None:
        """The session is gone without a decision of ours (the leader stepped down, or the
        session timed out): its nonce must not stay usable."""
        self._pending.pop(session_id, None)


class DenyAllAuthorisation:
    """No admin request is authorised."""

    def is_authorised(self, protocol_id: int, action_id: int, request_type: object, encoded_principal: bytes) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class AllowListAuthorisation:
    """Admin requests are authorised for the listed principals (and nobody else; an empty
    list, the default, denies every request)."""

    principals: frozenset[bytes] = frozenset()

    def is_authorised(self, protocol_id: int, action_id: int, request_type: object, encoded_principal: bytes) -> bool:
        return bool(encoded_principal) and bytes(encoded_principal) in self.principals
