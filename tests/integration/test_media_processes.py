"""The media driver between real processes: UDP with loss, MDC, IPC, fragmentation, liveness.

Each peer is a separate OS process (``tests/support/media_peer.py``) with its own driver; messages
carry their sequence number so the subscriber checks exactly-once, in-order delivery itself.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.procs import Peer, free_udp_port, rss_kb


def _udp(port: int) -> str:
    return f"aeron:udp?endpoint=127.0.0.1:{port}"


def test_udp_100k_messages_with_loss_duplication_and_reordering_both_ways(tmp_path):
    port = free_udp_port()
    lossy = ["--drop", "0.1", "--dup", "0.02", "--reorder", "0.02", "--sm-interval", "0.02"]
    common = ["--count", "100000", "--sizes", "range:8:200", *lossy]
    with (
        Peer(["sub", "--dir", str(tmp_path / "s"), "--channel", _udp(port), "--seed", "7", *common], "sub") as sub,
        Peer(["pub", "--dir", str(tmp_path / "p"), "--channel", _udp(port), "--seed", "8", *common], "pub") as pub,
    ):
        sub.expect("READY", 30)
        pub.expect("READY", 30)
        offered = pub.fields(pub.expect("OFFERED", 180))
        done = sub.fields(sub.expect("DONE", 180))
        assert done["count"] == "100000"
        assert done["position"] == offered["position"]
        assert int(done["naks"]) > 0, "10% loss must have caused NAKs"
        assert pub.finish() == 0
        assert int(pub.fields(pub.expect("DONE", 10))["retransmits"]) > 0


def test_mdc_to_three_subscribers_one_slow_all_receive_and_memory_stays_bounded(tmp_path):
    control = free_udp_port()
    ports = [free_udp_port() for _ in range(3)]
    count = 30000
    term = 256 * 1024
    common = ["--count", str(count), "--term-length", str(term), "--sizes", "fixed:200"]
    subs = []
    try:
        for i, port in enumerate(ports):
            slow = ["--slow-us", "150"] if i == 0 else []
            subs.append(
                Peer(["sub", "--dir", str(tmp_path / f"s{i}"), "--channel", _udp(port), *common, *slow], f"sub{i}")
            )
        for s in subs:
            s.expect("READY", 30)
        dests = [x for p in ports for x in ("--destination", _udp(p))]
        mdc = f"aeron:udp?control=127.0.0.1:{control}|control-mode=manual"
        with Peer(
            ["pub", "--dir", str(tmp_path / "p"), "--channel", mdc, *dests, "--wait-connections", "3", *common], "pub"
        ) as pub:
            pub.expect("READY", 30)
            samples = []
            stop = threading.Event()

            def sample():
                while not stop.is_set():
                    try:
                        samples.append(rss_kb(pub.pid))
                    except OSError:
                        return
                    stop.wait(0.05)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            offered = pub.fields(pub.expect("OFFERED", 180))
            results = [s.fields(s.expect("DONE", 180)) for s in subs]
            stop.set()
            sampler.join()
            for r in results:
                assert r["count"] == str(count)
                assert r["position"] == offered["position"]
            # The slow subscriber held the publisher back instead of memory growing: the data
            # (6 MB) is far more than the publisher's RSS grew while offering.
            assert int(offered["back_pressured"]) > 0
            growth_kb = max(samples) - min(samples)
            assert growth_kb < 3 * term // 1024 + 16 * 1024, f"publisher RSS grew by {growth_kb} KiB"
            assert pub.finish() == 0
    finally:
        for s in subs:
            s.kill()


def test_ipc_between_two_processes_1m_messages(tmp_path):
    d = str(tmp_path / "driver")
    common = ["--dir", d, "--channel", "aeron:ipc", "--count", "1000000", "--term-length", str(4 * 1024 * 1024)]
    with Peer(["sub", *common], "sub") as sub:
        sub.expect("READY", 30)
        with Peer(["pub", *common], "pub") as pub:
            pub.expect("READY", 30)
            offered = pub.fields(pub.expect("OFFERED", 240))
            done = sub.fields(sub.expect("DONE", 240))
            assert done["count"] == "1000000"
            assert done["position"] == offered["position"] == str(1000000 * 64)
            assert pub.finish() == 0


def test_ipc_between_two_threads_1m_messages(tmp_path):
    from cluster_node.media.channel import parse
    from cluster_node.media.ipc import IpcTransport

    transport = IpcTransport(tmp_path)
    sub = transport.add_subscription(parse("aeron:ipc"), 5)
    pub = transport.add_publication(parse("aeron:ipc?term-length=1m"), 5)
    transport.do_work(time.monotonic_ns())
    assert sub.image_count == 1
    count = 1_000_000
    received = []
    errors = []

    def consume():
        expected = 0

        def handler(buf, offset, length, header):
            nonlocal expected
            seq = int.from_bytes(buf[offset : offset + 8], "little")
            if seq != expected or length != 32:
                errors.append((seq, expected, length))
            expected += 1

        deadline = time.monotonic() + 120
        image = sub.images[0]
        while expected < count and not errors and time.monotonic() < deadline:
            if image.poll(handler, 1000) == 0:
                time.sleep(0)
        received.append(expected)

    t = threading.Thread(target=consume)
    t.start()
    i = 0
    deadline = time.monotonic() + 120
    while i < count and time.monotonic() < deadline:
        if pub.offer(i.to_bytes(8, "little") + bytes(24)) > 0:
            i += 1
        else:
            time.sleep(0)
    t.join(timeout=150)
    assert not errors, errors[:3]
    assert received == [count]
    assert pub.position == count * 64
    transport.close()


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_fragmentation_every_length_up_to_the_maximum_round_trips(tmp_path, media):
    term = 1024 * 1024
    max_len = term // 8
    channel = _udp(free_udp_port()) if media == "udp" else "aeron:ipc"
    d = tmp_path / "driver"
    count = 4097 + 3 * (max_len // 1376) + 1
    common = [
        "--channel",
        channel,
        "--count",
        str(count),
        "--term-length",
        str(term),
        "--sizes",
        "frag:1376",
        "--max-len",
        str(max_len),
        "--verify-content",
    ]
    with Peer(["sub", "--dir", str(d if media == "ipc" else tmp_path / "s"), *common], "sub") as sub:
        sub.expect("READY", 30)
        with Peer(["pub", "--dir", str(d if media == "ipc" else tmp_path / "p"), *common], "pub") as pub:
            pub.expect("READY", 30)
            offered = pub.fields(pub.expect("OFFERED", 120))
            done = sub.fields(sub.expect("DONE", 120))
            assert done["count"] == str(count)
            assert done["position"] == offered["position"]
            assert pub.finish() == 0


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_killed_publisher_image_becomes_unavailable_within_liveness_timeout(tmp_path, media):
    liveness = 1.5
    channel = _udp(free_udp_port()) if media == "udp" else "aeron:ipc"
    d = tmp_path / "driver"
    common = ["--channel", channel, "--count", "1000", "--liveness", str(liveness)]
    with Peer(
        ["sub", "--dir", str(d if media == "ipc" else tmp_path / "s"), *common, "--linger-until-unavailable"], "sub"
    ) as sub:
        sub.expect("READY", 30)
        with Peer(["pub", "--dir", str(d if media == "ipc" else tmp_path / "p"), *common], "pub") as pub:
            pub.expect("READY", 30)
            sub.expect("EVENT available", 30)
            sub.expect("DONE", 60)
            pub.expect("OFFERED", 60)
            killed_at = time.monotonic()
            pub.kill()  # SIGKILL: no end-of-stream, no goodbye
        sub.expect("EVENT unavailable", liveness + 10)
        elapsed = time.monotonic() - killed_at
        # Generous slack for a loaded CI machine; the figure itself is printed for the record.
        print(f"image unavailable {elapsed:.2f}s after kill -9 (liveness timeout {liveness}s)")
        assert elapsed < liveness + 5


@pytest.mark.parametrize("media", ["udp", "ipc"])
def test_closed_publication_ends_the_stream(tmp_path, media):
    channel = _udp(free_udp_port()) if media == "udp" else "aeron:ipc"
    d = tmp_path / "driver"
    common = ["--channel", channel, "--count", "500"]
    with Peer(
        ["sub", "--dir", str(d if media == "ipc" else tmp_path / "s"), *common, "--linger-until-unavailable"], "sub"
    ) as sub:
        sub.expect("READY", 30)
        with Peer(
            ["pub", "--dir", str(d if media == "ipc" else tmp_path / "p"), *common, "--close-after"], "pub"
        ) as pub:
            pub.expect("READY", 30)
            pub.expect("CLOSED", 60)
            sub.expect("DONE", 60)
            # End of stream, not liveness (10 s by default), makes the image go away.
            started = time.monotonic()
            sub.expect("EVENT unavailable", 8)
            assert time.monotonic() - started < 8
            assert pub.finish() == 0


def test_a_new_driver_removes_the_ipc_log_buffers_of_killed_publishers(tmp_path):
    """A publisher killed with SIGKILL cannot remove its log buffer; a node killed and restarted
    in a loop would leave its local logs behind every time. The driver that starts on the
    directory next removes those of dead processes, and only those (and the counters file the
    dead one kept as a client of the directory)."""
    from cluster_node.media.driver import DriverConfig, MediaDriver

    d = tmp_path / "driver"
    common = ["--dir", str(d), "--channel", "aeron:ipc", "--count", "10"]
    with Peer(["pub", *common, "--stream", "7002"], "alive") as alive:
        alive.expect("READY", 30)  # first: it owns the directory's counters.dat
        with Peer(["pub", *common, "--stream", "7001"], "killed") as killed:
            killed.expect("READY", 30)
            killed_file = next((d / "ipc" / "stream-7001").glob("*.logbuffer"))
            alive_file = next((d / "ipc" / "stream-7002").glob("*.logbuffer"))
            killed_counters = d / f"counters-{killed.pid}.dat"
            assert killed_counters.exists()
            killed.kill()
            killed.proc.wait(timeout=10)
        assert killed_file.exists()
        driver = MediaDriver(DriverConfig(dir=d))
        try:
            assert not killed_file.exists(), "the dead publisher's log buffer is still there"
            assert not killed_counters.exists()
            assert alive_file.exists(), "a live publisher's log buffer was removed"
        finally:
            driver.close()


def test_a_log_buffer_with_our_pid_goes_only_when_its_heartbeat_stopped(tmp_path):
    """A restarted container gives its entry point the same pid as before: a buffer with our
    pid is an earlier process's when nobody beats in it any more."""
    from cluster_node.media.channel import parse
    from cluster_node.media.ipc import IpcTransport

    transport = IpcTransport(tmp_path, image_liveness_timeout_ns=1_000_000_000)
    pub = transport.add_publication(parse("aeron:ipc"), 9)
    path = next((tmp_path / "ipc" / "stream-9").glob("*.logbuffer"))
    assert transport.remove_stale_files() == (0, 0) and path.exists()
    pub.log.publisher_heartbeat_ns = time.monotonic_ns() - 2_000_000_000
    removed, freed = transport.remove_stale_files()
    assert (removed, not path.exists()) == (1, True) and freed > 0
    transport.close()
