"""Alarms (timerfd) and the timers kept on one: deadlines end waits through the I/O manager, a
ring ends them early from any thread, and one alarm serves every parked loop of a thread."""

import select
import threading
import time

import trio
import trio.testing

from media.alarm import Alarm, Timers

MS = 1_000_000


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


async def test_an_alarm_fires_at_its_deadline_and_not_before():
    alarm = Alarm()
    try:
        start = time.monotonic_ns()
        alarm.set(start + 30 * MS)
        assert not _readable(alarm.fileno())
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(alarm)
        assert time.monotonic_ns() - start >= 30 * MS
        assert alarm.clear()
        assert not _readable(alarm.fileno())
        assert not alarm.clear()  # nothing left to consume
    finally:
        alarm.close()


async def test_a_ring_from_another_thread_ends_a_long_wait_at_once():
    alarm = Alarm()
    try:
        done = trio.Event()

        async def waiter():
            await alarm.wait(time.monotonic_ns() + 60_000 * MS)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            t = threading.Thread(target=alarm.ring)
            t.start()
            t.join()
            with trio.fail_after(5):
                await done.wait()
        assert not _readable(alarm.fileno())  # wait() consumed the firing
    finally:
        alarm.close()


async def test_a_past_deadline_fires_at_once_and_a_new_setting_replaces_a_firing():
    alarm = Alarm()
    try:
        alarm.set(time.monotonic_ns() - 5 * MS)
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(alarm)
        # Re-arming for later resets what had fired: the fd is no longer readable.
        alarm.set(time.monotonic_ns() + 60_000 * MS)
        assert not _readable(alarm.fileno())
        alarm.disarm()
        assert alarm.deadline_ns == 0
        assert not _readable(alarm.fileno())
    finally:
        alarm.close()
    assert alarm.closed
    alarm.set(1)  # closed: a late setting from another thread does nothing


async def _fire_when_due(timers: Timers) -> None:
    """What the media driver's receive set does with the timers' alarm."""
    while True:
        await trio.lowlevel.wait_readable(timers.alarm)
        timers.fire()


async def test_timers_wake_each_parked_loop_at_its_own_deadline():
    timers = Timers()
    try:
        woke: dict[str, int] = {}
        start = time.monotonic_ns()

        async def loop(name: str, after_ms: int) -> None:
            await timers.sleep_until(trio.Event(), start + after_ms * MS)
            woke[name] = time.monotonic_ns() - start

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_fire_when_due, timers)
                async with trio.open_nursery() as loops:
                    loops.start_soon(loop, "late", 60)
                    loops.start_soon(loop, "early", 20)
                nursery.cancel_scope.cancel()
        assert set(woke) == {"early", "late"}
        assert 20 * MS <= woke["early"] < woke["late"]
        assert woke["late"] >= 60 * MS
    finally:
        timers.close()


async def test_a_parked_loop_set_early_returns_and_leaves_no_entry_behind():
    timers = Timers()
    try:
        event = trio.Event()

        async def poke():
            await trio.testing.wait_all_tasks_blocked()
            event.set()

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poke)
                await timers.sleep_until(event, time.monotonic_ns() + 60_000 * MS)
        assert not timers._entries
        # The alarm is still armed for the abandoned deadline: firing finds nothing due.
        assert timers.fire() == 0
    finally:
        timers.close()


async def test_move_and_schedule_change_a_deadline_and_unschedule_drops_it():
    timers = Timers()
    try:
        calls: list[str] = []
        now = time.monotonic_ns()
        timers.schedule("a", now + 60_000 * MS, lambda: calls.append("a"))
        timers.schedule("b", now + 60_000 * MS, lambda: calls.append("b"))
        timers.move("a", now - 1)  # due now
        timers.move("missing", now - 1)  # nothing scheduled under that key: nothing happens
        timers.unschedule("b")
        with trio.fail_after(5):
            await trio.lowlevel.wait_readable(timers.alarm)
        timers.fire()
        assert calls == ["a"]
        assert not timers._entries
    finally:
        timers.close()
