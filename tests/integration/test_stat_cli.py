"""``cluster-node stat`` against a counters file this test process owns."""

from __future__ import annotations

import json
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
from cluster_node.media.counters import CountersManager, CounterType, SystemCounters

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


def _as_if_started_in_the_background() -> None:
    """A command a non-interactive shell starts with ``&`` inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_watch_redraws_until_ctrl_c_and_exits_cleanly(node_dir, stop_signal):
    proc = subprocess.Popen(
        [str(CLI), "stat", "--dir", str(node_dir), "--watch", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_as_if_started_in_the_background,
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
        proc.send_signal(stop_signal)
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
    assert {"missing-dir": "no such directory", "no-file": "no counters file", "corrupt-file": "truncated"}[
        kind
    ] in lines[0]


def test_impossible_start_timestamp_is_shown_not_raised(node_dir):
    with open(node_dir / "driver" / "counters.dat", "r+b") as f:
        f.seek(24)  # start_timestamp_ms in the header
        f.write((2**62).to_bytes(8, "little"))
    result = CliRunner().invoke(main, ["stat", "--dir", str(node_dir)])
    assert result.exit_code == 0, result.output
    assert f"started {2**62} ms since epoch (invalid)" in result.output.splitlines()[0]


def test_stat_json_carries_every_row_of_the_table(node_dir):
    text = CliRunner().invoke(main, ["stat", "--dir", str(node_dir)])
    result = CliRunner().invoke(main, ["stat", "--dir", str(node_dir), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == {"path", "owner_pid", "owner_alive", "start_timestamp_ms", "counters", "cluster"}
    assert doc["owner_pid"] == os.getpid() and doc["owner_alive"] is True
    assert doc["path"] == str(node_dir / "driver" / "counters.dat")
    table = {tuple(row(text.output, c["label"])) for c in doc["counters"]}
    assert table == {(str(c["id"]), c["type"], f"{c['value']:,}") for c in doc["counters"]}
    assert len(doc["counters"]) == len(text.output.splitlines()) - 2
    assert all(set(c) == {"id", "type_id", "type", "registration_id", "label", "value"} for c in doc["counters"])
    assert doc["cluster"] == {}  # a driver without a consensus module
    filtered = json.loads(CliRunner().invoke(main, ["stat", "--dir", str(node_dir), "--json", "--type", "12"]).output)
    assert [c["label"] for c in filtered["counters"]] == ["pub-pos: aeron:udp?endpoint=127.0.0.1:20121"]


def test_stat_json_groups_a_nodes_consensus_counters_by_member(tmp_path):
    from cluster_node.identifiers import CounterTypes

    with CountersManager.create(tmp_path / "driver" / "counters.dat", max_counters=16) as manager:
        manager.allocate("cluster role: member 3", CounterTypes.NODE_ROLE, 3).set(2)
        manager.allocate("cluster election-count: member 3", CounterTypes.ELECTION_COUNT, 3).set(4)
        manager.allocate("cluster peer 1 append-pos: member 3", CounterTypes.PEER_APPEND_POSITION, 1).set(640)
        doc = json.loads(CliRunner().invoke(main, ["stat", "--dir", str(tmp_path), "--json"]).output)
        assert doc["cluster"] == {"3": {"role": 2, "election_count": 4, "member_append_positions": {"1": 640}}}
        prom = CliRunner().invoke(main, ["stat", "--dir", str(tmp_path), "--prometheus", "--node-label", "n3"])
        assert prom.exit_code == 0, prom.output
        lines = prom.output.splitlines()
        assert 'pycluster_up{node="n3"} 1' in lines
        assert 'pycluster_node_role{node="n3",member="3"} 2' in lines
        assert 'pycluster_elections_total{node="n3",member="3"} 4' in lines
        assert 'pycluster_member_append_position{node="n3",member="3",peer="1"} 640' in lines
        assert "# TYPE pycluster_elections_total counter" in lines


@pytest.mark.parametrize(
    "args", [["--listen", "127.0.0.1:0"], ["--prometheus", "--listen", "nowhere"], ["--json", "--watch"]]
)
def test_stat_output_option_mistakes_give_one_line(node_dir, args):
    result = run("--dir", str(node_dir), *args)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: ")
