"""The media driver in one trio loop, over real UDP sockets on 127.0.0.1.

Bad datagrams, multi-destination subscriptions, callbacks and operator errors.
"""

from __future__ import annotations

import socket
import time

import pytest
import trio

from cluster_node.media.channel import ChannelError
from cluster_node.media.driver import open_media_driver
from cluster_node.media.frames import TYPE_DATA, Setup, encode_data_header, encode_setup
from cluster_node.media.publication import OfferResult
from tests.support.procs import free_udp_port

FAST = dict(
    network_term_length=64 * 1024,
    status_message_timeout_ns=20_000_000,
    heartbeat_interval_ns=20_000_000,
    setup_interval_ns=20_000_000,
    image_liveness_timeout_ns=1_000_000_000,
    publication_connection_timeout_ns=1_000_000_000,
)

_MINUTE = 60_000_000_000
SLOW = dict(
    FAST,
    heartbeat_interval_ns=_MINUTE,
    status_message_timeout_ns=_MINUTE,
    publication_connection_timeout_ns=_MINUTE,
    image_liveness_timeout_ns=_MINUTE,
)
"""Heartbeats and status messages once a minute: only an offer's own wake-up or send moves data."""


async def _until(cond, timeout=10.0):
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.005)


async def _receive(sub, count, out, timeout=10.0):
    def handler(buf, offset, length, header):
        out.append(bytes(buf[offset : offset + length]))

    with trio.fail_after(timeout):
        while len(out) < count:
            if sub.poll(handler, 100) == 0:
                await sub.wait(0.05)


async def _offer_all(pub, messages, timeout=10.0):
    with trio.fail_after(timeout):
        for m in messages:
            while pub.offer(m) < 0:
                await trio.sleep(0.001)


async def test_bad_datagrams_are_counted_and_dropped_and_the_stream_goes_on(tmp_path):
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9)
        await _until(lambda: pub.is_connected)
        got: list[bytes] = []
        await _offer_all(pub, [b"before"])
        await _receive(sub, 1, got)

        bad = [
            b"",  # empty
            b"\x01\x02\x03",  # shorter than a prefix
            b"\x20\x00\x00\x00\x07\xc0\x01\x00" + bytes(24),  # wrong version
            b"\x20\x00\x00\x00\x00\xc0\x63\x00" + bytes(24),  # unknown type
            # A data frame for our session whose length lies (claims 4 KiB in a 64-byte datagram).
            encode_data_header(4096, 0xC0, 0, pub.session_id, 9, pub.term_id) + bytes(32),
            # A frame whose length is shorter than a header.
            encode_data_header(8, 0xC0, 0, pub.session_id, 9, pub.term_id),
            # SETUP with an impossible term length.
            encode_setup(Setup(0, 1234, 9, 0, 0, 1000, 1408, 0)),
            bytes(range(256)) * 4,
        ]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for datagram in bad:
                s.sendto(datagram, ("127.0.0.1", port))
        invalid = driver.system.invalid_packets
        await _until(lambda: invalid.get() >= 6)
        await _offer_all(pub, [b"after"])
        await _receive(sub, 2, got)
        assert got == [b"before", b"after"]


async def test_multi_destination_subscription_adds_and_removes_destinations(tmp_path):
    p1, p2 = free_udp_port(), free_udp_port()
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        sub = driver.add_subscription("aeron:udp?control-mode=manual", 3)
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{p1}")
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{p2}")
        pub1 = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{p1}", 3)
        pub2 = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{p2}", 3)
        await _until(lambda: pub1.is_connected and pub2.is_connected and sub.image_count == 2)
        got: list[bytes] = []
        await _offer_all(pub1, [b"one"])
        await _offer_all(pub2, [b"two"])
        await _receive(sub, 2, got)
        assert sorted(got) == [b"one", b"two"]
        sub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{p2}")
        # Data to the removed endpoint no longer arrives; the other still does.
        await _offer_all(pub2, [b"lost"])
        await _offer_all(pub1, [b"three"])
        await _receive(sub, 3, got)
        assert got[2] == b"three"
        with trio.move_on_after(0.3):
            await _receive(sub, 4, got)
        assert b"lost" not in got


