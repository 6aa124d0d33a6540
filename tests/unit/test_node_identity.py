"""node-identity.json: a node directory belongs to one member of one cluster."""

from __future__ import annotations

import json

import pytest

from cluster_node.consensus.node_files import MarkFile
from cluster_node.node_identity import IDENTITY_FILE_NAME, NodeIdentityError, check_identity, record_identity


def test_a_new_directory_is_recorded_and_then_only_its_member_may_start(tmp_path):
    assert check_identity(tmp_path, 1, 0) is False
    record_identity(tmp_path, 1, 0)
    assert json.loads((tmp_path / IDENTITY_FILE_NAME).read_text())["member_id"] == 1
    assert check_identity(tmp_path, 1, 0) is True
    with pytest.raises(NodeIdentityError) as info:
        check_identity(tmp_path, 2, 0)
    assert str(info.value) == (
        f"{tmp_path} holds the data of member 1 of cluster 0 (from {tmp_path / IDENTITY_FILE_NAME}), but this "
        f"config is member 2 of cluster 0: start it with member 1's config, or give this member a directory "
        f"of its own"
    )
    with pytest.raises(NodeIdentityError, match="member 1 of cluster 0 .* member 1 of cluster 7"):
        check_identity(tmp_path, 1, 7)


def test_a_directory_from_before_the_file_is_judged_by_its_mark_file(tmp_path):
    mark = MarkFile.open(tmp_path, member_id=1, cluster_id=0)
    mark.close()
    with pytest.raises(NodeIdentityError, match="from its mark file, last written by pid"):
        check_identity(tmp_path, 2, 0)
    assert check_identity(tmp_path, 1, 0) is False  # same member: the file is written now


@pytest.mark.parametrize("content", [b"", b"{", b'{"member_id": "1", "cluster_id": 0}', b'{"cluster_id": 0}'])
def test_a_damaged_identity_file_refuses_in_one_line(tmp_path, content):
    (tmp_path / IDENTITY_FILE_NAME).write_bytes(content)
    with pytest.raises(NodeIdentityError) as info:
        check_identity(tmp_path, 1, 0)
    assert "is damaged" in str(info.value) and "\n" not in str(info.value)
