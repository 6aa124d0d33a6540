"""Doorbells: how a writer wakes a parked reader in another thread or process without spinning.

A reader that finds nothing to read marks itself *parked* in the log buffer (a flag the writer
checks after each append: one byte read), checks once more, and waits on its doorbell: a Unix
datagram socket in the Linux abstract namespace (no file to clean up; gone when the process is).
A writer that sees the flag clears it and sends one byte to every parked reader's doorbell. The
reader's wait also has a timeout, so a wake-up lost to a race costs latency, never a hang.

A writer in the reader's own thread (the consensus agent appending to the local log that the
archive's recorder, in the same trio loop, waits on) does not need the socket: :func:`ring` finds
the doorbell in this process's registry and ends its wait directly (cancelling the wait's scope),
which saves two system calls and a pass through epoll per wake-up. Rings from any other thread
or process go through the socket.

Message bytes: ``D`` new data, ``N`` a new publication to discover.
"""

from __future__ import annotations

import itertools
import os
import socket
import threading

import trio

__all__ = ["Doorbell", "ring", "doorbell_pid", "DATA", "NEW_PUBLICATION"]

DATA = b"D"
NEW_PUBLICATION = b"N"
_counter = itertools.count()
_send_lock = threading.Lock()
_send_socket: socket.socket | None = None
_send_pid = 0
_local: "dict[bytes, Doorbell]" = {}
"""Open doorbells of this process by name, for the same-thread fast path of :func:`ring` (a plain
dict: a ring looks here first, so the lookup must cost next to nothing; close() removes)."""


def _sender() -> socket.socket:
    global _send_socket, _send_pid
    if _send_socket is None or _send_pid != os.getpid():  # a forked child needs its own
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        _send_socket, _send_pid = s, os.getpid()
    return _send_socket


def doorbell_pid(name: str) -> int | None:
    """The id of the process that made a doorbell, from its name (``pyc-<pid>-<n>-<hex>``, see
    :class:`Doorbell`), or None for a name not of that form."""
    parts = name.split("-")
    if len(parts) < 3 or parts[0] != "pyc" or not parts[1].isdigit():
        return None
    return int(parts[1])


def ring(name: bytes, what: bytes = DATA) -> bool:
    """Wake the reader behind doorbell ``name``; False when it is gone or its queue is full."""
    if not name:
        return False
    local = _local.get(name)
    if local is not None and local._waiting_thread == threading.get_ident():
        local._local_rings += what
        local._waiting_thread = None
        local._scope.cancel()
        return True
    try:
        with _send_lock:
            _sender().sendto(what, b"\0" + name)
        return True
    except OSError:
        return False


class Doorbell:
    """The receiving end: owned by one reader (a subscription)."""

    def __init__(self) -> None:
        # (doorbell_pid reads the pid back: stale subscriber markers are those of dead processes)
        self.name = f"pyc-{os.getpid()}-{next(_counter)}-{os.urandom(3).hex()}".encode()
        assert len(self.name) <= 32
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(b"\0" + self.name)
        self._sock.setblocking(False)
        self._waiting_thread: int | None = None
        self._scope: trio.CancelScope | None = None
        self._local_rings = b""
        _local[self.name] = self

    def drain(self) -> bytes:
        """Read every pending ring; return the distinct message bytes seen."""
        seen = b""
        if self._local_rings:
            for b in set(self._local_rings):
                seen += bytes([b])
            self._local_rings = b""
        while True:
            try:
                data = self._sock.recv(64)
            except (BlockingIOError, InterruptedError):
                return seen
            except OSError:
                return seen
            if data and data[:1] not in seen:
                seen += data[:1]

    async def wait(self, timeout_s: float) -> None:
        """Wait until rung or the timeout passes (the caller re-checks its condition either way)."""
        with trio.move_on_after(timeout_s) as scope:
            self._scope = scope
            self._waiting_thread = threading.get_ident()
            try:
                await trio.lowlevel.wait_readable(self._sock)
            finally:
                self._waiting_thread = None
                self._scope = None

    def wait_blocking(self, timeout_s: float) -> None:
        """The same for a thread without a trio loop."""
        import select

        select.select([self._sock], [], [], timeout_s)

    def close(self) -> None:
        _local.pop(self.name, None)
        try:
            self._sock.close()
        except OSError:
            pass