async def test_mdc_publication_adds_a_destination_at_run_time(tmp_path):
    control, a, b = free_udp_port(), free_udp_port(), free_udp_port()
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        sub_a = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{a}", 4)
        sub_b = driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{b}", 4)
        pub = driver.add_publication(f"aeron:udp?control=127.0.0.1:{control}|control-mode=manual", 4)
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{a}")
        await _until(lambda: pub.is_connected)
        got_a: list[bytes] = []
        got_b: list[bytes] = []
        await _offer_all(pub, [b"m0"])
        await _receive(sub_a, 1, got_a)
        pub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{b}")
        await _until(lambda: sub_b.image_count == 1)
        await _offer_all(pub, [b"m1"])
        await _receive(sub_a, 2, got_a)
        await _receive(sub_b, 1, got_b)
        assert got_a == [b"m0", b"m1"]
        assert got_b == [b"m1"]  # joined at the live position


async def test_image_callbacks_and_end_of_stream(tmp_path):
    port = free_udp_port()
    events = []
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        sub = driver.add_subscription(
            f"aeron:udp?endpoint=127.0.0.1:{port}",
            5,
            on_available=lambda img: events.append(("up", img.session_id)),
            on_unavailable=lambda img: events.append(("down", img.session_id)),
        )
        pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}|session-id=77", 5)
        await _until(lambda: events == [("up", 77)])
        await _offer_all(pub, [b"last words"])
        got: list[bytes] = []
        await _receive(sub, 1, got)
        pub.close()
        assert pub.offer(b"x") < 0
        await _until(lambda: ("down", 77) in events, timeout=5)


@pytest.mark.parametrize("remove_live", [False, True])
async def test_a_multi_destination_image_ends_only_when_every_source_has_ended(tmp_path, remove_live):
    """A follower's log image merges the live log and a catchup replay (two sources, one
    session, the same positions). The replay ending must not end the image: the live log goes
    on. It ends when the last source ends, or when the sources left have all ended after a
    destination is removed."""
    live_port, replay_port = free_udp_port(), free_udp_port()
    events = []
    start = "session-id=55|init-term-id=0|term-id=0|term-offset=0"
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        sub = driver.add_subscription(
            "aeron:udp?control-mode=manual|session-id=55", 6, on_unavailable=lambda img: events.append("down")
        )
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{live_port}")
        sub.add_destination(f"aeron:udp?endpoint=127.0.0.1:{replay_port}")
        live = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{live_port}|{start}", 6)
        replay = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{replay_port}|{start}", 6)
        await _until(lambda: live.is_connected and replay.is_connected and sub.image_count == 1)
        got: list[bytes] = []
        both = [b"m0", b"m1", b"m2"]
        await _offer_all(replay, both)
        await _offer_all(live, both)
        await _receive(sub, 3, got)
        await _until(lambda: live.is_connected)
        replay.close()  # its end of stream is at the image's end: only one source ended
        with trio.move_on_after(0.5):
            await _until(lambda: bool(events), timeout=0.5)
        assert events == [] and sub.image_count == 1, "the replay's end ended the merged image"
        await _offer_all(live, [b"m3"])
        await _receive(sub, 4, got)
        assert got == [b"m0", b"m1", b"m2", b"m3"]
        if remove_live:
            # The sources left (the replay) have all ended: removing the live one ends it.
            sub.remove_destination(f"aeron:udp?endpoint=127.0.0.1:{live_port}")
        else:
            live.close()  # the last source: now the image ends
        await _until(lambda: events == ["down"], timeout=5)


async def test_operator_errors_are_clear(tmp_path):
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        with pytest.raises(ChannelError, match="must start with 'aeron:'"):
            driver.add_publication("udp://127.0.0.1:1", 1)
        with pytest.raises(ChannelError, match="needs endpoint"):
            driver.add_subscription("aeron:udp?alias=x", 1)
        port = free_udp_port()
        driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{port}", 1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            taken = s.getsockname()[1]
            with pytest.raises(ChannelError, match="already in use"):
                driver.add_subscription(f"aeron:udp?endpoint=127.0.0.1:{taken}", 1)
        pub = driver.add_publication("aeron:ipc?term-length=64k", 2)
        from cluster_node.media.publication import MessageTooLongError

        with pytest.raises(MessageTooLongError, match="maximum message length 8192"):
            pub.offer(bytes(8193))
        assert TYPE_DATA == 1


