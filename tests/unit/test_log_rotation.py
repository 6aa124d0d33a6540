"""The node log rotates by size and keeps a bounded number of files (cluster_node.logsetup)."""

from __future__ import annotations

import json
import stat

import pytest
import structlog

from cluster_node import logsetup
from cluster_node.config import ConfigError, load_node_config, write_loopback_cluster


@pytest.fixture
def restore_structlog():
    yield
    structlog.reset_defaults()


def test_the_log_rotates_at_the_configured_size_and_keeps_the_configured_count(tmp_path, restore_structlog):
    path = tmp_path / "logs" / "node.log"
    logsetup.configure("json", "info", path, max_file_bytes=4096, max_files=3)
    log = structlog.get_logger("test")
    for i in range(2000):
        log.info("an event", i=i, padding="x" * (i % 50))
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == ["node.log", "node.log.1", "node.log.2", "node.log.3"]
    seen = [path.parent / name for name in reversed(names[1:])] + [path]
    numbers = []
    for p in seen:
        assert p.stat().st_size <= 4096, p
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
        numbers += [json.loads(line)["i"] for line in p.read_text().splitlines()]  # whole lines only
    # The newest events, oldest first and none missing between the kept files.
    assert numbers == list(range(numbers[0], 2000)) and numbers[0] > 0


def test_an_existing_log_counts_towards_the_size(tmp_path, restore_structlog):
    path = tmp_path / "node.log"
    path.write_text('{"event": "from an earlier run"}\n' * 200)
    logsetup.configure("json", "info", path, max_file_bytes=4096, max_files=2)
    structlog.get_logger("test").info("after restart")
    assert (tmp_path / "node.log.1").read_text().count("earlier run") == 200
    assert "after restart" in path.read_text()


def _config_with(tmp_path, text: str):
    (path,), _ = write_loopback_cluster(tmp_path / "configs", 1, tmp_path / "cluster")
    path.write_text(path.read_text() + "\n[logging]\n" + text)
    return path


def test_the_logging_keys_are_read_and_checked(tmp_path):
    cfg = load_node_config(_config_with(tmp_path, 'max_file_bytes = "1m"\nmax_files = 2\n'))
    assert (cfg.logging.max_file_bytes, cfg.logging.max_files) == (1024 * 1024, 2)
    default = load_node_config(_config_with(tmp_path / "d", ""))
    assert (default.logging.max_file_bytes, default.logging.max_files) == (64 * 1024 * 1024, 5)
    with pytest.raises(ConfigError, match="logging.max_files: must be from 1 to 1000, got 0"):
        load_node_config(_config_with(tmp_path / "z", "max_files = 0\n"))
    with pytest.raises(ConfigError, match="logging.max_file_bytes: must be at least 4k"):
        load_node_config(_config_with(tmp_path / "s", "max_file_bytes = 100\n"))


def test_a_rotation_that_fails_goes_on_in_the_current_file(tmp_path, monkeypatch):
    path = tmp_path / "node.log"
    out = logsetup.RotatingFile(path, max_bytes=4096, keep=2)
    calls = []

    def refuse(src, dst):
        calls.append(dst)
        raise PermissionError("read-only")

    monkeypatch.setattr(logsetup.os, "replace", refuse)
    for _ in range(100):
        out.write("x" * 99 + "\n")  # 10,000 bytes: one failed rotation per 4096, not one per line
    out.close()
    assert len(calls) == 2 and path.stat().st_size == 10_000


def test_a_write_that_fails_on_a_full_disk_is_lost_not_raised(tmp_path):
    """A duty cycle logs through this file: ENOSPC must not end it. The line is counted as lost,
    the file is opened again, and the next line starts on a line of its own."""
    import errno

    from cluster_node.logsetup import RotatingFile

    f = RotatingFile(tmp_path / "node.log", max_bytes=1 << 20, keep=2)
    f.write("first\n")
    real = f._file

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            real.close()

    f._file = Full()
    assert f.write('{"half": ') == len('{"half": ')
    assert f.lost_writes == 1
    f.write("second\n")
    f.flush()
    assert (tmp_path / "node.log").read_text() == "first\n\nsecond\n"
    f.close()
