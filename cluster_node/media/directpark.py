"""Waiting in the kernel without a trio step, when the thread's trio loop has nothing else to do.

A duty cycle that parks (the consensus agent, the cluster client and the service thread, once
per message each) waits on one file descriptor: an epoll set of its own holding its sockets or
doorbell and a timerfd for its deadline. Through trio that wait is ``wait_readable`` on the set:
the fd is registered in trio's epoll set, the task is suspended, the run loop sleeps in its
``epoll_wait``, wakes, reschedules the task and resumes it. That costs noticeably more per
wake-up than a thread blocking in ``epoll_wait`` itself (a UDP ping-pong between two processes
is clearly slower with both waiting through trio than with both blocking in the kernel), and a
round trip through the cluster has four such wake-ups.

When nothing else in the loop can run before the fd is ready, suspending the task buys nothing:
no other task is scheduled, the task itself is not cancelled, and every other task waits either
on a file descriptor in trio's epoll set or on a deadline. :class:`DirectPark` then blocks in
``epoll_wait`` on a set of two: the caller's fd and *trio's own epoll set* (an epoll fd is
readable while it has events ready), with trio's next deadline as the timeout. It returns when
the caller's fd is ready (no trio step at all), or, when trio's set has events or a trio
deadline came, tells the caller to let trio run (one checkpoint), which then finds those events
itself. The system call lets go of the GIL, as trio's own wait does.

"Scheduled" includes the rest of the batch trio is running: trio takes the whole run queue at
once and runs it task by task, so a task due later in the same batch is on no queue. A first
version missed those and blocked them until its own fd was ready (a media benchmark hung now
and then); the wait now looks at every task's pending resume.

This reads what trio does not publish: the run queue, each task's pending resume (the batch),
the tasks waiting for the loop to go idle (``trio.testing.wait_all_tasks_blocked``), the task's
cancel status, the deadline heap and the run's epoll object. They are checked once per run;
where one is missing (another trio version, another I/O backend), or the run has a clock of its
own (tests' ``MockClock``) or is a guest run, :meth:`DirectPark.wait` answers None and the
caller waits through trio as before. ``DirectPark(fd, enabled=False)`` always declines (the
driver's ``DriverConfig.direct_park``).

The checks are a few attribute reads and one pass over the run's tasks (a few dozen in a node):
a wait that finds its fd ready costs a small fraction of what it saves, the system call
included.
"""

from __future__ import annotations

import math
import select

import trio

__all__ = ["DirectPark"]

try:
    from trio._core._run import GLOBAL_RUN_CONTEXT as _RUN_CONTEXT
    from trio._core._run import SystemClock as _SystemClock
    from trio.lowlevel import Task as _Task
except ImportError:  # another trio layout: always wait through trio
    _RUN_CONTEXT = None
    _SystemClock = None
    _Task = None


def _trio_epoll_fd(runner) -> int | None:
    """The epoll fd of ``runner``'s I/O manager, if this run can be waited on directly."""
    try:
        if runner.is_guest or type(runner.clock) is not _SystemClock:
            return None
        # The attributes wait() reads (a missing one raises AttributeError here, once per run).
        runner.runq.__len__  # noqa: B018
        runner.waiting_for_idle.__len__  # noqa: B018
        runner.tasks.__iter__  # noqa: B018
        _RUN_CONTEXT.task._cancel_status.effectively_cancelled  # noqa: B018
        if not all(hasattr(_Task, name) for name in ("_next_send_fn", "_cancel_status")):
            return None
        runner.deadlines.next_deadline  # noqa: B018
        runner.clock.current_time  # noqa: B018
        ep = runner.io_manager._epoll
        return ep.fileno() if isinstance(ep, select.epoll) else None
    except (AttributeError, ValueError):
        return None


class DirectPark:
    """A wait on ``fd`` (readable) that skips trio when it can; see the module docstring.

    One per waiting fd; it keeps an epoll set of ``fd`` and the current run's epoll fd, made on
    first use in each run. Not thread-safe: one thread waits on it at a time."""

    __slots__ = ("_fd", "_enabled", "_runner", "_ep", "_trio_fd")

    def __init__(self, fd: int, enabled: bool = True) -> None:
        self._fd = fd
        self._enabled = enabled
        """False: every wait goes through trio (:meth:`wait` declines), for comparisons and as a
        way out should a trio release change what this relies on."""
        self._runner = None
        self._ep: select.epoll | None = None
        self._trio_fd = -1

    def wait(self) -> bool | None:
        """Block until ``fd`` is readable, trio's epoll set has events, or trio's next deadline.

        None: not possible now (no run, an unsupported run, another task runnable or waiting
        for the loop to go idle, a deadline already due, this task cancelled): the caller waits
        through trio. False: ``fd`` is ready (or the wait ended early), and no trio step is
        needed. True: trio has something to do; the caller takes a checkpoint (``fd`` may be
        ready too)."""
        if not self._enabled:
            return None
        try:
            runner = _RUN_CONTEXT.runner
            task = _RUN_CONTEXT.task
        except AttributeError:
            return None
        if runner is not self._runner and not self._bind(runner):
            return None
        if self._ep is None or runner.runq or runner.waiting_for_idle:
            return None
        if task._cancel_status.effectively_cancelled:
            return None  # the wait through trio raises Cancelled at once
        for other in runner.tasks:
            # Scheduled but not run yet: the rest of the batch trio is running (taken off the
            # run queue as a whole) is not on runner.runq.
            if other._next_send_fn is not None:
                return None
        next_deadline = runner.deadlines.next_deadline()
        if next_deadline == math.inf:
            timeout = -1.0
        else:
            timeout = next_deadline - runner.clock.current_time()
            if timeout <= 0:
                return None
        events = self._ep.poll(timeout, 2)
        if not events:
            return timeout >= 0  # a trio deadline (else: interrupted, the caller loops)
        trio_fd = self._trio_fd
        for fd, _mask in events:
            if fd == trio_fd:
                return True
        return False

    async def wait_readable(self) -> None:
        """Wait until ``fd`` is readable (it may return early): in the kernel when
        :meth:`wait` can, with one checkpoint when trio has work of its own, otherwise through
        ``trio.lowlevel.wait_readable``."""
        direct = self.wait()
        if direct is None:
            await trio.lowlevel.wait_readable(self._fd)
        elif direct:
            await trio.lowlevel.checkpoint()

    def _bind(self, runner) -> bool:
        self.close()
        self._runner = runner
        trio_fd = _trio_epoll_fd(runner) if _RUN_CONTEXT is not None else None
        if trio_fd is None:
            return False
        ep = select.epoll()
        try:
            ep.register(self._fd, select.EPOLLIN)
            ep.register(trio_fd, select.EPOLLIN)
        except OSError:
            ep.close()
            return False
        self._ep, self._trio_fd = ep, trio_fd
        return True

    def close(self) -> None:
        if self._ep is not None:
            self._ep.close()
        self._ep = None
        self._runner = None
        self._trio_fd = -1