async def test_udp_publication_offered_from_another_thread_wakes_the_sender(tmp_path):
    # Heartbeats and status messages every minute: if an offer from the other thread failed to wake the sender, the
    # data would sit in the buffer until the next heartbeat, far past the deadline below.
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9, exclusive=False)
        await _until(lambda: pub.is_connected)
        messages = [i.to_bytes(4, "little") * 8 for i in range(2000)]
        got: list[bytes] = []

        def offer_from_worker() -> None:
            give_up = time.monotonic() + 20
            for m in messages:
                while pub.offer(m) < 0:  # back-pressured: the driver thread is draining it
                    if time.monotonic() > give_up:
                        return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, offer_from_worker)
            await _receive(sub, len(messages), got, timeout=20.0)
        assert got == messages
        # One message alone, after the burst: only the cross-thread wake-up can send it.
        await trio.to_thread.run_sync(lambda: pub.offer(b"last"))
        await _receive(sub, len(messages) + 1, got, timeout=5.0)
        assert got[-1] == b"last"
        # Closing from the other thread ends the stream on the driver's loop.
        await trio.to_thread.run_sync(pub.close)
        await _until(lambda: sub.image_count == 0, 10.0)


def _record_sending_threads(driver) -> list[int]:
    """From now on, the id of the thread that makes each of the driver's datagram sends."""
    import threading

    senders: list[int] = []
    raw_send = driver._raw_send

    def recording_send(sock, data, addr, tag=None):
        senders.append(threading.get_ident())
        raw_send(sock, data, addr, tag)

    driver._raw_send = recording_send
    return senders


async def test_a_lone_offer_from_another_thread_is_sent_by_that_thread(tmp_path):
    # The service thread's egress: a reply offered while the driver's sender is parked goes out
    # from the offering thread (under the publication's lock), not after a wake-up of the
    # driver's thread; the datagrams it sent are still counted by the driver.
    import threading

    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9, exclusive=False)
        await _until(lambda: pub.is_connected)
        got: list[bytes] = []
        senders = _record_sending_threads(driver)
        for i in range(3):
            await _until(lambda: driver._sender_parked[0] == 1, 5.0)
            before = driver.system.datagrams_sent.get()
            senders.clear()
            worker: list[int] = []

            def offer_one() -> int:
                worker.append(threading.get_ident())
                return pub.offer(b"reply %d" % i)

            assert await trio.to_thread.run_sync(offer_one) > 0
            await _receive(sub, i + 1, got, timeout=5.0)
            assert got[-1] == b"reply %d" % i
            assert senders and set(senders) == {worker[0]}, (senders, worker, threading.get_ident())
            await _until(lambda: driver.system.datagrams_sent.get() > before, 5.0)  # counted


async def test_offers_another_thread_holds_go_out_together_when_it_releases_them(tmp_path):
    # The service thread around a batch of log entries: the replies it offers meanwhile are not
    # sent one datagram each as they come, but together at the release, by that thread.
    import threading

    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9, exclusive=False)
        await _until(lambda: pub.is_connected)
        await _until(lambda: driver._sender_parked[0] == 1, 5.0)
        senders = _record_sending_threads(driver)
        sent_while_held: list[int] = []

        def batch() -> int:
            driver.hold_sends()
            for i in range(20):
                assert pub.offer(b"reply %d" % i) > 0
            sent_while_held.append(len(senders))
            driver.release_sends()
            return threading.get_ident()

        worker = await trio.to_thread.run_sync(batch)
        got: list[bytes] = []
        await _receive(sub, 20, got, timeout=5.0)
        assert got == [b"reply %d" % i for i in range(20)]
        assert sent_while_held == [0]  # nothing left while held
        assert senders and set(senders) == {worker}
        assert len(senders) < 20  # packed into fewer datagrams than replies
        assert not driver._foreign_holds  # released


