"""The handover of the driver's receive side between tasks (cluster_node.media.receive_set), over real UDP.

The receiver task, claimants (``claim_receive`` / ``park`` / ``unclaim_receive``) and tasks in
``Subscription.wait`` take turns waiting on one epoll fd; trio allows one waiter per fd, and a
second one used to raise ``BusyResourceError`` in the receiver task, which ended the node (a
single-member cluster did it at every start). These tests drive the interleavings that did it,
and a random mix of them for thousands of rounds while datagrams arrive.
"""

from __future__ import annotations

import random
import time

import pytest
import trio
import trio.testing

from cluster_node.media.driver import open_media_driver
from tests.integration.test_media_driver import _connected_pair

_MINUTE = 60_000_000_000
SLOW = dict(
    network_term_length=64 * 1024,
    setup_interval_ns=20_000_000,
    heartbeat_interval_ns=_MINUTE,
    status_message_timeout_ns=_MINUTE,
    publication_connection_timeout_ns=_MINUTE,
    image_liveness_timeout_ns=_MINUTE,
)
"""No periodic traffic: the only datagrams are the ones a test sends."""


def _trio_reader(fd: int):
    """The task trio has registered to read ``fd`` (trio's own bookkeeping), or None."""
    registered = trio.lowlevel.current_root_task()._runner.io_manager._registered.get(fd)
    return None if registered is None else registered.read_task


THROUGH_TRIO = dict(direct_park=False)
"""Every park waits through trio (as when other tasks are runnable), never in the kernel."""


async def _claim_and_park_until_taken(driver, left: trio.Event) -> None:
    """A claimant's loop (as ``Subscription.wait`` or the consensus agent): park and read until
    another task holds the claim."""
    driver.claim_receive()
    me = trio.lowlevel.current_task()
    while driver.receive_claimant is me:
        await driver.park(time.monotonic_ns() + _MINUTE)
        driver.receive_work()
    left.set()


async def _received_by_the_receiver_task(driver, pub, sub, payload: bytes) -> None:
    """Nobody holds the claim: the receiver task must read what arrives."""
    assert driver.receive_claimant is None
    got: list[bytes] = []
    assert pub.offer(payload) > 0
    with trio.fail_after(5):
        while not got:
            sub.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 10)
            await trio.sleep(0.002)
    assert got == [payload]


async def test_a_claimant_parked_through_trio_is_sent_away_by_a_new_claim_before_the_receiver_waits_again(tmp_path):
    """The single-member cluster's start: a task parked through trio (an archive request in
    ``Subscription.wait``), the agent claims, reads (which consumed the old wake-up signal) and
    hands the claim back; the receiver task then waits on the set while the first task was
    still registered on it."""
    async with open_media_driver(dir=tmp_path, **SLOW, **THROUGH_TRIO) as driver:
        pub, sub = await _connected_pair(driver)
        first_left = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_claim_and_park_until_taken, driver, first_left)
            await trio.testing.wait_all_tasks_blocked()
            assert driver._parked
            driver.claim_receive()
            driver.receive_work()
            driver.unclaim_receive()
            await trio.testing.wait_all_tasks_blocked()  # the receiver task waits on the set
            with trio.fail_after(5):
                await first_left.wait()
        await _received_by_the_receiver_task(driver, pub, sub, b"after the handover")


async def test_a_claim_taken_over_twice_leaves_one_waiter_and_the_last_claimant_reads(tmp_path):
    async with open_media_driver(dir=tmp_path, **SLOW, **THROUGH_TRIO) as driver:
        pub, sub = await _connected_pair(driver)
        left = [trio.Event(), trio.Event()]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_claim_and_park_until_taken, driver, left[0])
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(_claim_and_park_until_taken, driver, left[1])
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(5):
                await left[0].wait()
            assert driver._parked and not left[1].is_set()
            driver.claim_receive()
            with trio.fail_after(5):
                await left[1].wait()
            got: list[bytes] = []
            assert pub.offer(b"to the last claimant") > 0
            deadline = time.monotonic_ns() + 5_000_000_000
            while not got and time.monotonic_ns() < deadline:
                await driver.park(deadline)
                driver.receive_work()
                sub.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 10)
            assert got == [b"to the last claimant"]
            driver.unclaim_receive()
        await _received_by_the_receiver_task(driver, pub, sub, b"and then to the receiver task")


async def test_a_claim_while_the_set_has_already_woken_the_receiver_leaves_the_reading_to_the_claimant(tmp_path):
    """A late cancellation: the datagram wakes the receiver task (scheduled, not yet run) and,
    in the same batch, another task claims. The withdrawal of the receiver's wait comes too
    late to stop it; it must still not read the sockets under the claimant. trio runs a batch
    in one order or its reverse at random, so the rounds cover both."""
    async with open_media_driver(dir=tmp_path, **SLOW, **THROUGH_TRIO) as driver:
        pub, sub = await _connected_pair(driver)
        violations: list[str] = []
        real_receive_work = driver.receive_work

        def receive_work() -> int:
            claimant = driver.receive_claimant
            if claimant is not None and claimant is not trio.lowlevel.current_task():
                violations.append(trio.lowlevel.current_task().name)
            return real_receive_work()

        driver.receive_work = receive_work
        got: list[bytes] = []
        for i in range(40):
            await trio.testing.wait_all_tasks_blocked()  # the receiver task waits on the set
            assert pub.offer(b"%d" % i) > 0  # (on loopback it is in the socket when this returns)
            await trio.lowlevel.checkpoint()  # one batch: the receiver, woken by the set, and this task
            driver.claim_receive()
            deadline = time.monotonic_ns() + 5_000_000_000
            while len(got) <= i and time.monotonic_ns() < deadline:
                sub.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 10)
                if len(got) <= i:
                    await driver.park(deadline)
                    driver.receive_work()
            driver.unclaim_receive()
        assert got == [b"%d" % i for i in range(40)]
        assert violations == []


