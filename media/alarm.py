"""Alarms: timed waits for the driver's thread that end through the I/O manager, not a cancel scope.

A trio task that waits "until this event or that deadline" usually writes
``with trio.move_on_after(t): await event.wait()``. That costs more than it looks on the hot and
the idle path alike (2-core VM, trio 0.35, ``/tmp``-style micro-benchmarks, median of runs):

* every park pays for the scope even when the event comes first: a hand-off between two tasks
  costs 7 µs of CPU with a bare ``Event.wait`` and 21 µs inside ``move_on_after``;
* a deadline that expires is delivered as a ``Cancelled`` exception thrown through the waiting
  coroutine's frames; a task that wakes from idle on its deadline spends about 100 µs more CPU
  than one whose wait ends because a timer file descriptor became readable (350 against 250 µs
  per wake-up, most of it the cold exception path).

An idle node wakes a few dozen times a second on deadlines alone (heartbeats, status messages,
IPC liveness), so this was a good part of an idle cluster's CPU.

Two tools replace the pattern:

* :class:`Alarm`, a Linux ``timerfd`` (``CLOCK_MONOTONIC``, the clock of ``time.monotonic_ns``):
  arm it for a deadline and wait until its fd is readable, or add the fd to an epoll set that
  a task already waits on (the media driver's receive set: the consensus agent's park is then one
  wait for "a datagram or my deadline"). :meth:`Alarm.ring` makes it fire now, from any thread.
* :class:`Timers`, one alarm for every deadline of one thread: it sets plain
  :class:`trio.Event` objects (or calls callbacks) at their deadlines, so loops park on a bare
  ``Event.wait`` (cheap to wake early), and its fd sits in the media driver's receive set, so
  the deadlines of all the thread's loops that coincide on the driver's timer grid cost one
  wake-up of the process, read in the same step as the datagrams.

``timerfd_create`` and ``timerfd_settime`` are called through ctypes (the ``os`` module has them
from Python 3.13 only); a call costs about 2 µs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import time

from typing import Callable

import trio

__all__ = ["Alarm", "Timers"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1
_NS = 1_000_000_000


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc = ctypes.CDLL(None, use_errno=True)
_timerfd_create = _libc.timerfd_create
_timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
_timerfd_create.restype = ctypes.c_int
_timerfd_settime = _libc.timerfd_settime
_timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
_timerfd_settime.restype = ctypes.c_int


class Alarm:
    """A one-shot timer with a file descriptor: readable from its deadline until :meth:`clear`.

    Not a trio object: any thread may :meth:`set` or :meth:`ring` it (the kernel orders the
    calls); one task waits on it (:meth:`wait`) or an epoll set holds its fd."""

    def __init__(self) -> None:
        fd = _timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"timerfd_create: {os.strerror(e)}")
        self._fd = fd
        self._spec = _Itimerspec()
        self._ref = ctypes.byref(self._spec)
        self.deadline_ns = 0
        """The deadline it is armed for (monotonic ns); 0 when disarmed."""

    def fileno(self) -> int:
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def set(self, deadline_ns: int) -> None:
        """Arm for ``deadline_ns`` (``time.monotonic_ns`` clock), replacing any earlier setting;
        a deadline that has passed fires at once."""
        if self._fd < 0:
            return
        deadline_ns = max(1, deadline_ns)  # 0 would disarm it
        self.deadline_ns = deadline_ns
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(deadline_ns, _NS)
        if _timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, self._ref, None) < 0:
            e = ctypes.get_errno()
            if e != errno.EBADF:  # closed by another thread meanwhile: nothing to wake
                raise OSError(e, f"timerfd_settime: {os.strerror(e)}")

    def ring(self) -> None:
        """Fire now (a deadline long past)."""
        self.set(1)

    def disarm(self) -> None:
        if self._fd < 0:
            return
        self.deadline_ns = 0
        value = self._spec.it_value
        value.tv_sec = value.tv_nsec = 0
        _timerfd_settime(self._fd, 0, self._ref, None)

    def clear(self) -> bool:
        """Consume a firing (the fd is not readable afterwards); True if it had fired."""
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False
        return True

    async def wait(self, deadline_ns: int) -> None:
        """Wait until ``deadline_ns`` or an earlier :meth:`ring` (the caller re-checks why)."""
        self.set(deadline_ns)
        await trio.lowlevel.wait_readable(self._fd)
        self.clear()

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            trio.lowlevel.notify_closing(fd)
        except RuntimeError:
            pass  # not in a trio loop: nobody waits on it
        os.close(fd)


class Timers:
    """Deadlines for the tasks of one trio thread, all kept by one alarm.

    The alarm's fd is meant for a wait that already happens: the media driver adds it to its
    receive set, so whoever reads the sockets (the receiver task, or the consensus agent when it
    has claimed the receive) runs :meth:`fire` in the same step as the datagrams that arrived.
    Every deadline of the thread that falls on the driver's timer grid then costs one wake-up of
    the process, not one per task.

    A loop parks with ``await timers.sleep_until(event, deadline_ns)``: it returns when
    ``event`` is set, by whoever wants the loop to run now or by :meth:`fire` at the deadline,
    and the caller re-checks its own state, as after any wake-up. :meth:`schedule` is the plain
    form, a callback at a deadline (``key`` names the entry); :meth:`move` changes one."""

    def __init__(self) -> None:
        self.alarm = Alarm()
        self._entries: dict[object, tuple[int, Callable[[], object]]] = {}

    def schedule(self, key: object, deadline_ns: int, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from :meth:`fire`) once ``deadline_ns`` has passed, unless
        :meth:`unschedule` or another ``schedule`` of the same key comes first."""
        self._entries[key] = (deadline_ns, callback)
        alarm = self.alarm
        if alarm.deadline_ns == 0 or deadline_ns < alarm.deadline_ns:
            alarm.set(deadline_ns)

    def unschedule(self, key: object) -> None:
        self._entries.pop(key, None)
        # The alarm stays armed: if it fires for nothing, fire() re-arms for the earliest left
        # (cheaper than a system call on every park that ends early).

    def move(self, key: object, deadline_ns: int) -> None:
        """A scheduled entry's new deadline (nothing if there is none)."""
        entry = self._entries.get(key)
        if entry is not None:
            self.schedule(key, deadline_ns, entry[1])

    async def sleep_until(self, event: trio.Event, deadline_ns: int) -> None:
        if event.is_set():
            await trio.lowlevel.checkpoint()
            return
        self.schedule(event, deadline_ns, event.set)
        try:
            await event.wait()
        finally:
            self._entries.pop(event, None)

    def fire(self) -> int:
        """Run what is due (the alarm's fd was readable); re-arm for the earliest left. Returns
        0, the datagrams it read (a handler of the driver's receive set)."""
        alarm = self.alarm
        alarm.clear()
        alarm.deadline_ns = 0
        entries = self._entries
        if not entries:
            return 0
        now = time.monotonic_ns()
        earliest = 0
        due = []
        for key, (deadline, callback) in entries.items():
            if deadline <= now:
                due.append((key, callback))
            elif earliest == 0 or deadline < earliest:
                earliest = deadline
        for key, callback in due:
            del entries[key]
            callback()
        if earliest and (alarm.deadline_ns == 0 or earliest < alarm.deadline_ns):
            alarm.set(earliest)
        return 0

    def close(self) -> None:
        self.alarm.close()
