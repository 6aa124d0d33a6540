"""A fuzzing run against a live :class:`~tests.support.cluster.TestCluster` under client load.

:func:`run_adversarial` sends the datagrams of a :class:`~tests.support.fuzz.DatagramFuzzer` at
a steady rate to every UDP socket of every member while an ``AppendWriter`` (the end-to-end
suite's exactly-once writer) keeps writing, samples the members once a second (alive, term,
commit, RSS, fds, counters in use) and stops early when a member exits. The datagrams sent to
each member lately are kept; when a member exits they are written to
``<out dir>/fuzz-member<i>.jsonl`` (one JSON object a line, ``hex`` the exact bytes, in sending
order, each SETUP before the frames of its session), so that the culprit can be found by
sending them again to a fresh node (:func:`send_recorded`).

The sending sockets are bound to 127.0.0.1, 127.0.0.2 and 127.0.0.3 (three source addresses,
so that limits per source are exercised); the sink socket, which every channel the fuzzer
names points at, is drained and counted.
"""

from __future__ import annotations

import errno
import json
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

import trio

from tests.support.cluster import TestCluster
from tests.support.fuzz import (
    DatagramFuzzer,
    MemberView,
    Target,
    counters_in_use,
    discover_targets,
    proc_figures,
    read_member_view,
    system_counters,
)

SOURCE_HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
TICK_S = 0.01
SAMPLE_S = 1.0
RECENT_PER_MEMBER = 20_000
WRITER_KEYS = 512
"""Keys the load's AppendWriter spreads its tokens over: a value must stay under the largest
reply (an eighth of a term) however long the run."""
VERIFY_WINDOW = 8
"""Reads in flight when the writes are verified: a long run's values are tens of kilobytes, and
the service drops a reply its client's egress has no room for."""
MAX_COMMIT_STALL_S = 10.0
"""The longest the commit position may stand still under fuzzing: a few election timeouts.
The fuzzer does not impersonate members (tests/support/fuzz.py), so no message may end a term;
this bounds the stalls of a loaded machine."""


@dataclass
class Bounds:
    """What a member may use at most while fuzzed: peak RSS, open fds above what it held when
    the fuzzing began, and the share of its counters file in use."""

    peak_rss_kb: int = 1024 * 1024
    extra_fds: int = 256
    counters_share: float = 0.8


