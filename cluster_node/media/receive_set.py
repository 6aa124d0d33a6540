"""The one waiter on the driver's receive set: who may wait on the epoll fd, and how it is handed on.

Every socket of the media driver sits in one epoll set (cluster_node.media.driver.invoker). Several tasks
of the driver's thread take turns waiting on it: the receiver task, a duty cycle that claimed
the receive side (``MediaDriver.claim_receive``), a task in a UDP ``Subscription.wait``, a
replay's helper task. trio lets one task at a time wait for a fd to be readable; a second one
gets ``BusyResourceError``, which used to escape the receiver task and end the node.

How a waiter was sent away decided whether that could happen. A waiter woken by an eventfd
written into the set stays registered with trio until trio's next ``epoll_wait`` sees the set
readable; a task that waited on the set before then collided with it, and a task that read the
set meanwhile (draining the eventfd) left it registered until the next datagram, possibly for
ever on a single-member cluster. :class:`ReceiveSetWaiter` makes the handover safe by
construction:

* Every wait on the set through trio happens in :meth:`ReceiveSetWaiter.wait`, inside a cancel
  scope that the waiter records.
* Before a task registers, :meth:`ReceiveSetWaiter.evict` cancels the recorded waiter. trio
  withdraws a waiting task's registration synchronously when its wait is cancelled, and a task
  already woken by the fd (scheduled, not yet run) was withdrawn when it was woken; either way
  the fd has no trio waiter when ``evict`` returns. The evicted task sees ``wait`` return False.
* A wait that can block in the kernel instead (cluster_node.media.directpark: nothing else in the loop can
  run) registers nothing with trio, so it cannot collide, and no other task of the thread runs
  while it blocks.

So at most one task is ever registered on the fd, and :meth:`wait` asserts it. A cancellation
delivered late (to a task that the fd had already woken) is dropped when its scope exits: the
task simply sees its wait end.
"""

from __future__ import annotations

import trio

from cluster_node.media.directpark import DirectPark

__all__ = ["ReceiveSetWaiter"]


class ReceiveSetWaiter:
    """Waits on one fd (the driver's receive epoll set) for the tasks of one trio thread, one at
    a time; see the module docstring."""

    __slots__ = ("_fd", "_direct", "_task", "_scope", "evictions")

    def __init__(self, fd: int, direct: bool = True) -> None:
        self._fd = fd
        self._direct = DirectPark(fd, enabled=direct)  # (direct=False: every wait through trio)
        self._task: trio.lowlevel.Task | None = None  # the task registered with trio on the fd
        self._scope: trio.CancelScope | None = None  # its wait's scope (set iff _task is)
        self.evictions = 0
        """Waits ended by :meth:`evict` (a handover), for tests and diagnostics."""

    @property
    def waiter(self) -> trio.lowlevel.Task | None:
        """The task waiting on the fd through trio, or None."""
        return self._task

    def evict(self) -> None:
        """End the wait of the task registered on the fd, if any: its :meth:`wait` returns False.
        Synchronous: when this returns, no task is registered on the fd."""
        scope = self._scope
        if scope is None:
            return
        self._task = self._scope = None
        self.evictions += 1
        scope.cancel()

    async def wait(self, *, direct: bool = False, timeout_s: float | None = None) -> bool:
        """Wait until the fd is readable (it may return early); False when another task ended
        the wait (:meth:`evict`), True otherwise.

        With ``direct`` the wait blocks in the kernel when nothing else in the loop can run
        (cluster_node.media.directpark), else it goes through trio. Any other waiter is evicted first."""
        if direct:
            ready = self._direct.wait()
            if ready is False:
                return True  # the fd is ready: no trio step at all
            if ready is True:
                await trio.lowlevel.checkpoint()  # trio has work of its own: let it run
                return True
        self.evict()
        me = trio.lowlevel.current_task()
        with trio.CancelScope() as scope:
            if timeout_s is not None:
                scope.deadline = trio.current_time() + timeout_s
            assert self._task is None, "two tasks registered on the receive set"
            self._task, self._scope = me, scope
            evicted = True
            try:
                await trio.lowlevel.wait_readable(self._fd)
            finally:
                # evict() clears the record before it cancels; a deadline that passed does not.
                if self._scope is scope:
                    self._task = self._scope = None
                    evicted = False
        return not evicted

    def close(self) -> None:
        self.evict()
        self._direct.close()
