"""Building blocks for end-to-end fault scenarios on a :class:`~tests.support.cluster.TestCluster`.

* :func:`reconfigure` changes keys of the generated member configs before the members start
  (``max_sessions`` for many clients, ``clock_offset_file`` for a steppable clock, ...);
* :func:`enable_clock_steps` / :func:`step_clock` give every member a wall clock a test can
  step back or forward (``[node] clock_offset_file``, see cluster_node/wall_clock.py);
* :func:`log_entries` decodes a member's recorded log into ``(position, kind, timestamp,
  message)`` for checks on the log itself (timestamps never going back, one TimerEvent per
  timer);
* :class:`SequenceWriter` is one client writing numbered kv APPENDs to a key of its own, each
  sent once (never retried): what it saw acknowledged must be applied exactly once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec
import trio

from cluster_node import codecs
from cluster_node.config import load_node_config, node_config_to_toml
from tests.support.cluster import Append, KvClient, Status, TestCluster

FRAME_BEGIN = 0x80
FRAME_END = 0x40


def reconfigure(cluster: TestCluster, *, node: dict | None = None, cluster_keys: dict | None = None) -> None:
    """Rewrite every member's config with ``node`` keys of ``[node]`` and ``cluster_keys`` of
    ``[cluster]`` changed (before the members start: a running member keeps what it read)."""
    for n in cluster.nodes:
        cfg = n.cfg
        if node:
            cfg = msgspec.structs.replace(cfg, node=msgspec.structs.replace(cfg.node, **node))
        if cluster_keys:
            cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, **cluster_keys))
        n.config_path.write_text(node_config_to_toml(cfg))
        n.cfg = load_node_config(n.config_path)


def clock_file(cluster: TestCluster, member_id: int) -> Path:
    return cluster.base_dir / f"clock-offset-member{member_id}"


def enable_clock_steps(cluster: TestCluster) -> None:
    """Every member reads its wall clock through an offset file (offset 0 to begin with); one
    config per member, so each gets a file of its own."""
    for n in cluster.nodes:
        step_clock(cluster, n.member_id, 0)
        cfg = msgspec.structs.replace(
            n.cfg, node=msgspec.structs.replace(n.cfg.node, clock_offset_file=str(clock_file(cluster, n.member_id)))
        )
        n.config_path.write_text(node_config_to_toml(cfg))
        n.cfg = load_node_config(n.config_path)


def step_clock(cluster: TestCluster, member_id: int, offset_ms: int) -> None:
    """Set member ``member_id``'s clock to the system clock plus ``offset_ms`` (by rename, so
    the member never reads a half-written file)."""
    path = clock_file(cluster, member_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{offset_ms}\n")
    os.replace(tmp, path)


def log_entries(cluster: TestCluster, member_id: int, to_position: int) -> list[tuple[int, str, int, object]]:
    """``(position, kind, timestamp, message)`` of every entry of the member's recorded log
    below ``to_position`` (fragments joined), ``kind`` the message's class name; an entry
    without a timestamp has None."""
    out = []
    parts: list[bytes] = []
    start = 0
    for position, _length, flags, payload in cluster.log_frames(member_id, to_position):
        if flags & FRAME_BEGIN:
            parts, start = [], position
        parts.append(bytes(payload))
        if not flags & FRAME_END:
            continue
        data = b"".join(parts)
        parts = []
        msg = codecs.LOG_CODEC.decode(data)
        if isinstance(msg, codecs.SessionMessage):
            out.append((start, "SessionMessage", msg.header.timestamp, msg))
        else:
            out.append((start, type(msg).__name__, getattr(msg, "timestamp", None), msg))
    return out


def timestamps_going_back(entries) -> list[str]:
    """Every place where an entry's timestamp is below the highest one before it."""
    bad = []
    high, high_at = None, None
    for position, kind, ts, _msg in entries:
        if ts is None:
            continue
        if high is not None and ts < high:
            bad.append(f"{kind} at {position}: {ts} is {(high - ts) / 1e9:.3f}s below {high} (at {high_at})")
        if high is None or ts > high:
            high, high_at = ts, position
    return bad


class SequenceWriter:
    """One client's writes: APPEND ``"<n>;"`` to the key ``seq<client>``, n = 0, 1, 2, ...,
    up to ``window`` in flight; each sent once. ``acked`` holds the numbers whose reply came.

    The client's cluster session id is noted when it starts: :attr:`session_ids` lists every
    session id the client had (one, unless the cluster closed its session)."""

    def __init__(self, index: int, kv: KvClient, window: int = 4) -> None:
        self.index = index
        self.kv = kv
        self.key = f"seq{index}"
        self.window = window
        self.sent: dict[int, int] = {}  # request id -> sequence number
        self.acked: set[int] = set()
        self.next = 0
        self.session_ids = [kv.client.cluster_session_id]
        self.stop = trio.Event()
        self.refused: list = []

    def _note_session(self) -> None:
        sid = self.kv.client.cluster_session_id
        if sid != self.session_ids[-1] and sid >= 0:
            self.session_ids.append(sid)

    def reap(self) -> None:
        for rid, n in self.sent.items():
            reply = self.kv.replies.get(rid)
            if reply is not None and n not in self.acked:
                if reply.status != Status.OK:
                    self.refused.append((n, reply))
                else:
                    self.acked.add(n)

    def acked_from(self, first: int) -> int:
        """How many writes numbered ``first`` or more are acknowledged (replies read now)."""
        self.reap()
        return sum(1 for n in self.acked if n >= first)

    async def run(self, give_up_s: float = 3.0) -> None:
        """Write until :attr:`stop`; a write unanswered for ``give_up_s`` leaves the window
        (offered to a leader that died), never to be sent again."""
        waiting: dict[int, float] = {}
        while not self.stop.is_set():
            self._note_session()
            now = time.monotonic()
            for rid in [r for r, at in waiting.items() if r in self.kv.replies or now - at > give_up_s]:
                del waiting[rid]
            if len(waiting) >= self.window:
                await self.kv.wait_reply(next(iter(waiting)), 0.05)
                continue
            req = Append(self.kv.next_id(), self.key, b"%d;" % self.next)
            self.sent[req.request_id] = self.next
            self.next += 1
            await self.kv.send(req, timeout=30)
            waiting[req.request_id] = time.monotonic()
        deadline = time.monotonic() + give_up_s
        while any(r not in self.kv.replies for r in waiting) and time.monotonic() < deadline:
            await self.kv.wait_reply(next(r for r in waiting if r not in self.kv.replies), 0.1)
        self._note_session()
        self.reap()

    def check(self, value: bytes | None) -> list[str]:
        """What is wrong with the key's final value: an acknowledged number missing, a number
        present twice, a number never sent."""
        seen: dict[int, int] = {}
        for token in (value or b"").decode().split(";"):
            if token:
                seen[int(token)] = seen.get(int(token), 0) + 1
        problems = []
        twice = sorted(n for n, c in seen.items() if c > 1)
        missing = sorted(self.acked - set(seen))
        unsent = sorted(n for n in seen if n >= self.next)
        if twice:
            problems.append(f"client {self.index}: {len(twice)} writes applied more than once, e.g. {twice[:5]}")
        if missing:
            problems.append(
                f"client {self.index}: {len(missing)} of {len(self.acked)} acknowledged writes lost, e.g. {missing[:5]}"
            )
        if unsent:
            problems.append(f"client {self.index}: numbers never sent applied: {unsent[:5]}")
        return problems