@dataclass
class Report:
    seed: int
    datagrams: int = 0
    sent_by_kind: Counter = field(default_factory=Counter)
    mutations: Counter = field(default_factory=Counter)
    send_errors: Counter = field(default_factory=Counter)
    sink_datagrams: int = 0
    held_back_sent: int = 0
    sink_replies: int = 0
    targets: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    exited: dict[int, int] = field(default_factory=dict)
    first_term: int = -1
    last_term: int = -1
    commit_start: int = -1
    commit_end: int = -1
    longest_commit_stall_s: float = 0.0
    peak_rss_kb: dict[int, int] = field(default_factory=dict)
    fds_start: dict[int, int] = field(default_factory=dict)
    peak_fds: dict[int, int] = field(default_factory=dict)
    peak_counters: dict[int, int] = field(default_factory=dict)
    counters_at_peak: dict[int, dict[str, int]] = field(default_factory=dict)
    counters_capacity: dict[int, int] = field(default_factory=dict)
    dumps: dict[int, str] = field(default_factory=dict)
    system_counters: dict[int, dict[str, int]] = field(default_factory=dict)
    acked: int = 0
    sent_writes: int = 0
    abandoned: int = 0
    lost: int = -1
    duplicated: int = -1

    election_starts: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    """Per term left, the members that left it and why (from the members' logs)."""

    @property
    def elections(self) -> int:
        return max(0, self.last_term - self.first_term)

    @property
    def unexplained_elections(self) -> list[int]:
        """Terms that ended with no member's leader heartbeat timing out: ended by a message.
        (A member starved of CPU on a loaded machine misses heartbeats: a real fault.)"""
        return sorted(
            term
            for term, starts in self.election_starts.items()
            if not any(reason == "leader heartbeat timeout" for _m, reason in starts)
        )

    def bound_violations(self, bounds: Bounds) -> list[str]:
        out = []
        for m, peak in self.peak_rss_kb.items():
            if peak > bounds.peak_rss_kb:
                out.append(f"member {m} peak RSS {peak} kB > {bounds.peak_rss_kb} kB")
        for m, peak in self.peak_fds.items():
            if peak > self.fds_start.get(m, 0) + bounds.extra_fds:
                out.append(
                    f"member {m} held {peak} fds, {self.fds_start.get(m)} at the start (+{bounds.extra_fds} allowed)"
                )
        for m, peak in self.peak_counters.items():
            cap = self.counters_capacity.get(m, 0)
            if cap and peak > cap * bounds.counters_share:
                out.append(f"member {m} had {peak} of {cap} counters in use")
        return out

    def summary(self, members: int) -> dict:
        """The one JSON line of ``scripts/fuzz_cluster``."""
        return {
            "seed": self.seed,
            "seconds": round(self.seconds, 1),
            "datagrams": self.datagrams,
            "datagrams_per_kind": dict(sorted(self.sent_by_kind.items())),
            "mutations": dict(sorted(self.mutations.items())),
            "send_errors": dict(self.send_errors),
            "held_back_frames_sent": self.held_back_sent,
            "replies_at_sink": self.sink_datagrams,
            "sink_answers": self.sink_replies,
            "targets": dict(self.targets),
            "members": members,
            "members_alive": members - len(self.exited),
            "exited": {str(k): v for k, v in self.exited.items()},
            "writes_sent": self.sent_writes,
            "writes_acknowledged": self.acked,
            "writes_abandoned": self.abandoned,
            "acknowledged_lost": self.lost,
            "duplicated": self.duplicated,
            "elections": self.elections,
            "elections_by_reason": dict(Counter(r for starts in self.election_starts.values() for _m, r in starts)),
            "unexplained_elections": self.unexplained_elections,
            "commit_start": self.commit_start,
            "commit_end": self.commit_end,
            "longest_commit_stall_s": round(self.longest_commit_stall_s, 2),
            "peak_rss_kb": {str(k): v for k, v in self.peak_rss_kb.items()},
            "open_fds": {str(k): v for k, v in self.peak_fds.items()},
            "fds_at_start": {str(k): v for k, v in self.fds_start.items()},
            "counters_in_use": {str(k): v for k, v in self.peak_counters.items()},
            "counters_capacity": {str(k): v for k, v in self.counters_capacity.items()},
            "counters_by_kind_at_peak": {str(k): v for k, v in self.counters_at_peak.items()},
            "dumps": {str(k): v for k, v in self.dumps.items()},
            "system_counters": {str(k): v for k, v in self.system_counters.items()},
        }


class _Senders:
    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        for host in SOURCE_HOSTS:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
            s.bind((host, 0))
            s.setblocking(False)
            self.socks.append(s)
        self.sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sink.bind(("127.0.0.1", 0))
        self.sink.setblocking(False)
        self.sink_replies = 0

    @property
    def sink_addr(self) -> tuple[str, int]:
        return self.sink.getsockname()

    def drain_sink(self, fuzzer: DatagramFuzzer, errors: Counter) -> int:
        """Read what the members' publications sent the sink, and answer as the fuzzer says."""
        n = 0
        for _ in range(5000):
            try:
                data, addr = self.sink.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue  # an ICMP error queued on the socket
            n += 1
            for reply in fuzzer.on_sink(data):
                _send(self.sink, reply, addr, errors)
                self.sink_replies += 1
        return n

    def drain_replies(self, fuzzer: DatagramFuzzer, errors: Counter) -> int:
        """Read what comes back to the sending sockets (status messages for forged sessions,
        NAKs, ICMP errors) and send the frames the fuzzer holds back for a session whose image
        now exists; the number of datagrams so sent."""
        sent = 0
        for source, s in enumerate(self.socks):
            for _ in range(1000):
                try:
                    data, addr = s.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    continue
                target, frames = fuzzer.on_status(source, addr[1], data)
                for d in frames:
                    _send(s, d, target.addr, errors)
                    self.on_sent(source, target, d)
                sent += len(frames)
        return sent

    def close(self) -> None:
        for s in self.socks + [self.sink]:
            s.close()


