"""Doorbells: rings from the waiter's own thread end its wait without the socket; rings from
another thread of the process go through the eventfd (or the socket, without one); rings from
another process through the socket; all are seen by drain()."""

import threading

import pytest
import trio
import trio.testing

from cluster_node.media.doorbell import DATA, NEW_PUBLICATION, Doorbell, ring


@pytest.fixture(autouse=True, params=["timerfd", "cancel-scope-fallback"])
def wait_kind(request, monkeypatch):
    """Every test runs with the timerfd wait and with the cancel-scope wait of systems without it."""
    if request.param != "timerfd":
        monkeypatch.setattr("cluster_node.media.doorbell.open_timer_and_eventfd", lambda: None)
    return request.param


async def test_same_thread_ring_ends_the_wait_and_drain_reports_it():
    bell = Doorbell()
    try:
        woke = trio.Event()

        async def waiter():
            await bell.wait(30)
            woke.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert ring(bell.name, NEW_PUBLICATION)
            with trio.fail_after(5):
                await woke.wait()
        assert bell.drain() == NEW_PUBLICATION
        assert bell.drain() == b""
    finally:
        bell.close()


@pytest.mark.parametrize("source", ["thread", "process"])
async def test_a_ring_from_another_thread_or_process_ends_the_wait(source):
    from cluster_node.media import doorbell

    def ring_from_elsewhere():
        if source == "thread":
            t = threading.Thread(target=ring, args=(bell.name, DATA))
            t.start()
            t.join()
        else:
            doorbell._sender().sendto(DATA, b"\0" + bell.name)  # what another process sends

    bell = Doorbell()
    try:
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def waiter():
                await bell.wait(30)
                done.set()

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            ring_from_elsewhere()
            with trio.fail_after(5):
                await done.wait()
        assert bell.drain() == DATA
        assert bell.drain() == b""
    finally:
        bell.close()


async def test_a_ring_while_nobody_waits_is_kept_for_the_next_wait():
    bell = Doorbell()
    try:
        assert ring(bell.name)  # not waiting: through the socket, so not lost
        with trio.fail_after(5):
            await bell.wait(30)
        assert bell.drain() == DATA
    finally:
        bell.close()
    assert not ring(bell.name)  # closed: gone from the registry and the namespace


async def test_the_wait_times_out_and_an_earlier_deadline_after_a_longer_wait_holds(wait_kind):
    import time

    bell = Doorbell()
    assert (bell._ep is not None) == (wait_kind == "timerfd")
    try:
        start = time.monotonic()
        with trio.fail_after(5):
            while time.monotonic() - start < 0.05:  # (a wait may end early: callers re-check)
                await bell.wait(0.05)
        assert time.monotonic() - start < 2
        # A long wait, ended by a ring, then a short one: the short timeout is kept, not the
        # long one the timer still holds.
        async with trio.open_nursery() as nursery:

            async def waiter():
                await bell.wait(30)

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            assert ring(bell.name)
        start = time.monotonic()
        with trio.fail_after(5):
            await bell.wait(0.03)
        assert time.monotonic() - start < 2
        assert bell.drain() == DATA
        # A ring while nobody waits is not lost and ends the next wait at once.
        assert ring(bell.name)
        with trio.fail_after(5):
            await bell.wait(30)
    finally:
        bell.close()
