"""scripts/bench_cluster.py: where the benchmarks' client runs (``--client-cpus``)."""

import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_cluster as bc

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")


def test_default_is_wherever_the_os_puts_it():
    assert bc.client_cpus(None, (0,), (1,)) == ()
    assert bc.client_cpus("any", (0,), (1,)) == ()


def test_followers_names_the_followers_cpus():
    assert bc.client_cpus("followers", (0,), (1,)) == (1,)
    assert bc.client_cpus("followers", (0, 1), (2, 3)) == (2, 3)


def test_unpinned_members_leave_the_client_to_the_os():
    assert bc.client_cpus(None, (), ()) == ()
    assert bc.client_cpus("any", (), ()) == ()
    for spec in ("0", "followers"):
        with pytest.raises(ValueError, match="needs pinned members"):
            bc.client_cpus(spec, (), ())


def test_any_and_explicit_lists():
    cpus = sorted(os.sched_getaffinity(0))
    assert bc.client_cpus("any", (0,), (1,)) == ()
    assert bc.client_cpus(f"{cpus[0]}", (0,), (1,)) == (cpus[0],)
    with pytest.raises(ValueError, match="not a CPU list"):
        bc.client_cpus("one", (0,), (1,))
    with pytest.raises(ValueError, match="no CPU"):
        bc.client_cpus(" ", (0,), (1,))
    with pytest.raises(ValueError, match="not available here"):
        bc.client_cpus(str(max(cpus) + 64), (0,), (1,))


@needs_affinity
def test_place_client_pins_the_calling_thread_only(monkeypatch):
    """The client is the trio thread; the pin must not leak into the rest of the process (the
    test runs it in a thread of its own, as a member started later takes its CPUs from its
    config anyway)."""
    monkeypatch.setattr(bc, "_client_mask", None)
    allowed = os.sched_getaffinity(0)
    target = (min(allowed),)
    seen = {}

    def body():
        bc.place_client(target)
        seen["inside"] = os.sched_getaffinity(0)
        bc.place_client(())  # () leaves the mask as it is
        seen["after_empty"] = os.sched_getaffinity(0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen["inside"] == set(target)
    assert seen["after_empty"] == set(target)
    assert os.sched_getaffinity(0) == allowed


@needs_affinity
def test_members_started_by_a_pinned_client_get_its_old_cpus(monkeypatch):
    """A member restarted by the benchmark (failover rounds) would inherit the client's CPUs and
    refuse a config naming others: it starts from the CPUs the client had before its pin."""
    monkeypatch.setattr(bc, "_client_mask", None)
    allowed = os.sched_getaffinity(0)
    target = (min(allowed),)
    seen = {}

    def body():
        with bc.client_unpinned():  # not pinned yet: nothing to undo
            seen["before"] = os.sched_getaffinity(0)
        bc.place_client(target)
        with bc.client_unpinned():
            seen["inside"] = os.sched_getaffinity(0)
        seen["after"] = os.sched_getaffinity(0)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == {"before": allowed, "inside": allowed, "after": set(target)}