def _send(sock: socket.socket, data: bytes, addr: tuple[str, int], errors: Counter) -> None:
    try:
        sock.sendto(data, addr)
    except OSError as e:
        errors[errno.errorcode.get(e.errno, str(e.errno))] += 1


async def run_adversarial(
    cluster: TestCluster,
    seed: int,
    *,
    rate_per_s: float,
    datagrams: int | None = None,
    seconds: float | None = None,
    out_dir: Path | None = None,
    huge_term_probability: float = 0.002,
    impersonate: bool = False,
    writer=None,
) -> Report:
    """Fuzz the running cluster until ``datagrams`` are sent or ``seconds`` have passed (or a
    member exits); the report. ``writer`` (an AppendWriter, running meanwhile) gives the
    load; the caller verifies it."""
    assert datagrams is not None or seconds is not None
    out_dir = Path(out_dir or cluster.out_dir)
    report = Report(seed)
    senders = _Senders()
    driver = cluster.nodes[0].cfg.driver
    fuzzer = DatagramFuzzer(
        seed,
        sources=len(senders.socks),
        sink=senders.sink_addr,
        term_length=driver.term_length,
        mtu=driver.mtu,
        huge_term_probability=huge_term_probability,
        impersonate=impersonate,
    )
    views = {n.member_id: MemberView(n.member_id) for n in cluster.nodes}
    recent: dict[int, deque] = {n.member_id: deque(maxlen=RECENT_PER_MEMBER) for n in cluster.nodes}
    commit_samples: list[tuple[float, int]] = []

    def refresh() -> None:
        targets: list[Target] = []
        for n in cluster.nodes:
            read_member_view(n, views[n.member_id])
            if n.running:
                targets += discover_targets(n)
        fuzzer.update(targets, views)
        report.targets = Counter(t.role for t in targets)

    def sample(now: float) -> None:
        counters = cluster.counters()
        if counters:
            terms = [c.term for c in counters.values()]
            commits = [c.commit for c in counters.values()]
            if report.first_term < 0:
                report.first_term = max(terms)
                report.commit_start = max(commits)
            report.last_term = max(report.last_term, max(terms))
            report.commit_end = max(report.commit_end, max(commits))
            commit_samples.append((now, max(commits)))
        for n in cluster.nodes:
            m = n.member_id
            if not n.running:
                if m not in report.exited and n.proc is not None:
                    report.exited[m] = n.proc.returncode
                continue
            figures = proc_figures(n.pid)
            if figures is not None:
                report.peak_rss_kb[m] = max(report.peak_rss_kb.get(m, 0), figures["peak_rss_kb"])
                report.fds_start.setdefault(m, figures["fds"])
                report.peak_fds[m] = max(report.peak_fds.get(m, 0), figures["fds"])
            system = system_counters(n)
            if system:
                report.system_counters[m] = system
            used = counters_in_use(n)
            if used is not None:
                if used[0] > report.peak_counters.get(m, -1):
                    report.peak_counters[m] = used[0]
                    report.counters_at_peak[m] = {k: v for k, v in used[2].items() if v > 2}
                report.counters_capacity[m] = used[1]

    start = time.monotonic()
    next_sample = start
    sent = released = 0

    def record(kind: str, mutation: str, source: int, target: Target, d: bytes) -> None:
        recent[target.member_id].append(
            (round(time.monotonic() - start, 4), kind, mutation, source, target.role, target.port, d)
        )

    senders.on_sent = lambda source, target, d: record("held-back", "", source, target, d)
    try:
        while True:
            now = time.monotonic()
            if now >= next_sample:
                refresh()
                sample(now)
                next_sample = now + SAMPLE_S
                if report.exited:
                    break
            if datagrams is not None and sent >= datagrams:
                break
            if seconds is not None and now - start >= seconds:
                break
            due = int((now - start) * rate_per_s) - sent
            if datagrams is not None:
                due = min(due, datagrams - sent)
            while due > 0 and fuzzer.targets:
                kind, mutation, source, target, batch = fuzzer.next()
                if mutation:
                    report.mutations[mutation] += 1
                sock = senders.socks[source]
                for d in batch:
                    _send(sock, d, target.addr, report.send_errors)
                    record(kind, mutation, source, target, d)
                sent += len(batch)
                due -= len(batch)
            report.sink_datagrams += senders.drain_sink(fuzzer, report.send_errors)
            released += senders.drain_replies(fuzzer, report.send_errors)
            await trio.sleep(TICK_S)
        sample(time.monotonic())
    finally:
        senders.close()
    report.seconds = time.monotonic() - start
    report.datagrams = sent
    report.held_back_sent = released
    report.sink_replies = senders.sink_replies
    report.sent_by_kind = Counter(fuzzer.sent)
    report.longest_commit_stall_s = _longest_stall(commit_samples)
    for m in report.exited:
        path = out_dir / f"fuzz-member{m}.jsonl"
        with open(path, "w") as f:
            for at, kind, mutation, source, role, port, d in recent[m]:
                f.write(
                    json.dumps(
                        {
                            "t": at,
                            "kind": kind,
                            "mutation": mutation,
                            "source": SOURCE_HOSTS[source],
                            "role": role,
                            "port": port,
                            "hex": d.hex(),
                        }
                    )
                    + "\n"
                )
        report.dumps[m] = str(path)
    report.election_starts = election_starts(cluster)
    if writer is not None:
        report.sent_writes = len(writer.sent)
        report.acked = len(writer.acked)
        report.abandoned = len(writer.abandoned)
    return report


