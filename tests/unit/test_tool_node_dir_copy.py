"""A tool given a copy of a node directory reads the copy's files, never the original's."""

from __future__ import annotations

import os
import shutil

from cluster_node.consensus.node_files import MarkFile
from cluster_node.node_inspect import open_node_dir


def _node_dir(path, with_node_dir: bool):
    (path / "archive").mkdir(parents=True)
    (path / "logs").mkdir()
    details = {
        "archive_dir": str(path / "archive"),
        "log_file": str(path / "logs" / "node.log"),
        "driver_dir": str(path / "driver"),
    }
    if with_node_dir:
        details["node_dir"] = str(path)
    mark = MarkFile.open(path, member_id=1, details=details)
    return mark


def test_a_copy_reads_its_own_archive_and_log_and_is_not_the_running_node(tmp_path):
    original, copy = tmp_path / "a", tmp_path / "b"
    mark = _node_dir(original, with_node_dir=True)  # held: the original node still runs
    try:
        shutil.copytree(original, copy)
        node = open_node_dir(copy)
        assert node.archive_dir == copy / "archive"
        assert node.log_file == copy / "logs" / "node.log"
        assert not node.running and node.why_not_running.startswith(f"a copy of {original}")
        assert open_node_dir(original).archive_dir == original / "archive"
        assert open_node_dir(original).running
    finally:
        mark.close()


def test_a_copy_whose_mark_file_does_not_name_its_directory_is_recognised_by_its_layout(tmp_path):
    original, copy = tmp_path / "a", tmp_path / "b"
    _node_dir(original, with_node_dir=False).close()
    shutil.copytree(original, copy)
    assert open_node_dir(copy).archive_dir == copy / "archive"
    # An archive configured outside the node directory is the same for a copy.
    elsewhere = tmp_path / "shared-archive"
    os.mkdir(elsewhere)
    third = tmp_path / "c"
    (third / "logs").mkdir(parents=True)
    MarkFile.open(third, member_id=1, details={"archive_dir": str(elsewhere), "node_dir": str(third)}).close()
    shutil.copytree(third, tmp_path / "d")
    assert open_node_dir(tmp_path / "d").archive_dir == elsewhere
