"""``cluster-node stat`` against a counters file this test process owns."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from cluster_node.cli import main
from media.counters import CountersManager, CounterType, SystemCounters

CLI = Path(sys.executable).with_name("cluster-node")
DEADLINE_S = 30


@pytest.fixture
def node_dir(tmp_path):
    """A node directory whose driver/ holds live counters owned by this process."""
    manager = CountersManager.create(tmp_path / "driver" / "counters.dat", max_counters=64)
    sc = SystemCounters(manager)
    sc.bytes_sent.add(1_234_567)
    manager.allocate("pub-pos: aeron:udp?endpoint=127.0.0.1:20121", CounterType.PUBLISHER_POS, 5).set(4096)
    yield tmp_path
    manager.close()


def row(output: str, label: str) -> list[str]:
    """The ID, TYPE, VALUE cells of the table row with this label."""
    for line in output.splitlines():
        if line.endswith("  " + label):
            return line[: -len(label)].split()
    raise AssertionError(f"no row for {label!r} in:\n{output}")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "stat", *args], capture_output=True, text=True, timeout=DEADLINE_S)


def test_stat_lists_counters_with_header(node_dir):
    result = CliRunner().invoke(main, ["stat", "--dir", str(node_dir)])
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0]
    assert str(node_dir / "driver" / "counters.dat") in header
    assert f"owner pid {os.getpid()} (alive)" in header
    assert re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", header)
    assert row(result.output, "Bytes sent") == ["0", "SYSTEM", "1,234,567"]
    assert row(result.output, "Errors")[1:] == ["SYSTEM", "0"]
    assert row(result.output, "pub-pos: aeron:udp?endpoint=127.0.0.1:20121")[1:] == ["PUBLISHER_POS", "4,096"]


def test_stat_accepts_the_driver_directory_itself(node_dir):
    result = CliRunner().invoke(main, ["stat", "--dir", str(node_dir / "driver")])
    assert result.exit_code == 0, result.output
    assert row(result.output, "Bytes sent")[2] == "1,234,567"


@pytest.mark.parametrize("type_arg", ["publisher_pos", "12"])
def test_stat_filters_by_type_and_label(node_dir, type_arg):
    by_type = CliRunner().invoke(main, ["stat", "--dir", str(node_dir), "--type", type_arg])
    assert by_type.exit_code == 0, by_type.output
    assert len(by_type.output.splitlines()) == 3  # header, column titles, one row
    assert row(by_type.output, "pub-pos: aeron:udp?endpoint=127.0.0.1:20121")[2] == "4,096"
    by_label = CliRunner().invoke(main, ["stat", "--dir", str(node_dir), "--filter", "received"])
    labels = [line.split("  ")[-1] for line in by_label.output.splitlines()[2:]]
    assert labels and all("received" in label for label in labels)
    assert "Bytes received" in labels
    nothing = CliRunner().invoke(main, ["stat", "--dir", str(node_dir), "--filter", "no such label"])
    assert nothing.exit_code == 0, nothing.output
    assert nothing.output.splitlines()[1].split() == ["ID", "TYPE", "VALUE", "LABEL"]
    assert len(nothing.output.splitlines()) == 2


def test_stat_as_a_real_process_reads_the_live_file(node_dir):
    result = run("--dir", str(node_dir))
    assert result.returncode == 0, result.stderr
    assert f"owner pid {os.getpid()} (alive)" in result.stdout
    assert row(result.stdout, "Bytes sent")[1:] == ["SYSTEM", "1,234,567"]
    assert row(result.stdout, "pub-pos: aeron:udp?endpoint=127.0.0.1:20121")[2] == "4,096"


def test_watch_redraws_until_ctrl_c_and_exits_cleanly(node_dir):
    proc = subprocess.Popen(
        [str(CLI), "stat", "--dir", str(node_dir), "--watch", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out = b""
        deadline = time.monotonic() + DEADLINE_S
        while out.count(b"Bytes sent") < 2:  # at least two redraws
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"watch printed too little before the deadline: {out!r}"
            if select.select([proc.stdout], [], [], remaining)[0]:
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, f"stat exited early: {proc.stderr.read()!r}"
                out += chunk
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err and b"Aborted" not in err


@pytest.mark.parametrize("kind", ["missing-dir", "no-file", "corrupt-file"])
def test_operator_mistakes_give_one_error_line_and_exit_1(tmp_path, kind):
    target = tmp_path / "nowhere"
    if kind != "missing-dir":
        (target / "driver").mkdir(parents=True)
    if kind == "corrupt-file":
        (target / "driver" / "counters.dat").write_bytes(b"\x00" * 10)

    in_process = CliRunner().invoke(main, ["stat", "--dir", str(target)])
    assert in_process.exit_code == 1
    assert in_process.exception is None or isinstance(in_process.exception, SystemExit)

    result = run("--dir", str(target))
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert {"missing-dir": "no such directory", "no-file": "no counters file", "corrupt-file": "truncated"}[kind] in lines[0]


def test_impossible_start_timestamp_is_shown_not_raised(node_dir):
    with open(node_dir / "driver" / "counters.dat", "r+b") as f:
        f.seek(24)  # start_timestamp_ms in the header
        f.write((2**62).to_bytes(8, "little"))
    result = CliRunner().invoke(main, ["stat", "--dir", str(node_dir)])
    assert result.exit_code == 0, result.output
    assert f"started {2**62} ms since epoch (invalid)" in result.output.splitlines()[0]
