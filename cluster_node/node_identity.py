"""Which member of which cluster a node directory belongs to, recorded once and checked at every start.

A node directory holds one member's log, votes and snapshots. Started with another member's
config, a node would act as that member on this one's data: it could vote twice in a term under
two ids, or lead with a log that is not its own. So the directory records the member id and
cluster id it was created for, in ``node-identity.json``::

    {"member_id": 1, "cluster_id": 0, "created_ms": 1764270000000}

written once, atomically (a temporary file, fsync, rename), and a start whose config names
another member or cluster is refused with one line. A directory from before this file existed
gets it at its next start, from the ids its mark file last recorded when they are valid, else
from the config.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from cluster_node.consensus.node_files import read_mark_file
from cluster_node.media.private_files import create_new

__all__ = ["IDENTITY_FILE_NAME", "NodeIdentityError", "NodeIdentityDamagedError", "check_identity", "record_identity"]

IDENTITY_FILE_NAME = "node-identity.json"
_MAX_LENGTH = 4096


class NodeIdentityError(Exception):
    """The directory belongs to another member or cluster, or its identity file is damaged."""


class NodeIdentityDamagedError(NodeIdentityError):
    """The identity file cannot be decoded (a damaged file, not another member's directory)."""


def _read(path: Path) -> tuple[int, int] | None:
    try:
        data = path.read_bytes()[:_MAX_LENGTH]
    except FileNotFoundError:
        return None
    except OSError as e:
        raise NodeIdentityError(f"{path}: cannot read: {e.strerror}") from None
    try:
        doc = json.loads(data)
        member_id, cluster_id = doc["member_id"], doc["cluster_id"]
        if type(member_id) is not int or type(cluster_id) is not int:
            raise ValueError("ids must be integers")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise NodeIdentityDamagedError(
            f"{path} is damaged ({e}): it names the member this directory belongs to; restore it, "
            f"or delete it if you are sure which member's data this is"
        ) from None
    return member_id, cluster_id


def check_identity(node_dir: str | Path, member_id: int, cluster_id: int) -> bool:
    """Raise NodeIdentityError when ``node_dir`` belongs to another member or cluster; True when
    its identity is recorded already (else :func:`record_identity` should write it)."""
    node_dir = Path(node_dir)
    path = node_dir / IDENTITY_FILE_NAME
    recorded = _read(path)
    source = str(path)
    if recorded is None:
        mark = read_mark_file(node_dir)
        if mark is None:
            return False
        recorded, source = (mark.member_id, mark.cluster_id), f"its mark file, last written by pid {mark.pid}"
    if recorded != (member_id, cluster_id):
        raise NodeIdentityError(
            f"{node_dir} holds the data of member {recorded[0]} of cluster {recorded[1]} (from {source}), "
            f"but this config is member {member_id} of cluster {cluster_id}: start it with member "
            f"{recorded[0]}'s config, or give this member a directory of its own"
        )
    return path.exists()


def record_identity(node_dir: str | Path, member_id: int, cluster_id: int) -> None:
    """Write ``node-identity.json`` (once; the caller holds the directory's mark file)."""
    node_dir = Path(node_dir)
    path = node_dir / IDENTITY_FILE_NAME
    tmp = path.with_suffix(".json.tmp")
    doc = {"member_id": member_id, "cluster_id": cluster_id, "created_ms": time.time_ns() // 1_000_000}
    with os.fdopen(create_new(tmp, os.O_WRONLY), "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(node_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
