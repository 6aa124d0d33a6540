"""No file a node creates is readable by another user, and a shared-memory root that is not the
node user's alone is refused with one line. Real node processes, started with a permissive umask
(the node sets its own)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_node.config import write_loopback_cluster
from tests.support.cluster import ROOT, TestCluster

pytestmark = pytest.mark.slow

OTHER_UID = 65534  # nobody


def _loose(top: Path) -> list[str]:
    """Every file under ``top`` (and ``top``) whose mode is not 0600 (files) or 0700 (directories)."""
    found = []
    for path in [top, *top.rglob("*")]:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # removed meanwhile (a log buffer closed)
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want:
            found.append(f"{stat.S_IMODE(st.st_mode):04o} {path}")
    return found


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the children inherit it
    try:
        yield
    finally:
        os.umask(old)


def test_a_nodes_files_and_directories_are_private(tmp_path, open_umask):
    with TestCluster(tmp_path, nodes=1) as cluster:
        cluster.start()
        node = cluster.nodes[0]
        driver = node.cfg.driver_dir
        assert any(driver.rglob("*.logbuffer")), "the running node has log buffers"
        running = _loose(node.dir) + _loose(driver)
        if driver.parent.name.startswith("pycluster-"):  # the shared-memory root (others' nodes are in it)
            assert stat.S_IMODE(os.stat(driver.parent).st_mode) == 0o700
        assert node.terminate() == 0
        stopped = _loose(node.dir) + _loose(driver)
        assert (running, stopped) == ([], [])


_NODE_WITH_SHM_ROOT = """
import sys
from pathlib import Path
import cluster_node.driver_dir as driver_dir
driver_dir.SHM_ROOT = Path(sys.argv.pop(1))
from cluster_node.cli import main
main()
"""


@pytest.mark.parametrize("how", ["other-owner", "world-writable"])
def test_a_shm_root_not_the_users_alone_is_refused_in_one_line(tmp_path, how):
    shm = tmp_path / "shm"
    root = shm / f"pycluster-{os.getuid()}"
    root.mkdir(parents=True)
    if how == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("making a directory owned by another user needs root")
        os.chown(root, OTHER_UID, OTHER_UID)
        os.chmod(root, 0o700)
    else:
        os.chmod(root, 0o777)
    configs, _client = write_loopback_cluster(tmp_path / "configs", 1, tmp_path / "cluster")
    done = subprocess.run(
        [sys.executable, "-c", _NODE_WITH_SHM_ROOT, str(shm), "run", "--config", str(configs[0])],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1 and lines[0].startswith(f"Error: {root} "), done.stderr
    assert ("owned by uid 65534" if how == "other-owner" else "writable by other users") in lines[0]
    assert "[driver] dir" in lines[0]
    assert "READY" not in done.stdout
    assert list(root.iterdir()) == []
