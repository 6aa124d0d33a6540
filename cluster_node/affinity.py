"""CPU affinity by role: the CPUs a member's threads run on while it leads, and while it follows.

Why a node would pin itself
===========================
When the members of a cluster share one machine (``cluster-node up``, the benchmarks, a laptop
demo), the Linux scheduler places them badly for a replicated log. A UDP datagram to a sleeping
process wakes it with a *synchronous* wake-up, which puts the woken process on the sender's CPU
on the guess that the sender is about to sleep. The leader is not about to sleep: it sends the
new entry to the first follower, that follower is woken onto the leader's CPU and preempts it,
and the datagram to the second follower leaves only once the first follower has recorded the
entry and answered. The other CPU meanwhile sits idle (timestamps at each send and receive of
every process show the gap between the leader's two sends of one entry, the first follower
running on the leader's CPU). Keeping the leader's threads on CPUs of their own and the
followers' on the others removes that.

A member changes role at run time (elections), so the setting is per role: ``leader_cpus`` and
``follower_cpus`` in the ``[node]`` table. Candidates use the follower set. An empty set means
"wherever the OS puts them": the mask the process started with is put back. Members on machines
of their own (a real deployment) have no reason to set either.

The mask is set for every thread of the process (the conductor, the service thread, the worker
threads trio keeps), so a thread started later inherits the current one from its creator.
Linux only (``os.sched_setaffinity``); config validation refuses the keys elsewhere.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

import structlog

log = structlog.get_logger("cluster_node.affinity")

__all__ = ["RoleAffinity", "format_cpus", "parse_cpus", "available_cpus", "supported", "split_for_shared_machine"]


def supported() -> bool:
    return hasattr(os, "sched_setaffinity") and os.path.isdir("/proc/self/task")


def available_cpus() -> set[int]:
    """The CPUs this process may run on (its mask at the time of the call)."""
    return set(os.sched_getaffinity(0)) if supported() else set(range(os.cpu_count() or 1))


def format_cpus(cpus: Iterable[int]) -> str:
    """``0-3,6``: a CPU set as ranges, as ``taskset -c`` writes it."""
    s = sorted(set(cpus))
    parts = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        parts.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(parts)


def split_for_shared_machine(cpus: Iterable[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(leader CPUs, follower CPUs) for members that all run on this machine: the leader gets
    the lowest CPU (the lowest two from four CPUs up, so its conductor and service threads can
    run at once), the followers share the rest. ``((), ())`` with fewer than two CPUs or where
    affinity is not supported."""
    allowed = sorted(available_cpus() if cpus is None else set(cpus))
    if len(allowed) < 2 or not supported():
        return (), ()
    k = 2 if len(allowed) >= 4 else 1
    return tuple(allowed[:k]), tuple(allowed[k:])


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0-3,6"`` -> ``(0, 1, 2, 3, 6)``; ValueError on anything else. Empty text: ``()``."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a CPU list: {text!r} (write it as 0-3,6)")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise ValueError(f"not a CPU list: {text!r} ({part} runs backwards)")
        out.extend(range(a, b + 1))
    return tuple(sorted(set(out)))


class RoleAffinity:
    """Puts every thread of this process on the CPUs of its role, when the role changes.

    Nothing happens when both sets are empty. A failure to set a mask (a CPU taken offline
    since start) is logged once and the node carries on where the OS puts it: placement is a
    matter of speed, never of correctness."""

    def __init__(self, leader_cpus: Iterable[int] = (), follower_cpus: Iterable[int] = ()) -> None:
        self.leader_cpus = frozenset(leader_cpus)
        self.follower_cpus = frozenset(follower_cpus)
        self.enabled = bool(self.leader_cpus or self.follower_cpus) and supported()
        self._initial = frozenset(os.sched_getaffinity(0)) if self.enabled else frozenset()
        self._current = self._initial
        self._warned = False

    def apply(self, is_leader: bool) -> None:
        if not self.enabled:
            return
        wanted = (self.leader_cpus if is_leader else self.follower_cpus) or self._initial
        if wanted == self._current:
            return
        try:
            for tid in os.listdir("/proc/self/task"):
                try:
                    os.sched_setaffinity(int(tid), wanted)
                except ProcessLookupError:
                    pass  # the thread ended between the listing and now
        except OSError as e:
            if not self._warned:
                self._warned = True
                log.warning(
                    "cpu affinity not set", cpus=format_cpus(wanted), error=os.strerror(e.errno or errno.EINVAL)
                )
            return
        self._current = wanted
        log.info("cpu affinity", role="leader" if is_leader else "follower", cpus=format_cpus(wanted))
