"""Authenticated datagrams (core): a keyed MAC trailer on every datagram of a member channel.

A channel with ``auth=mac`` carries, after the datagram's frames, a trailer of
:data:`MAC_LENGTH` bytes::

    +-----------------------------+------------------------------------------+
    | the datagram as without MAC | BLAKE2b-128(key, the bytes before it)    |
    +-----------------------------+------------------------------------------+

over the *whole* datagram (DATA, PAD, SETUP, heartbeats, status messages, NAKs, RTTM alike), so a
receiver checks it before it parses a single frame and bytes from whoever does not hold the key
never reach the frame parser. BLAKE2b has a keyed mode of its own (no HMAC construction needed),
is in the standard library and costs one pass over the bytes; 16 bytes of tag leave a forger
one chance in 2**128 per datagram.

**What a MAC does not stop: replay.** A captured datagram verifies wherever it is sent. Every
frame's header already binds it to one stream instance and place (session id, stream id, term id,
term offset, and for control frames the receiver id of the image), so a replayed data frame can
only land where it came from, as a duplicate, which the receiver drops. What a replay can still do
is bounded elsewhere:

* a replayed SETUP re-creates the image of a stream that ended; its data, if replayed too, is
  old messages at their old positions (the consensus module ignores messages of old terms and
  positions that move backwards), and image creation is bounded by the driver's image limits
  and rate, each image by its liveness timeout;
* a replayed status message or NAK is accepted by a publication only from one of its own
  destinations (the driver checks the source address of control frames on an ``auth=mac``
  publication), so it must also be sent from a spoofed member address; it then names a receiver
  id and a position already reported (flow control keeps the newest per receiver; a receiver
  that left is forgotten after the receiver timeout once its replays stop) or asks a
  retransmit that the sender makes at most once per range and linger;
* RTTM only answers with a timestamp.

Keys: a :class:`MacKeys` holds the current key and, during a rolling restart to a new key, the
previous one: datagrams are always signed with the current key and accepted under either.
There is no encryption: payloads travel in clear.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["MAC_LENGTH", "MacKeys", "AUTH_MAC"]

MAC_LENGTH = 16
AUTH_MAC = "mac"
"""The value of the channel parameter ``auth`` that asks for MAC'd datagrams."""

_compare = hmac.compare_digest


class MacKeys:
    """Sign and verify datagrams with a key (and accept a previous one during a rotation).

    One keyed BLAKE2b state per key is made up front; each datagram costs a copy of that state
    (cheaper than keying a new one) and one pass over its bytes."""

    __slots__ = ("_current", "_previous")

    def __init__(self, key: bytes, previous: bytes | None = None) -> None:
        if not 16 <= len(key) <= 64:
            raise ValueError(f"a MAC key has 16 to 64 bytes, not {len(key)}")
        if previous is not None and not 16 <= len(previous) <= 64:
            raise ValueError(f"a previous MAC key has 16 to 64 bytes, not {len(previous)}")
        self._current = hashlib.blake2b(key=key, digest_size=MAC_LENGTH)
        self._previous = (
            hashlib.blake2b(key=previous, digest_size=MAC_LENGTH) if previous is not None and previous != key else None
        )

    def __repr__(self) -> str:
        return f"<MacKeys previous={'yes' if self._previous is not None else 'no'}>"  # never the key

    def sign(self, data) -> bytes:
        """The trailer for ``data`` (bytes-like: the whole datagram before the trailer)."""
        h = self._current.copy()
        h.update(data)
        return h.digest()

    def signed(self, data) -> bytes:
        """``data`` with its trailer (a copy: for a datagram that is built anyway)."""
        return bytes(data) + self.sign(data)

    def verify(self, view, n: int) -> int:
        """The length of the datagram ``view[:n]`` without its trailer when the trailer is
        right under the current or the previous key; -1 otherwise (too short, altered, another
        key). Nothing is copied."""
        body = n - MAC_LENGTH
        if body <= 0:
            return -1
        data = view[:body]
        tag = view[body:n]  # (compare_digest takes a buffer: no copy)
        h = self._current.copy()
        h.update(data)
        if _compare(h.digest(), tag):
            return body
        if self._previous is not None:
            h = self._previous.copy()
            h.update(data)
            if _compare(h.digest(), tag):
                return body
        return -1
