"""DirectPark: a wait in the kernel that skips trio only when nothing else in the loop could run
first, and hands over to trio (True) when trio's own file descriptors or deadlines need it."""

import socket
import threading

import pytest
import trio
import trio.testing

from cluster_node.media.directpark import DirectPark


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    yield a, b
    a.close()
    b.close()


class _IoWaits(trio.abc.Instrument):
    """Counts the run loop's I/O waits: a direct wait takes none."""

    def __init__(self) -> None:
        self.count = 0

    def before_io_wait(self, timeout: float) -> None:
        self.count += 1


async def test_a_ready_fd_ends_the_wait_without_a_trio_step(pair):
    a, b = pair
    park = DirectPark(a.fileno())
    waits = _IoWaits()
    trio.lowlevel.add_instrument(waits)
    try:
        await trio.testing.wait_all_tasks_blocked()  # (the run's own tasks done with their steps)
        writer = threading.Thread(target=b.send, args=(b"x",))
        writer.start()
        before = waits.count
        with trio.fail_after(5):
            assert park.wait() is False
        assert waits.count == before
        writer.join()
        assert a.recv(8) == b"x"
    finally:
        trio.lowlevel.remove_instrument(waits)
        park.close()


async def test_a_task_scheduled_in_the_same_batch_makes_it_wait_through_trio(pair):
    """Trio takes the whole run queue as one batch, so a task that will run later in this batch
    is on no queue: the wait must still see it (it would otherwise block that task until its
    own fd is ready). The fd is made readable first, so a wrong answer is False, not a hang."""
    a, b = pair
    b.send(b"x")
    park = DirectPark(a.fileno())
    seen = set()
    try:
        for _ in range(40):
            await trio.testing.wait_all_tasks_blocked()  # only the two tasks below are due
            other_ran = False
            result = "unset"

            async def waiter():
                nonlocal result
                pending = not other_ran
                result = park.wait()
                seen.add(pending)
                assert (result is None) == pending

            async def other():
                nonlocal other_ran
                other_ran = True

            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                nursery.start_soon(other)
            assert result != "unset"
    finally:
        park.close()
    assert seen == {True, False}  # both orders came up (trio shuffles each batch)


async def test_trio_fd_events_end_the_wait_with_true(pair):
    a, b = pair
    mine_a, mine_b = socket.socketpair()
    park = DirectPark(mine_a.fileno())
    woke = trio.Event()
    try:

        async def other():
            await trio.lowlevel.wait_readable(a)
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other)
            await trio.testing.wait_all_tasks_blocked()  # `other` waits in trio's epoll set
            threading.Thread(target=b.send, args=(b"x",)).start()
            start = trio.current_time()
            with trio.move_on_after(10):  # (a wrong wait returns True at this deadline)
                assert park.wait() is True
            assert trio.current_time() - start < 5
            with trio.fail_after(5):
                await woke.wait()
    finally:
        park.close()
        mine_a.close()
        mine_b.close()


async def test_a_trio_deadline_ends_the_wait_with_true(pair):
    a, _b = pair
    park = DirectPark(a.fileno())
    try:
        await trio.testing.wait_all_tasks_blocked()
        with trio.move_on_after(0.02):
            start = trio.current_time()
            result = park.wait()
            assert result is True
            assert trio.current_time() - start >= 0.015
            await trio.sleep_forever()  # the checkpoint lets the deadline act
    finally:
        park.close()


async def test_a_cancelled_task_leaves_the_wait_to_trio(pair):
    """Whether cancelled by a deadline already past or by a call: the wait through trio raises
    Cancelled at once, a direct one would block until the fd is ready."""
    a, _b = pair
    park = DirectPark(a.fileno())
    try:
        with trio.CancelScope(deadline=trio.current_time() - 1):
            assert park.wait() is None
            await trio.lowlevel.checkpoint()
        with trio.CancelScope() as scope:
            scope.cancel()
            assert park.wait() is None
            await trio.lowlevel.checkpoint()
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.001
            with trio.CancelScope(shield=True):
                start = trio.current_time()
                assert park.wait() is True  # the outer deadline does not reach in: a trio deadline
                assert trio.current_time() - start < 5
    finally:
        park.close()


async def test_a_task_waiting_for_idle_leaves_the_wait_to_trio(pair):
    a, _b = pair
    park = DirectPark(a.fileno())
    result = "unset"
    try:

        async def waiter():
            nonlocal result
            await trio.lowlevel.checkpoint()
            result = park.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
        assert result is None
    finally:
        park.close()


def test_a_run_with_its_own_clock_is_not_waited_on_directly(pair):
    a, b = pair
    b.send(b"x")
    park = DirectPark(a.fileno())

    async def main():
        # Trio's own tasks may still be due in the first batch (a wait then declines too).
        await trio.testing.wait_all_tasks_blocked()
        return park.wait()

    try:
        assert trio.run(main, clock=trio.testing.MockClock()) is None
        assert trio.run(main) is False  # the same object binds to the next run
    finally:
        park.close()


def test_outside_a_run_and_when_turned_off_it_declines(pair):
    a, b = pair
    b.send(b"x")
    park = DirectPark(a.fileno())
    off = DirectPark(a.fileno(), enabled=False)
    try:
        assert park.wait() is None

        async def main():
            return off.wait()

        assert trio.run(main) is None
    finally:
        park.close()
        off.close()


@pytest.mark.parametrize("enabled", [True, False])
async def test_wait_readable_returns_when_the_fd_is_ready_either_way(pair, enabled):
    """The callers' wait (driver park, doorbell): direct when it can, through trio when not."""
    a, b = pair
    park = DirectPark(a.fileno(), enabled=enabled)
    try:
        await trio.testing.wait_all_tasks_blocked()
        threading.Thread(target=b.send, args=(b"x",)).start()
        with trio.fail_after(5):
            await park.wait_readable()
        assert a.recv(8) == b"x"
    finally:
        park.close()
