"""Doorbells: how a writer wakes a parked reader in another thread or process without spinning.

A reader that finds nothing to read marks itself *parked* in the log buffer (a flag the writer
checks after each append: one byte read), checks once more, and waits on its doorbell: a Unix
datagram socket in the Linux abstract namespace (no file to clean up; gone when the process is).
A writer that sees the flag clears it and sends one byte to every parked reader's doorbell. The
reader's wait also has a timeout, so a wake-up lost to a race costs latency, never a hang.

A writer in the reader's own thread (the consensus agent appending to the local log that the
archive's recorder, in the same trio loop, waits on) does not need the socket: :func:`ring` finds
the doorbell in this process's registry and ends its wait directly, which saves a send, a
receive and a socket buffer per wake-up. Rings from any other thread or process go through the
socket.

**The wait** needs a timeout, and a trio cancel scope for it (enter and exit) costs a noticeable
share of a wake-up, paid by the service thread once per committed log entry. Where Linux
offers timerfd and eventfd, a doorbell waits instead on an epoll set of its own holding the
socket, a timerfd (cluster_node/media/timerfd.py) for the timeout, moved only when a wait asks for an earlier
deadline than the one it holds (a later one lets it expire: that wait returns early and its
caller, which re-checks its condition anyway, waits again), and an eventfd that the same-thread
ring writes. Elsewhere the wait keeps the cancel scope. When no other task of the loop can run
first, the wait on that set skips trio altogether (cluster_node.media.directpark): the service thread parks
once per committed entry.

Message bytes: ``D`` new data, ``N`` a new publication to discover.
"""

from __future__ import annotations

import itertools
import os
import select
import socket
import threading
import time

import trio

from cluster_node.media.directpark import DirectPark
from cluster_node.media.timerfd import NEVER, open_timer_and_eventfd, read_eventfd

__all__ = ["Doorbell", "ring", "doorbell_pid", "DATA", "NEW_PUBLICATION"]

DATA = b"D"
NEW_PUBLICATION = b"N"
_counter = itertools.count()
_send_lock = threading.Lock()
_send_socket: socket.socket | None = None
_send_pid = 0
_local: dict[bytes, Doorbell] = {}
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
    if local is not None:
        if local._waiting_thread == threading.get_ident():
            local._local_rings += what
            local._waiting_thread = None
            if local._ep is not None:
                if not local._rung:
                    local._rung = True
                    os.eventfd_write(local._efd, 1)
            else:
                local._scope.cancel()
            return True
        if local._ep is not None:
            # Another thread of this process (the consensus agent ringing its service thread):
            # the eventfd, one 8-byte write, instead of a send to the socket's abstract name.
            local._thread_rings.append(what)  # (list.append: atomic under the GIL)
            try:
                os.eventfd_write(local._efd, 1)
                return True
            except OSError:
                return False  # closed meanwhile
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
        # The scope-free wait (see the module docstring): an epoll set of the socket, a timerfd
        # and an eventfd; None where timerfd or eventfd is missing.
        self._ep: select.epoll | None = None
        self._timer = None
        self._efd = -1
        self._rung = False  # the eventfd holds a same-thread ring
        self._thread_rings: list[bytes] = []  # rings from other threads of this process (eventfd)
        fds = open_timer_and_eventfd()
        if fds is not None:
            self._timer, self._efd = fds
            self._ep = select.epoll()
            for fd in (self._sock.fileno(), self._timer.fd, self._efd):
                self._ep.register(fd, select.EPOLLIN)
            self._direct = DirectPark(self._ep.fileno())
        _local[self.name] = self

    def drain(self) -> bytes:
        """Read every pending ring; return the distinct message bytes seen.

        With the epoll set, what is ready is asked of the set first, so an empty socket or
        eventfd is not read (a read that fails with EAGAIN raises, which costs more than asking)."""
        seen = b""
        if self._local_rings:
            for b in set(self._local_rings):
                seen += bytes([b])
            self._local_rings = b""
        ep = self._ep
        if ep is not None:
            sock_fd = self._sock.fileno()
            for _ in range(64):
                progressed = False
                for fd, _mask in ep.poll(0):
                    if fd == self._efd:
                        read_eventfd(fd)
                        self._rung = False
                    elif fd == sock_fd:
                        try:
                            data = self._sock.recv(64)
                        except (BlockingIOError, InterruptedError, OSError):
                            continue
                        progressed = True
                        if data and data[:1] not in seen:
                            seen += data[:1]
                if not progressed:
                    break
            # Rings from other threads: each is appended before its eventfd write, so every write
            # read above (or by wait) has its ring in the list by now; a later one leaves the
            # eventfd readable for the next wait.
            rings, self._thread_rings = self._thread_rings, []
            for what in rings:
                if what not in seen:
                    seen += what
            return seen
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
        """Wait until rung or the timeout passes (the caller re-checks its condition either way;
        the wait may also end early)."""
        ep = self._ep
        if ep is not None:
            timer = self._timer
            timer.arm_before(time.monotonic_ns() + int(timeout_s * 1e9) if timeout_s < 1e6 else NEVER - 1)
            self._waiting_thread = threading.get_ident()
            try:
                await self._direct.wait_readable()
            finally:
                self._waiting_thread = None
                if self._rung:
                    self._rung = False
                    read_eventfd(self._efd)
                if time.monotonic_ns() >= timer.armed_ns:
                    timer.drain()
            return
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
        if self._ep is not None:
            try:
                trio.lowlevel.notify_closing(self._ep.fileno())
            except RuntimeError:
                pass  # not in a trio loop: nobody can be waiting on it
            self._direct.close()
            self._ep.close()
            self._timer.close()
            os.close(self._efd)
            self._ep = None
        try:
            self._sock.close()
        except OSError:
            pass