def election_starts(cluster: TestCluster) -> dict[int, list[tuple[int, str]]]:
    """Every election a member started after its election at start, from the members' logs:
    ``{term left: [(member id, reason), ...]}``."""
    out: dict[int, list[tuple[int, str]]] = {}
    for n in cluster.nodes:
        for e in n.log_events(current_process_only=False):
            if e.get("event") == "election state" and e.get("from_state") == "CLOSED":
                out.setdefault(e.get("leadership_term_id", -1), []).append((n.member_id, e.get("reason", "?")))
    return out


def _longest_stall(samples: list[tuple[float, int]]) -> float:
    """The longest time the highest commit position stood still between samples."""
    longest = 0.0
    since, best = None, None
    for at, commit in samples:
        if best is None or commit > best:
            best, since = commit, at
        else:
            longest = max(longest, at - since)
    return longest


def load_recorded(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def send_recorded(
    records: list[dict], port_map: dict[tuple[str, int], tuple[str, int]] | None = None, pace_s: float = 0.0
) -> None:
    """Send recorded datagrams again, each from its recorded source address (a fresh
    ephemeral port) to its recorded port, or to ``port_map[(role, port)]`` (the same role on
    another cluster, whose ports differ)."""
    socks: dict[str, socket.socket] = {}
    try:
        for r in records:
            s = socks.get(r["source"])
            if s is None:
                s = socks[r["source"]] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind((r["source"], 0))
            addr = (port_map or {}).get((r["role"], r["port"]), ("127.0.0.1", r["port"]))
            try:
                s.sendto(bytes.fromhex(r["hex"]), addr)
            except OSError:
                pass
            if pace_s:
                time.sleep(pace_s)  # pacing the sender, not a wait for a condition
    finally:
        for s in socks.values():
            s.close()
