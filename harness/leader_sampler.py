"""A thread that watches every running member for two leaders of one term (a split brain).

Apart from the cluster harness because it is a check of its own: it only reads counters files,
and any harness that knows its members' counters files could run it.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from cluster_node.media.counters import CountersError, CountersReader
from harness.node import _COUNTER_TYPES, CLOSED, LEADER

if TYPE_CHECKING:
    from harness.cluster import TestCluster


class LeaderSampler:
    """A thread that reads every running member's role, election state and term from its
    counters file, every few milliseconds, and records which member led which term.

    At most one member leads a term, ever: two members seen leading one term (at the same moment
    or not) is a split brain. A member counts as leading when its role is LEADER and its
    election is CLOSED (the counters a member writes last when it takes a term). The sampler
    opens its own counters readers (the test's thread uses the Node's)."""

    INTERVAL_S = 0.005

    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.term_leaders: dict[int, set[int]] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._readers: dict[int, tuple[int, CountersReader, dict[str, int]]] = {}  # member -> (pid, ...)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="leader-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for _pid, reader, _ids in self._readers.values():
            reader.close()
        self._readers.clear()

    def problems(self) -> list[str]:
        return [
            f"members {sorted(ids)} were each leader of term {term}"
            for term, ids in sorted(self.term_leaders.items())
            if len(ids) > 1
        ]

    def _run(self) -> None:
        while not self._stop.wait(self.INTERVAL_S):
            for n in self.cluster.nodes:
                proc = n.proc
                if proc is None or proc.poll() is not None:
                    continue
                values = self._read(n.member_id, proc.pid, n.counters_path)
                if values is not None and values["role"] == LEADER and values["election"] == CLOSED:
                    self.term_leaders.setdefault(values["term"], set()).add(n.member_id)
            self.samples += 1

    def _read(self, member_id: int, pid: int, path: Path) -> dict[str, int] | None:
        entry = self._readers.get(member_id)
        if entry is not None and entry[0] != pid:
            self._readers.pop(member_id)[1].close()
            entry = None
        if entry is None:
            try:
                reader = CountersReader.open(path)
            except (CountersError, OSError, ValueError):
                return None
            if reader.owner_pid != pid:
                reader.close()
                return None
            ids = {}
            for name in ("role", "election", "term"):
                found = [
                    c for c in reader.find(type_id=_COUNTER_TYPES[name]) if c.label.endswith(f"member {member_id}")
                ]
                if found:
                    ids[name] = found[0].counter_id
            if len(ids) < 3:
                reader.close()
                return None
            entry = self._readers[member_id] = (pid, reader, ids)
        get, ids = entry[1].get, entry[2]
        try:
            # Term and role read before and after the rest, one consistent reading kept: a
            # member's counters change one by one (role, then election state, then term).
            term, role, election = get(ids["term"]), get(ids["role"]), get(ids["election"])
            if get(ids["term"]) != term or get(ids["role"]) != role:
                return None
            return {"term": term, "role": role, "election": election}
        except CountersError:
            entry[1].close()
            del self._readers[member_id]
            return None