@pytest.mark.parametrize("direct", [True, False], ids=["direct-park", "through-trio"])
async def test_claims_parks_and_unclaims_from_several_tasks_while_datagrams_arrive(tmp_path, direct):
    """Three tasks claim, park, read, ring each other and give the claim back in a random order
    for thousands of rounds, while a publisher sends and a reader takes every message: the
    driver never fails, one task at most waits on the set at any time, and every message
    arrives once, in order."""
    rng = random.Random(20261127)
    rounds = 3000
    wanted = 3000  # messages, at least
    async with open_media_driver(dir=tmp_path, **SLOW, direct_park=direct) as driver:
        pub, sub = await _connected_pair(driver)
        sent = 0
        received: list[int] = []
        done = trio.Event()
        steps = 0

        async def publisher() -> None:
            nonlocal sent
            while not done.is_set() and sent < 2 * wanted:
                if pub.offer(sent.to_bytes(4, "little")) > 0:
                    sent += 1
                await trio.sleep(0 if rng.random() < 0.7 else 0.0005)

        async def reader() -> None:
            while not done.is_set() or len(received) < sent:
                n = sub.poll(
                    lambda buf, offset, length, header: received.append(
                        int.from_bytes(buf[offset : offset + 4], "little")
                    ),
                    64,
                )
                if n == 0:
                    await sub.wait(0.01)

        async def juggler(name: str) -> None:
            nonlocal steps
            me = trio.lowlevel.current_task()
            while steps < rounds or sent < wanted:
                steps += 1
                action = rng.random()
                if action < 0.3:
                    driver.claim_receive(duties=rng.random() < 0.5)
                elif action < 0.6 and driver.receive_claimant is me:
                    await driver.park(time.monotonic_ns() + rng.choice((0, 100_000, 2_000_000)))
                    driver.receive_work()
                elif action < 0.75:
                    driver.unclaim_receive()
                elif action < 0.85:
                    driver.wake_parked()
                else:
                    await trio.lowlevel.checkpoint()
                # The driver's record of the set's waiter is trio's (or trio already let it go).
                waiter = driver._rx_wait.waiter
                assert waiter is None or waiter is _trio_reader(driver._rx_epoll_fd) or waiter._next_send_fn
            driver.unclaim_receive()

        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publisher)
                nursery.start_soon(reader)
                async with trio.open_nursery() as jugglers:
                    for name in ("a", "b", "c"):
                        jugglers.start_soon(juggler, name)
                done.set()
        assert sent >= wanted
        assert received == list(range(sent))
        assert driver.receive_claimant is None
        assert driver._rx_wait.evictions > 0


async def test_with_direct_park_off_a_lone_claimants_park_waits_through_trio(tmp_path):
    """``DriverConfig.direct_park=False``: even with nothing else to run, the claimant's park
    is a wait registered with trio on the set (the path taken when other tasks are runnable),
    never a block in the kernel (cluster_node.media.directpark declines every time). Another thread looks
    at the set's waiter, then sends."""
    import threading

    async with open_media_driver(dir=tmp_path, **SLOW, **THROUGH_TRIO) as driver:
        pub, sub = await _connected_pair(driver)
        me = trio.lowlevel.current_task()
        seen: list = []
        answers: list = []  # what each direct-park attempt said (None: declined, wait through trio)
        direct = driver._rx_wait._direct

        class Spy:
            def wait(self):
                answers.append(direct.wait())
                return answers[-1]

            def close(self):
                direct.close()

        driver._rx_wait._direct = Spy()

        def look_then_send() -> None:
            deadline = time.monotonic() + 5
            while driver._rx_wait.waiter is None and time.monotonic() < deadline:
                time.sleep(0.001)
            seen.append(driver._rx_wait.waiter)
            while pub.offer(b"from the other thread") < 0 and time.monotonic() < deadline + 5:
                time.sleep(0.001)

        driver.claim_receive()
        await trio.testing.wait_all_tasks_blocked()
        thread = threading.Thread(target=look_then_send)
        thread.start()
        got: list[bytes] = []
        deadline = time.monotonic_ns() + 10_000_000_000
        while not got and time.monotonic_ns() < deadline:
            await driver.park(deadline)
            driver.receive_work()
            sub.poll(lambda buf, offset, length, header: got.append(bytes(buf[offset : offset + length])), 10)
        thread.join(10)
        driver.unclaim_receive()
        assert got == [b"from the other thread"]
        assert answers and all(a is None for a in answers), answers
        assert seen == [me]
