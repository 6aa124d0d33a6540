"""The test service: the kv store plus test operations, and the state digests that compare members.

The service ``harness.digest_service:DigestKvService`` is the kv store plus test operations (see
the class). Its central one: a GET of a key starting with ``__digest__`` makes every member write
a digest of its whole map to ``<digest dir>/member<i>-<key>.txt`` (the directory from
``$CLUSTER_TEST_DIGEST_DIR``). The request goes through the log, so all members compute it at
the same log position, and equal files prove equal service states (a ``.keys`` file beside each
digest lists the keys, to show what differs).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from cluster_node.service.examples.kv import (
    KeyValueService,
)

if TYPE_CHECKING:
    from harness.cluster import TestCluster

DIGEST_PREFIX = "__digest__"
DIGEST_DIR_ENV = "CLUSTER_TEST_DIGEST_DIR"


def state_digest(data: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for key in sorted(data):
        if key.startswith(DIGEST_PREFIX):
            continue
        kb = key.encode()
        h.update(len(kb).to_bytes(4, "little") + kb + len(data[key]).to_bytes(4, "little") + data[key])
    return f"{len(data)} {h.hexdigest()}"


TIMER_PREFIX = "__timer__"
FIRED_PREFIX = "__fired__"
SERVICE_MESSAGE_PREFIX = "__svcmsg__"
SERVICE_APPLIED_PREFIX = "__svc__"
CLOSED_PREFIX = "__closed__"
FAIL_SNAPSHOT_KEY = "__failsnapshot__"
SLOW_SNAPSHOT_KEY = "__slowsnapshot__"
RAISE_PREFIX = "__raise__"
PERIODIC_PREFIX = "__periodic__"
PERIODIC_STOP_PREFIX = "__pstop__"
PERIODIC_NEXT_PREFIX = "__pnext__"
PERIODIC_FIRED_PREFIX = "__pfired__"
PERIODIC_EARLY_PREFIX = "__pearly__"
PERIODIC_SKIPPED_PREFIX = "__pskipped__"
BURST_PREFIX = "__burst__"
BURST_APPLIED_PREFIX = "__b__"
SLOW_PREFIX = "__slow__"
SLOW_APPLY_S = 0.005


def slow_flag(digest_dir: Path, member_id: int) -> Path:
    """While this file exists, member ``member_id``'s service takes SLOW_APPLY_S over each
    ``__slow__`` PUT it applies, and creates :func:`slow_seen` at the first."""
    return Path(digest_dir) / f"slow-member{member_id}"


def slow_seen(digest_dir: Path, member_id: int) -> Path:
    return Path(digest_dir) / f"slow-member{member_id}.seen"


class DigestKvService(KeyValueService):
    """The kv service, plus test operations, all of them state (so replicated, snapshotted and
    part of the digest):

    * a GET of ``__digest__<tag>`` writes this member's state digest to
      ``$CLUSTER_TEST_DIGEST_DIR/member<i>-<tag>.txt`` (and answers it, from the leader);
    * a PUT of ``__timer__<id>`` with an 8-byte little-endian delay in milliseconds schedules
      timer ``<id>`` that far in cluster time; when it fires, ``__fired__<id>`` gets one more
      ``x`` (so its length counts the firings);
    * a PUT of ``__svcmsg__<n>`` makes the service offer a service message (``Cluster.offer``)
      that appends one ``x`` to ``__svc__<n>`` when it comes back through the log;
    * a closed client session ``<id>`` leaves ``__closed__<id>`` = its close reason's name;
    * while ``__failsnapshot__`` is ``1``, ``on_take_snapshot`` raises;
    * while ``__slowsnapshot__`` is a number, ``on_take_snapshot`` takes that many seconds;
    * a PUT of ``__periodic__<id>`` with an 8-byte period in milliseconds starts periodic timer
      ``<id>``: each firing counts one in ``__pfired__<id>`` and re-arms the same id, inside
      ``on_timer_event``, for the next period (``__pnext__<id>``); an event before the deadline
      counts in ``__pearly__<id>``, periods missed while the cluster was down in
      ``__pskipped__<id>``; a PUT of ``__pstop__<id>`` cancels it;
    * a PUT of ``__burst__<n>`` with a 4-byte count offers that many service messages from the
      one callback, message ``i`` appending one ``x`` to ``__b__<n>_<i>`` (a digest also writes
      ``.bursts``: each such key's length, 1 when applied exactly once);
    * a PUT of ``__raise__<n>`` stores its value, then raises ValueError (before any reply): a
      service callback that fails part way, the same on every member (``service_errors``);
    * a PUT of ``__slow__<n>`` is applied slowly while this member's :func:`slow_flag` file
      exists (a slow state machine for one member only, e.g. during its replay: the log
      entries themselves are the same on every member).
    """

    def on_session_close(self, session, timestamp: int, close_reason) -> None:
        self.data[f"{CLOSED_PREFIX}{session.id}"] = close_reason.name.encode()

    def on_take_snapshot(self, writer) -> None:
        if self.data.get(FAIL_SNAPSHOT_KEY) == b"1":
            raise RuntimeError("this service was told to fail its snapshot")
        slow = self.data.get(SLOW_SNAPSHOT_KEY)
        if slow:
            time.sleep(float(slow))  # a service slow to snapshot (its state is large), not a wait
        super().on_take_snapshot(writer)

    def on_timer_event(self, correlation_id: int, timestamp: int) -> None:
        next_key = f"{PERIODIC_NEXT_PREFIX}{correlation_id}"
        if next_key in self.data:
            self._periodic_fired(correlation_id, timestamp, next_key)
            return
        key = f"{FIRED_PREFIX}{correlation_id}"
        self.data[key] = self.data.get(key, b"") + b"x"

    def _periodic_fired(self, correlation_id: int, timestamp: int, next_key: str) -> None:
        """A periodic timer: counted once per deadline and re-armed, in this callback, for the
        next period (periods missed while the cluster was down are counted as skipped)."""
        deadline = int.from_bytes(self.data[next_key], "little")
        if timestamp < deadline:
            self._count(f"{PERIODIC_EARLY_PREFIX}{correlation_id}")  # an event for no due deadline
            return
        self._count(f"{PERIODIC_FIRED_PREFIX}{correlation_id}")
        period_ns = int.from_bytes(self.data[f"{PERIODIC_PREFIX}{correlation_id}"], "little") * 1_000_000
        following = deadline + period_ns
        while following <= timestamp:
            following += period_ns
            self._count(f"{PERIODIC_SKIPPED_PREFIX}{correlation_id}")
        self.data[next_key] = following.to_bytes(8, "little")
        self.cluster.schedule_timer(correlation_id, following)

    def _count(self, key: str) -> None:
        self.data[key] = (int.from_bytes(self.data.get(key, b""), "little") + 1).to_bytes(8, "little")

    def on_session_message(self, session, timestamp: int, payload) -> None:
        try:
            request = msgspec.msgpack.decode(payload)
        except (msgspec.MsgspecError, ValueError, RecursionError):
            request = None
        if (
            isinstance(request, list)
            and len(request) == 4
            and request[0] == 1
            and isinstance(request[2], str)
            and request[2].startswith(RAISE_PREFIX)
        ):
            self.data[request[2]] = bytes(request[3]) if isinstance(request[3], bytes) else b""
            raise ValueError(f"told to raise on {request[2]}")
        super().on_session_message(session, timestamp, payload)
        if request is None:
            return
        if (
            isinstance(request, list)
            and len(request) == 4
            and request[0] == 1
            and isinstance(request[2], str)
            and self.cluster is not None
            and session is not None
        ):
            key, value = request[2], request[3]
            if key.startswith(PERIODIC_PREFIX) and isinstance(value, bytes) and len(value) == 8:
                correlation_id = int(key[len(PERIODIC_PREFIX) :])
                deadline = timestamp + int.from_bytes(value, "little") * 1_000_000
                self.data[f"{PERIODIC_NEXT_PREFIX}{correlation_id}"] = deadline.to_bytes(8, "little")
                self.cluster.schedule_timer(correlation_id, deadline)
            elif key.startswith(PERIODIC_STOP_PREFIX):
                correlation_id = int(key[len(PERIODIC_STOP_PREFIX) :])
                self.data.pop(f"{PERIODIC_NEXT_PREFIX}{correlation_id}", None)
                self.cluster.cancel_timer(correlation_id)
            elif key.startswith(BURST_PREFIX) and isinstance(value, bytes) and len(value) == 4:
                n = key[len(BURST_PREFIX) :]
                for i in range(int.from_bytes(value, "little")):
                    self.cluster.offer(msgspec.msgpack.encode([4, 0, f"{BURST_APPLIED_PREFIX}{n}_{i}", b"x"]))
            elif key.startswith(TIMER_PREFIX) and isinstance(value, bytes) and len(value) == 8:
                delay_ns = int.from_bytes(value, "little") * 1_000_000
                self.cluster.schedule_timer(int(key[len(TIMER_PREFIX) :]), timestamp + delay_ns)
            elif key.startswith(SERVICE_MESSAGE_PREFIX):
                n = key[len(SERVICE_MESSAGE_PREFIX) :]
                self.cluster.offer(msgspec.msgpack.encode([4, 0, f"{SERVICE_APPLIED_PREFIX}{n}", b"x"]))
            elif key.startswith(SLOW_PREFIX):
                directory = os.environ.get(DIGEST_DIR_ENV)
                if directory and slow_flag(Path(directory), self.cluster.member_id).exists():
                    slow_seen(Path(directory), self.cluster.member_id).touch()
                    time.sleep(SLOW_APPLY_S)  # the slow state machine itself, not a wait
        if (
            isinstance(request, list)
            and len(request) == 3
            and request[0] == 2
            and isinstance(request[2], str)
            and request[2].startswith(DIGEST_PREFIX)
        ):
            digest = state_digest(self.data)
            directory = os.environ.get(DIGEST_DIR_ENV)
            if directory and self.cluster is not None:
                tag = request[2][len(DIGEST_PREFIX) :]
                base = Path(directory) / f"member{self.cluster.member_id}-{tag}"
                # The key list first (to see what differs), the digest last (tests wait for it).
                base.with_suffix(".keys").write_text("".join(f"{k}\n" for k in sorted(self.data)))
                counts = {k: len(v) for k, v in self.data.items() if k.startswith(BURST_APPLIED_PREFIX)}
                base.with_suffix(".bursts").write_text(json.dumps(counts))
                base.with_suffix(".txt").write_text(f"{self.cluster.log_position} {digest}\n")


class FailingStartService(KeyValueService):
    """A service whose ``on_start`` raises: the node must end with SERVICE_FAILED, not 0."""

    def on_start(self, cluster, snapshot) -> None:
        raise RuntimeError("this service cannot start")


def read_digest_keys(cluster: TestCluster, tag: str, member_id: int) -> list[str]:
    p = cluster.digest_dir / f"member{member_id}-{tag}.keys"
    return p.read_text().split() if p.exists() else []


def read_digests(cluster: TestCluster, tag: str) -> dict[int, str]:
    out = {}
    for n in cluster.nodes:
        p = cluster.digest_dir / f"member{n.member_id}-{tag}.txt"
        if p.exists():
            text = p.read_text()
            if text.endswith("\n"):
                out[n.member_id] = text.strip()
    return out
