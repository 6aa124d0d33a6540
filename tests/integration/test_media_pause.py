"""A process that stops running for longer than the image liveness timeout loses nothing.

The media driver runs in its process's trio loop, so a paused process (SIGSTOP, a long blocking
call, an overloaded machine) pauses its driver: no heartbeats, no status messages, nothing read
from its sockets. Here two real drivers talk over UDP on 127.0.0.1, each in its own trio loop
(the subscriber's in a thread), and one loop is frozen with ``time.sleep`` for 1.5 liveness
timeouts: that freeze is the fault under test. Every other wait is for a condition with a deadline.

* The publisher stalls: the subscriber's driver drops the image meanwhile. What was offered
  before the stall, right before it (written but not yet sent) and after it arrives exactly once,
  in order (cluster_node.media.sender_core, *stall*).
* The publisher stalls but the subscriber keeps images longer: the SETUP the stalled sender sends
  is harmless, the image stays, nothing is doubled.
* The subscriber stalls while the publisher keeps offering: the image is not dropped before what
  waited in the socket is read, and everything arrives exactly once (cluster_node.media.receiver_core, *a stall of
  our own*).

Which of the driver's tasks runs first after a freeze is up to the scheduler, so each case is
repeated a few rounds.
"""

from __future__ import annotations

import threading
import time

import trio

from cluster_node.config import free_fixed_udp_ports
from cluster_node.media.driver import open_media_driver
from cluster_node.media.publication import OfferResult

_S = 1_000_000_000
LIVENESS_S = 1.0
DRIVER = dict(
    image_liveness_timeout_ns=int(LIVENESS_S * _S),
    publication_connection_timeout_ns=int(LIVENESS_S * _S),
    heartbeat_interval_ns=100_000_000,
    status_message_timeout_ns=200_000_000,
)
STALL_S = 1.5 * LIVENESS_S
STREAM = 7


class Subscriber:
    """A driver and subscription in a thread of their own, with their own trio loop.

    ``got`` holds every message polled, in order; ``stall(seconds)`` freezes the whole loop (driver
    included) once, from inside it.
    """

    def __init__(self, directory, port: int, **driver) -> None:
        self.directory = directory
        self.port = port
        self.driver_cfg = {**DRIVER, **driver}
        self.got: list[bytes] = []
        self.available = 0
        self.unavailable = 0
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self.stall_s = 0.0
        self.stall_requested = threading.Event()
        self.stall_done = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Subscriber:
        self.thread.start()
        if not self.ready.wait(10):
            raise AssertionError(f"subscriber did not start: {self.error!r}")
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "subscriber thread did not stop"

    def stall(self, seconds: float) -> None:
        self.stall_s = seconds
        self.stall_done.clear()
        self.stall_requested.set()

    def _on_available(self, image) -> None:
        self.available += 1

    def _on_unavailable(self, image) -> None:
        self.unavailable += 1

    def _run(self) -> None:
        async def main() -> None:
            async with open_media_driver(dir=self.directory, **self.driver_cfg) as driver:
                sub = driver.add_subscription(
                    f"aeron:udp?endpoint=127.0.0.1:{self.port}",
                    STREAM,
                    on_available=self._on_available,
                    on_unavailable=self._on_unavailable,
                )
                self.ready.set()
                handler = lambda b, o, n, h: self.got.append(bytes(b[o : o + n]))  # noqa: E731
                while not self.stopping.is_set():
                    sub.poll(handler, 64)
                    if self.stall_requested.is_set():
                        self.stall_requested.clear()
                        time.sleep(self.stall_s)  # the fault under test: this loop and its driver freeze
                        self.stall_done.set()
                    await sub.wait(0.02)

        try:
            trio.run(main)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e
            self.ready.set()


