"""cluster_node.wall_clock: the system clock, or the system clock plus a test's offset file."""

from __future__ import annotations

import time

from cluster_node import wall_clock as wc


def test_without_a_file_it_is_the_system_clock_itself():
    assert wc.wall_clock(None) is time.time_ns
    assert wc.wall_clock("") is time.time_ns


def test_the_offset_file_steps_the_clock_and_is_read_again(tmp_path, monkeypatch):
    mono = [0]
    monkeypatch.setattr(wc.time, "monotonic_ns", lambda: mono[0])
    monkeypatch.setattr(wc.time, "time_ns", lambda: 5_000_000_000_000)
    path = tmp_path / "offset"
    clock = wc.wall_clock(path)
    assert clock() == 5_000_000_000_000  # no file: offset 0
    path.write_text("-180000\n")
    assert clock() == 5_000_000_000_000  # read again only after REREAD_NS
    mono[0] += wc.REREAD_NS
    assert clock() == 5_000_000_000_000 - 180 * 1_000_000_000
    path.write_text("60000")
    mono[0] += wc.REREAD_NS
    assert clock() == 5_000_000_000_000 + 60 * 1_000_000_000
    path.write_text("not a number")
    mono[0] += wc.REREAD_NS
    assert clock() == 5_000_000_000_000
