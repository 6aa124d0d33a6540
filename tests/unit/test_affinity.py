"""Per-role CPU affinity (cluster_node.affinity): CPU lists, the split ``up`` uses, and masks
really set on every thread of this process."""

from __future__ import annotations

import os
import threading

import pytest

from cluster_node.affinity import RoleAffinity, format_cpus, parse_cpus, split_for_shared_machine


@pytest.mark.parametrize(
    "text,cpus,formatted",
    [
        ("0", (0,), "0"),
        ("0-3,6", (0, 1, 2, 3, 6), "0-3,6"),
        ("3,1,1", (1, 3), "1,3"),
        (" 2 - 3", None, None),
        ("", (), ""),
    ],
)
def test_cpu_lists_parse_and_format(text: str, cpus, formatted) -> None:
    if cpus is None:
        with pytest.raises(ValueError):
            parse_cpus(text)
        return
    assert parse_cpus(text) == cpus
    assert format_cpus(cpus) == formatted


@pytest.mark.parametrize("text", ["a", "1-", "3-1", "-2", "0;1"])
def test_bad_cpu_lists_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a CPU list"):
        parse_cpus(text)


def test_split_for_a_shared_machine() -> None:
    assert split_for_shared_machine([5]) == ((), ())
    assert split_for_shared_machine([0, 1]) == ((0,), (1,))
    assert split_for_shared_machine([2, 0, 1]) == ((0,), (1, 2))
    assert split_for_shared_machine(range(8)) == ((0, 1), (2, 3, 4, 5, 6, 7))


def _masks() -> set[frozenset[int]]:
    """The distinct CPU masks of this process's threads, read from /proc."""
    out = set()
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            line = next(x for x in f if x.startswith("Cpus_allowed_list:"))
        out.add(frozenset(parse_cpus(line.split(":", 1)[1].strip())))
    return out


def test_role_affinity_sets_every_thread_and_puts_the_start_mask_back() -> None:
    start = frozenset(os.sched_getaffinity(0))
    cpus = sorted(start)
    leader, follower = {cpus[0]}, set(cpus[1:]) or {cpus[0]}
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)  # started before: must move too
    other.start()
    try:
        aff = RoleAffinity(leader, follower)
        assert aff.enabled
        aff.apply(is_leader=True)
        assert _masks() == {frozenset(leader)}
        later = []
        t = threading.Thread(target=lambda: later.append(frozenset(os.sched_getaffinity(0))))
        t.start()
        t.join()
        assert later == [frozenset(leader)]  # a thread started later inherits the role's mask
        aff.apply(is_leader=False)
        assert _masks() == {frozenset(follower)}
        RoleAffinity(leader, ()).apply(is_leader=False)  # an empty set: the OS decides again...
        assert _masks() == {frozenset(follower)}  # ...which, for a new RoleAffinity, is its start mask
        only_leader = RoleAffinity(leader, ())
        only_leader.apply(is_leader=True)
        assert _masks() == {frozenset(leader)}
        only_leader.apply(is_leader=False)
        assert _masks() == {frozenset(follower)}  # back to the mask it started with
    finally:
        stop.set()
        other.join()
        os.sched_setaffinity(0, start)
    assert RoleAffinity((), ()).enabled is False
