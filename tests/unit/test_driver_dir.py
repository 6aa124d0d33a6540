"""Default driver directories in shared memory, and the removal of orphaned ones."""

from __future__ import annotations

import os

import pytest

from cluster_node import driver_dir
from cluster_node.driver_dir import OWNER_FILE_NAME, claim, default_driver_dir, sweep_orphans


def test_default_is_per_node_directory_under_shm_root(tmp_path, monkeypatch):
    root = driver_dir.shm_driver_root()
    if root is None:
        pytest.skip("no writable /dev/shm on this machine")  # the fallback is tested below
    a, b = default_driver_dir(tmp_path / "a" / "node0"), default_driver_dir(tmp_path / "b" / "node0")
    assert a.parent == root == b.parent and root.name == f"pycluster-{os.getuid()}"
    assert a != b and a.name.startswith("node0-") and b.name.startswith("node0-")
    assert driver_dir.in_shm_root(a) and not driver_dir.in_shm_root(tmp_path / "node0" / "driver")
    # The same directory named two ways gives the same driver directory.
    monkeypatch.chdir(tmp_path)
    assert default_driver_dir("a/node0") == a == default_driver_dir(tmp_path / "a" / "." / "node0")


def test_without_shm_the_default_is_inside_the_node_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_dir, "SHM_ROOT", tmp_path / "no-shm")
    assert default_driver_dir(tmp_path / "node1") == tmp_path / "node1" / "driver"


def test_sweep_removes_only_directories_of_deleted_node_directories(tmp_path):
    root = tmp_path / "root"
    live_node, gone_node = tmp_path / "live", tmp_path / "gone"
    live_node.mkdir()
    gone_node.mkdir()
    claim(root / "live-1", live_node)
    claim(root / "gone-2", gone_node)
    (root / "gone-2" / "counters.dat").write_bytes(b"x" * 100)
    (root / "foreign").mkdir()
    gone_node.rmdir()
    assert sweep_orphans(root) == [root / "gone-2"]
    assert sorted(p.name for p in root.iterdir()) == ["foreign", "live-1"]
    assert (root / "live-1" / OWNER_FILE_NAME).read_text().strip() == str(live_node.resolve())
    assert sweep_orphans(tmp_path / "missing") == []


def test_a_driver_directory_that_cannot_be_made_stops_the_node_with_one_line(tmp_path, monkeypatch):
    from cluster_node.config import generate_loopback_cluster
    from cluster_node.node import NodeStartError, _prepare_driver_dir

    monkeypatch.setattr(driver_dir, "SHM_ROOT", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    (tmp_path / "shm" / f"pycluster-{os.getuid()}").write_text("not a directory")
    cfg = generate_loopback_cluster(3, tmp_path / "cluster")[0][0]
    assert cfg.driver_dir.parent == tmp_path / "shm" / f"pycluster-{os.getuid()}"
    with pytest.raises(NodeStartError, match=r"cannot use the driver directory .*\[driver\] dir"):
        _prepare_driver_dir(cfg)
