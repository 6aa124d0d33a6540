"""scripts/hops.py: following a round trip through the processes' records, and its wrappers."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import hops

CLIENT, LEADER, F1, F2 = 100, 200, 300, 400
INGRESS, CLIENT_OUT, CLIENT_EGRESS = 5000, 5001, 5002
LOG1, LOG2, CONSENSUS = 6001, 6002, 7000


def _write(d: Path, pid: int, rows: list[tuple]) -> None:
    (d / f"{pid}.txt").write_text("".join(" ".join(map(str, r)) + "\n" for r in sorted(rows)))


def _round_trip(t: int) -> dict[int, list[tuple]]:
    """One message sent at ``t`` ns; every hop takes a different number of microseconds."""
    us = 1000
    return {
        CLIENT: [(t, "send", 96, INGRESS, CLIENT_OUT, "m"), (t + 900 * us, "recv", 96, 9000, CLIENT_EGRESS, "m")],
        LEADER: [
            (t + 100 * us, "recv", 96, CLIENT_OUT, INGRESS, "m"),
            (t + 150 * us, "send", 96, LOG1, 8000, "m"),
            (t + 160 * us, "send", 96, LOG2, 8000, "m"),
            (t + 500 * us, "recv", 64, 3333, CONSENSUS, "m"),  # F2's answer, first
            (t + 520 * us, "recv", 64, 4444, CONSENSUS, "m"),
            (t + 600 * us, "ring", 0, 0, 0, "m"),
            (t + 700 * us, "send", 96, CLIENT_EGRESS, 9000, "s"),
        ],
        F1: [(t + 300 * us, "recv", 96, 8000, LOG1, "m"), (t + 490 * us, "send", 64, CONSENSUS, 4444, "m")],
        F2: [(t + 250 * us, "recv", 96, 8000, LOG2, "m"), (t + 450 * us, "send", 64, CONSENSUS, 3333, "m")],
    }


def test_analyse_follows_each_round_trip_through_the_committing_follower(tmp_path: Path) -> None:
    rows: dict[int, list[tuple]] = {p: [] for p in (CLIENT, LEADER, F1, F2)}
    for i in range(10):
        for pid, r in _round_trip(1_000_000_000 + i * 2_000_000).items():
            rows[pid] += r
    for pid, r in rows.items():
        _write(tmp_path, pid, r)
    got = hops.analyse(tmp_path, CLIENT)
    assert {k: set(v) for k, v in got.items()} == {
        "client send -> leader read": {100.0},
        "leader read -> log send": {50.0},
        "log send -> follower read": {100.0},  # F2 answered first: its read, 250 - 150
        "follower read -> append send": {200.0},
        "append send -> leader read": {50.0},
        "leader read -> ring": {100.0},
        "ring -> egress send": {100.0},
        "egress send -> client read": {200.0},
        "round trip": {900.0},
    }
    assert len(got["round trip"]) == 6  # the middle 60 % of ten


def test_analyse_without_client_messages_says_so(tmp_path: Path) -> None:
    for pid in (CLIENT, LEADER, F1, F2):
        _write(tmp_path, pid, [])
    with pytest.raises(SystemExit, match="no client messages"):
        hops.analyse(tmp_path, CLIENT)


def test_install_wraps_the_methods_it_names(tmp_path: Path) -> None:
    """The wrapped methods exist (a rename elsewhere would otherwise break the script only)."""
    from cluster_node.consensus.agent import ConsensusAgent
    from cluster_node.media.driver import MediaDriver

    before = (MediaDriver._raw_send, MediaDriver._on_datagram, ConsensusAgent._ring_service)
    try:
        dump = hops.install(str(tmp_path))
        assert MediaDriver._raw_send is not before[0]
        assert MediaDriver._on_datagram is not before[1]
        assert ConsensusAgent._ring_service is not before[2]
        dump()
        import atexit

        atexit.unregister(dump)
    finally:
        MediaDriver._raw_send, MediaDriver._on_datagram, ConsensusAgent._ring_service = before
    assert [p.name for p in tmp_path.iterdir()] and all(p.read_text() == "" for p in tmp_path.iterdir())


_PERF = """\
          python   200/200   [000]   100.000000000: sched:sched_switch: prev_comm=python prev_pid=200 prev_prio=120 prev_state=S ==> next_comm=python next_pid=100 next_prio=120
          python   100/100   [000]   100.000400000: sched:sched_switch: prev_comm=python prev_pid=100 prev_prio=120 prev_state=S ==> next_comm=service next_pid=201 next_prio=120
         service   200/201   [000]   100.000600000: sched:sched_switch: prev_comm=service prev_pid=201 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
         swapper     0/0     [001]   100.000100000: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=python next_pid=300 next_prio=120
          python   300/300   [001]   100.000300000: sched:sched_switch: prev_comm=python prev_pid=300 prev_prio=120 prev_state=R ==> next_comm=kworker/1:2 next_pid=55 next_prio=120
     kworker/1:2    55/55    [001]   100.000500000: sched:sched_switch: prev_comm=kworker/1:2 prev_pid=55 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
"""


def test_load_switches_reads_perf_script_lines() -> None:
    switches, tid_pid = hops.load_switches(_PERF)
    t = 100_000_000_000
    assert switches[0] == [(t, 100, "python"), (t + 400_000, 201, "service"), (t + 600_000, 0, "swapper/0")]
    assert [s[1] for s in switches[1]] == [300, 55, 0]
    assert tid_pid[201] == 200 and tid_pid[100] == 100 and tid_pid[300] == 300


def test_cpu_shares_splits_each_window_by_who_ran() -> None:
    """The window 100.0002-100.0007 s: cpu0 ran the client 200 µs, the leader's service thread
    200, then nothing 100; cpu1 the follower 100, a kernel thread 200, nothing 200."""
    switches, tid_pid = hops.load_switches(_PERF)
    t = 100_000_000_000
    roles = {100: "client", 200: "leader", 300: "follower"}
    shares = hops.cpu_shares([(t + 200_000, t + 700_000)], switches, tid_pid, roles)
    assert shares == pytest.approx(
        {
            (0, "client:main"): 0.4,
            (0, "leader:service"): 0.4,
            (0, "idle"): 0.2,
            (1, "follower:main"): 0.2,
            (1, "kworker/1:2"): 0.4,
            (1, "idle"): 0.4,
        }
    )
    # Two windows count together; time before a CPU's first switch is not known.
    shares = hops.cpu_shares([(t - 100_000, t + 100_000), (t + 500_000, t + 600_000)], switches, tid_pid, roles)
    assert shares[(0, "client:main")] == pytest.approx(1 / 3)
    assert shares[(0, "leader:service")] == pytest.approx(1 / 3)
    assert shares[(1, "idle")] == pytest.approx(1 / 3)
    assert hops.cpu_shares([], switches, tid_pid, roles) == {}