async def _offer(pub, payload: bytes, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while True:
            result = pub.offer(payload)
            if result > 0:
                return
            assert result in (OfferResult.NOT_CONNECTED, OfferResult.BACK_PRESSURED, OfferResult.ADMIN_ACTION), result
            await trio.sleep(0.005)


async def _wait_received(sub: Subscriber, count: int, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while len(sub.got) < count:
            assert sub.error is None, sub.error
            await trio.sleep(0.005)


def _assert_exactly_once_in_order(got: list[bytes], offered: list[bytes]) -> None:
    assert len(got) == len(set(got)), f"duplicates: {sorted(m for m in got if got.count(m) > 1)[:10]}"
    missing = [m for m in offered if m not in set(got)]
    assert not missing, f"lost {len(missing)} of {len(offered)}: {missing[:10]}"
    assert got == offered


async def test_publisher_stalled_longer_than_image_liveness_loses_nothing(tmp_path):
    port = free_fixed_udp_ports(1, "127.0.0.1")[0]
    rounds = 3
    with Subscriber(tmp_path / "sub", port) as sub:
        offered: list[bytes] = []
        async with open_media_driver(dir=tmp_path / "pub", **DRIVER) as driver:
            pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            for r in range(rounds):
                for i in range(5):
                    offered.append(f"r{r} before {i}".encode())
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                assert sub.got == offered
                unavailable = sub.unavailable
                # Written to the log buffer, not yet sent: the sender runs at the next checkpoint,
                # which comes after the stall.
                for i in range(3):
                    offered.append(f"r{r} just before {i}".encode())
                    assert pub.offer(offered[-1]) > 0
                time.sleep(STALL_S)  # the fault under test: this loop and its driver freeze
                # The subscriber's driver has dropped the image by now (this is what the test is
                # about); the offers below are accepted at once, the sender still looks connected.
                for i in range(5):
                    offered.append(f"r{r} after {i}".encode())
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                with trio.fail_after(5):
                    while sub.unavailable == unavailable:  # observed, not waited for a reason
                        await trio.sleep(0.01)
                _assert_exactly_once_in_order(sub.got, offered)
            # Nothing more arrives later (no late duplicates from a rewound sender).
            offered.append(b"last")
            await _offer(pub, b"last")
            await _wait_received(sub, len(offered))
            _assert_exactly_once_in_order(sub.got, offered)
            assert sub.unavailable == rounds and sub.available == rounds + 1
            stalls = [np.core.stats.stalls for np in driver._net_pubs]
            assert stalls == [rounds], stalls


async def test_publisher_stall_when_the_subscriber_keeps_its_image_is_harmless(tmp_path):
    port = free_fixed_udp_ports(1, "127.0.0.1")[0]
    # The subscriber keeps images for a minute: the stalled sender's SETUP finds the image there.
    with Subscriber(tmp_path / "sub", port, image_liveness_timeout_ns=60 * _S) as sub:
        offered: list[bytes] = []
        async with open_media_driver(dir=tmp_path / "pub", **DRIVER) as driver:
            pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            for r in range(2):
                for i in range(5):
                    offered.append(f"r{r} before {i}".encode())
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                offered.append(f"r{r} just before".encode())
                assert pub.offer(offered[-1]) > 0
                time.sleep(STALL_S)  # the fault under test
                for i in range(5):
                    offered.append(f"r{r} after {i}".encode())
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                _assert_exactly_once_in_order(sub.got, offered)
            assert sub.unavailable == 0 and sub.available == 1
            assert [np.core.stats.stalls for np in driver._net_pubs] == [2]


async def test_subscriber_stalled_longer_than_image_liveness_loses_nothing(tmp_path):
    port = free_fixed_udp_ports(1, "127.0.0.1")[0]
    rounds = 2
    with Subscriber(tmp_path / "sub", port) as sub:
        offered: list[bytes] = []
        async with open_media_driver(dir=tmp_path / "pub", **DRIVER) as driver:
            pub = driver.add_publication(f"aeron:udp?endpoint=127.0.0.1:{port}", STREAM)
            n = 0
            for _r in range(rounds):
                for _ in range(5):
                    offered.append(b"m%d" % n)
                    n += 1
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                sub.stall(STALL_S)
                # The publisher keeps offering through the subscriber's freeze. Its status messages
                # stop, so after the connection timeout the offers are refused (NOT_CONNECTED) and
                # retried; what was accepted waits in the subscriber's socket or the sender.
                with trio.fail_after(STALL_S + 10):
                    while not sub.stall_done.is_set():
                        result = pub.offer(b"m%d" % n)
                        if result > 0:
                            offered.append(b"m%d" % n)
                            n += 1
                        await trio.sleep(0.01)
                for _ in range(5):
                    offered.append(b"m%d" % n)
                    n += 1
                    await _offer(pub, offered[-1])
                await _wait_received(sub, len(offered))
                _assert_exactly_once_in_order(sub.got, offered)
            assert sub.unavailable == 0, "the image was dropped before its socket was read"
            assert sub.available == 1
            assert len(offered) > rounds * 10 + 20, "the publisher was not offering during the stall"
