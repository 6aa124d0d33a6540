"""A Linux timerfd on CLOCK_MONOTONIC: a file descriptor that becomes readable at a deadline.

Why a file descriptor rather than a trio timeout: the driver's sockets are one epoll set, and a
duty cycle that reads them itself (``MediaDriver.claim_receive``) parks on that set once per
message it waits for. Giving that park a timeout with a trio cancel scope costs, per wait, the
scope's enter and exit, each through a context manager and the deadline heap: a sizeable share
of a UDP echo's path from wake-up to reply. A timerfd
in the same epoll set gives the same timeout for one system call, and only when the deadline
changes (``MediaDriver.park``).

Python before 3.13 has no ``os.timerfd_create``, so the two calls go through ctypes. The handle is
a :class:`ctypes.PyDLL`, which keeps the GIL across the call: these system calls take a
microsecond or two, less than handing the GIL to another thread and back.
:func:`open_timerfd` returns None where timerfd is missing (not Linux, no libc): the driver then
keeps the cancel-scope timeout.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["NEVER", "TimerFd", "open_timerfd", "open_timer_and_eventfd", "read_eventfd"]

NEVER = 1 << 62
"""A deadline that never comes (``TimerFd.armed_ns`` of a timer disarmed or drained)."""

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = None


def _load():
    global _libc
    if _libc is None:
        if not sys.platform.startswith("linux"):
            return None
        lib = None
        # The process's own symbols hold libc's; find_library runs ldconfig, so it is the fallback.
        for find in (lambda: None, lambda: ctypes.util.find_library("c")):
            try:
                lib = ctypes.PyDLL(find(), use_errno=True)
                create, settime = lib.timerfd_create, lib.timerfd_settime
                break
            except (OSError, AttributeError, TypeError):
                lib = None
        if lib is None:
            return None
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        create.restype = ctypes.c_int
        settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        settime.restype = ctypes.c_int
        _libc = lib
    return _libc


class TimerFd:
    """One non-blocking timerfd. :meth:`arm_at` sets its single expiry (an absolute
    ``time.monotonic_ns()`` value: the same clock); it is readable from then until :meth:`drain`.

    Its users (``MediaDriver.park``, ``Doorbell.wait``) give each wait a deadline but move the
    timer only for an earlier one (:meth:`arm_before`): a later deadline lets the armed one
    expire, and the wait it ends early just waits again, which costs less than a system call
    per wait."""

    def __init__(self, fd: int, settime) -> None:
        self.fd = fd
        self._settime = settime
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self.armed_ns = NEVER
        """When the timer expires; NEVER when disarmed or drained."""

    def arm_at(self, deadline_ns: int) -> None:
        """Expire at ``deadline_ns`` (monotonic). A deadline already past expires at once (the
        kernel takes a zero value to mean *disarm*, so it is raised to 1 ns)."""
        value = self._spec.it_value
        if deadline_ns < 1:
            deadline_ns = 1
        value.tv_sec, value.tv_nsec = divmod(deadline_ns, 1_000_000_000)
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def arm_before(self, deadline_ns: int) -> None:
        """Expire by ``deadline_ns``: :meth:`arm_at` when it is earlier than the armed expiry."""
        if deadline_ns < self.armed_ns:
            self.arm_at(deadline_ns)
            self.armed_ns = deadline_ns

    def drain(self) -> bool:
        """Read the expiry count, if any: True when the timer had expired. Either way the timer
        counts as disarmed after (the next :meth:`arm_before` arms it)."""
        self.armed_ns = NEVER
        try:
            os.read(self.fd, 8)
        except (BlockingIOError, InterruptedError):
            return False
        return True

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def open_timerfd() -> TimerFd | None:
    """A new timerfd, or None where the system has none (the caller falls back to trio timeouts)."""
    lib = _load()
    if lib is None:
        return None
    fd = lib.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
    if fd < 0:
        return None
    return TimerFd(fd, lib.timerfd_settime)


def open_timer_and_eventfd() -> tuple[TimerFd, int] | None:
    """A timerfd and a non-blocking eventfd, for a wait on an epoll set that needs a timeout and a
    wake-up from other tasks or threads; None where either is missing (the caller falls back to
    a trio cancel scope)."""
    timer = open_timerfd()
    if timer is None:
        return None
    if not hasattr(os, "eventfd"):
        timer.close()
        return None
    return timer, os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


def read_eventfd(fd: int) -> None:
    """Reset an eventfd (nothing when it was not readable)."""
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, InterruptedError):
        pass