async def test_multi_destination_subscription_with_a_session_id_sees_only_that_session(tmp_path):
    port = free_udp_port()
    dest = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        wanted = driver.add_publication(f"{dest}|session-id=77", 9)
        other = driver.add_publication(f"{dest}|session-id=78", 9)
        sub = driver.add_subscription("aeron:udp?control-mode=manual|session-id=77", 9)
        sub.add_destination(dest)
        await _until(lambda: wanted.is_connected)
        await _offer_all(wanted, [b"mine"])
        got: list[bytes] = []
        await _receive(sub, 1, got)
        assert got == [b"mine"] and [i.session_id for i in sub.images] == [77]
        assert not other.is_connected  # nobody answered the other session's SETUP


async def test_sends_held_by_a_task_go_out_when_it_releases_them_and_other_tasks_are_not_held(tmp_path):
    # Heartbeats every minute: nothing but an offer's own send can move the data.
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9)
        other = driver.add_publication(channel, 10)
        other_sub = driver.add_subscription(channel, 10)
        await _until(lambda: pub.is_connected and other.is_connected)
        got: list[bytes] = []
        await _offer_all(pub, [b"warm"])
        await _receive(sub, 1, got)
        sent = driver.system.datagrams_sent

        # Held: the sender task stays parked and nothing goes out until the release.
        driver.hold_sends()
        before = sent.get()
        assert pub.offer(b"held") > 0
        await _until(lambda: driver._sender_parked[0] == 1, 5.0)
        await trio.sleep(0.05)
        assert sent.get() == before
        assert sub.poll(lambda *a: None, 10) == 0
        assert driver.release_sends() >= 1
        await _receive(sub, 2, got, timeout=5.0)
        assert got == [b"warm", b"held"]
        assert driver.release_sends() == 0  # nothing held any more

        # Another task's offer is not held, and the sender it wakes sends what we held too.
        driver.hold_sends()
        assert pub.offer(b"held again") > 0
        other_got: list[bytes] = []

        async def offer_other() -> None:
            await _offer_all(other, [b"other"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(offer_other)
        await _receive(other_sub, 1, other_got, timeout=5.0)
        await _receive(sub, 3, got, timeout=5.0)
        assert other_got == [b"other"] and got[-1] == b"held again"
        driver.release_sends()

        # Released: the next offer wakes the sender as usual.
        await _offer_all(pub, [b"after"])
        await _receive(sub, 4, got, timeout=5.0)
        assert got[-1] == b"after"


async def test_offers_are_refused_not_connected_once_the_receivers_are_gone(tmp_path):
    # A small message fits the window granted while the subscriber was there many times over:
    # the publication must not keep accepting into it once its connection timed out.
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    quick = dict(FAST, publication_connection_timeout_ns=200_000_000, image_liveness_timeout_ns=200_000_000)
    async with open_media_driver(dir=tmp_path, **quick) as driver:
        sub = driver.add_subscription(channel, 9)
        pub = driver.add_publication(channel, 9)
        await _until(lambda: pub.is_connected)
        got: list[bytes] = []
        await _offer_all(pub, [b"first"])
        await _receive(sub, 1, got)
        sub.close()
        await _until(lambda: not pub.is_connected, 5.0)
        assert pub.offer(b"x") == OfferResult.NOT_CONNECTED


async def _connected_pair(driver, stream_id: int = 9):
    """A publication and a subscription of one loopback channel of ``driver``, connected."""
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    sub = driver.add_subscription(channel, stream_id)
    pub = driver.add_publication(channel, stream_id)
    await _until(lambda: pub.is_connected and sub.is_connected)
    return pub, sub


async def _park_until(driver, deadline_ns: int, stop=lambda: False) -> int:
    """Park as a claimant does (park, then receive_work) until the deadline or ``stop()``;
    return how many parks it took."""
    parks = 0
    while time.monotonic_ns() < deadline_ns and not stop():
        await driver.park(deadline_ns)
        parks += 1
        driver.receive_work()
    return parks


@pytest.mark.parametrize("timerfd", [True, False], ids=["timerfd", "cancel-scope-fallback"])
async def test_a_claimants_park_ends_at_its_deadline_when_a_datagram_arrives_and_when_rung(
    tmp_path, monkeypatch, timerfd
):
    if not timerfd:
        monkeypatch.setattr(
            "cluster_node.media.driver.media_driver.open_timerfd", lambda: None
        )  # as where Linux has none
    ms = 1_000_000
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        pub, sub = await _connected_pair(driver)
        assert (driver._park_timer is not None) == timerfd
        driver.claim_receive()
        assert driver.receive_claimant is trio.lowlevel.current_task()

        # The deadline: not before it, and not much after (one park, or a few if something
        # else was readable meanwhile).
        start = time.monotonic_ns()
        parks = await _park_until(driver, start + 50 * ms)
        elapsed = time.monotonic_ns() - start
        assert 50 * ms <= elapsed < 1000 * ms and parks <= 3
        # A later deadline than the one the timer holds, then an earlier one.
        start = time.monotonic_ns()
        await _park_until(driver, start + 80 * ms)
        assert time.monotonic_ns() - start >= 80 * ms

        # A datagram ends a long park at once.
        got: list[bytes] = []

        def handler(buf, offset, length, header):
            got.append(bytes(buf[offset : offset + length]))

        async def offer_soon():
            await trio.sleep(0.02)
            assert pub.offer(b"ping") > 0

        async with trio.open_nursery() as nursery:
            nursery.start_soon(offer_soon)
            start = time.monotonic_ns()
            await _park_until(driver, start + 10_000 * ms, lambda: sub.poll(handler, 10) > 0)
        assert got == [b"ping"] and time.monotonic_ns() - start < 5_000 * ms

        # The wake-up of another task ends it, and is used up: the next park waits its time.
        woken = False

        async def ring_soon():
            nonlocal woken
            await trio.sleep(0.02)
            woken = True
            driver.wake_parked()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ring_soon)
            start = time.monotonic_ns()
            await _park_until(driver, start + 10_000 * ms, lambda: woken)
        assert woken and time.monotonic_ns() - start < 5_000 * ms
        # An earlier deadline than the 10 s the timer still holds.
        start = time.monotonic_ns()
        parks = await _park_until(driver, start + 30 * ms)
        assert 30 * ms <= time.monotonic_ns() - start < 5_000 * ms and parks <= 3
        driver.wake_parked()  # nobody parked: nothing rung, nothing left to wake the next park
        start = time.monotonic_ns()
        await _park_until(driver, start + 30 * ms)
        assert time.monotonic_ns() - start >= 30 * ms
        driver.unclaim_receive()


async def test_a_claim_by_another_task_ends_the_parked_claimants_wait(tmp_path):
    ms = 1_000_000
    async with open_media_driver(dir=tmp_path, **SLOW) as driver:
        left_at = None
        first_task = None

        async def first():
            nonlocal left_at, first_task
            first_task = trio.lowlevel.current_task()
            driver.claim_receive()
            deadline = time.monotonic_ns() + 10_000 * ms
            while driver.receive_claimant is first_task and time.monotonic_ns() < deadline:
                await driver.park(deadline)
                driver.receive_work()
            left_at = time.monotonic_ns()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await _until(lambda: driver._parked)
            start = time.monotonic_ns()
            driver.claim_receive()  # rings the first claimant
            # ... and this task's park works at once, the first one's wait on the fd withdrawn.
            parks = await _park_until(driver, time.monotonic_ns() + 30 * ms)
            assert parks >= 1
        assert left_at is not None and left_at - start < 5_000 * ms
        assert driver.receive_claimant is trio.lowlevel.current_task()
        driver.unclaim_receive()


class _StepCounter(trio.abc.Instrument):
    """Task steps by task name (the driver names its loops driver-sender, driver-conductor, ...)."""

    def __init__(self) -> None:
        self.steps: dict[str, int] = {}

    def before_task_step(self, task) -> None:
        name = task.name
        self.steps[name] = self.steps.get(name, 0) + 1


async def test_a_claimant_holding_the_timed_duties_runs_heartbeats_and_status_messages_in_its_own_steps(tmp_path):
    """claim_receive(duties=True): while the claimant parks and reads, the idle publication's
    heartbeats and the image's status messages go on, sent from the claimant's steps; the
    sender and conductor tasks stay parked. Given back, the loops keep time themselves again."""
    ms = 1_000_000
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        pub, sub = await _connected_pair(driver)
        counter = _StepCounter()
        trio.lowlevel.add_instrument(counter)
        try:
            driver.claim_receive(duties=True)
            # (The claim wakes both loops, which re-park on the claimant's steps.)
            await _park_until(driver, time.monotonic_ns() + 100 * ms)
            steps = dict(counter.steps)
            heartbeats = driver.system.heartbeats_sent.get()
            status = driver.system.status_messages_sent.get()
            await _park_until(driver, time.monotonic_ns() + 400 * ms)
            # 20 ms intervals on a 40 ms grid: some ten of each in 400 ms.
            assert driver.system.heartbeats_sent.get() - heartbeats >= 4
            assert driver.system.status_messages_sent.get() - status >= 4
            assert counter.steps.get("driver-sender", 0) == steps.get("driver-sender", 0)
            assert counter.steps.get("driver-conductor", 0) == steps.get("driver-conductor", 0)
            assert pub.is_connected and sub.is_connected

            driver.unclaim_receive()
            steps = dict(counter.steps)
            heartbeats = driver.system.heartbeats_sent.get()
            status = driver.system.status_messages_sent.get()
            await trio.sleep(0.4)  # the receiver task reads; the loops run on their own timers
            assert driver.system.heartbeats_sent.get() - heartbeats >= 4
            assert driver.system.status_messages_sent.get() - status >= 4
            assert counter.steps.get("driver-sender", 0) - steps.get("driver-sender", 0) >= 4
            assert counter.steps.get("driver-conductor", 0) - steps.get("driver-conductor", 0) >= 4
        finally:
            trio.lowlevel.remove_instrument(counter)


async def test_a_claim_without_duties_leaves_the_loops_their_own_timers(tmp_path):
    async with open_media_driver(dir=tmp_path, **FAST) as driver:
        await _connected_pair(driver)
        counter = _StepCounter()
        trio.lowlevel.add_instrument(counter)
        try:
            driver.claim_receive()
            await _park_until(driver, time.monotonic_ns() + 50_000_000)
            steps = dict(counter.steps)
            heartbeats = driver.system.heartbeats_sent.get()
            await _park_until(driver, time.monotonic_ns() + 400_000_000)
            assert driver.system.heartbeats_sent.get() - heartbeats >= 4
            assert counter.steps.get("driver-sender", 0) - steps.get("driver-sender", 0) >= 4
            driver.unclaim_receive()
        finally:
            trio.lowlevel.remove_instrument(counter)


async def test_periodic_deadlines_fall_on_one_phase_grid_tick_at_most_a_slack_early(tmp_path):
    """The phase grid's tick is twice the shortest interval; a deadline goes to the first tick
    no more than the timer slack before it, so a duty done just after a tick and due one or
    two intervals later lands on a tick again (heartbeats and status messages share ticks)."""
    ms = 1_000_000
    async with open_media_driver(
        dir=tmp_path, heartbeat_interval_ns=100 * ms, status_message_timeout_ns=200 * ms
    ) as driver:
        slack = driver.timer_slack_ns
        assert slack == 20 * ms
        tick = 200 * ms
        base = (time.monotonic_ns() // tick + 10) * tick
        done = base + 3 * ms  # a duty done just after a tick
        assert driver.coalesce(done + 100 * ms, done) == base + tick  # heartbeat: the next tick
        assert driver.coalesce(done + 200 * ms, done) == base + tick  # status message: also
        assert driver.coalesce(done + 400 * ms, done) == base + 2 * tick
        # More than the slack past a tick: the next one, never a tick more than the slack early.
        assert driver.coalesce(base + tick + slack + ms, done) == base + 2 * tick
        for deadline in range(done + 60 * ms, done + 900 * ms, 7 * ms):
            at = driver.coalesce(deadline, done)
            assert at % tick == 0 and deadline - slack <= at < deadline - slack + tick
        # Near deadlines keep their own time (to the slack grid, or exact).
        assert driver.coalesce(done + 30 * ms, done) == done + 30 * ms
