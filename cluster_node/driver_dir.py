"""Where a node's media driver keeps its files, and the clean-up of ones left behind.

The driver directory holds the counters file and the log buffers of every publication and image:
memory-mapped files that the conductor and service threads, and tools in other processes, write
and read all the time. On a disk the kernel writes their dirty pages back every few seconds, and a
thread that writes to a page under writeback can wait for it, so by default (no ``[driver] dir``)
they live in shared memory, as the reference's do::

    /dev/shm/pycluster-<uid>/<node dir name>-<8 hex digits of the node dir's absolute path>/
        node-dir          the node directory that owns this one (text), for tools and clean-up
        counters.dat      the counters (``cluster-node stat``)
        ...               log buffers (``cluster_node.media.ipc``, ``cluster_node.media.driver``)

Without a writable /dev/shm the default is ``<node dir>/driver``. The mark file in the node
directory records the driver directory in use, so tools that are given the node directory find it.

Nothing in the driver directory needs to outlive the process: a restarted node makes new log
buffers and rebuilds its state from the archive and the node directory. But files in /dev/shm use
memory until they are removed, and a killed node removes nothing. So a starting node removes the
driver directories (under the same root) whose node directory no longer exists: a cluster whose
directory was deleted (a test's, a demo's) leaves its shared memory until the next node starts.

The root's name is predictable, so another user of the host could make it first (or replace a
driver directory in it) to read or swap the node's shared memory: :func:`prepare` makes the
root and the node's driver directory 0700 and refuses to use either when it is not this user's
own, with one line (``cluster_node.media.private_files``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from cluster_node.media.private_files import FILE_MODE, check_private_dir, make_private_dir

__all__ = [
    "SHM_ROOT",
    "OWNER_FILE_NAME",
    "default_driver_dir",
    "shm_driver_root",
    "in_shm_root",
    "prepare",
    "claim",
    "sweep_orphans",
]

SHM_ROOT = Path("/dev/shm")
OWNER_FILE_NAME = "node-dir"


def shm_driver_root() -> Path | None:
    """``/dev/shm/pycluster-<uid>``, or None where there is no writable /dev/shm."""
    if not (SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK | os.X_OK)):
        return None
    return SHM_ROOT / f"pycluster-{os.getuid()}"


def in_shm_root(driver_dir: Path) -> bool:
    """Whether ``driver_dir`` is one of the per-node directories under :func:`shm_driver_root`."""
    root = shm_driver_root()
    return root is not None and Path(driver_dir).parent == root


def default_driver_dir(node_dir: str | Path) -> Path:
    """The driver directory of a node whose config names none (see the module docstring)."""
    node_dir = Path(node_dir).absolute()
    root = shm_driver_root()
    if root is None:
        return node_dir / "driver"
    digest = hashlib.blake2b(os.fsencode(os.path.normpath(node_dir)), digest_size=4).hexdigest()
    return root / f"{node_dir.name or 'node'}-{digest}"


def prepare(driver_dir: Path) -> None:
    """Make ``driver_dir`` (and, for one under the shared-memory root, the root) if missing, and
    check that each is this user's own (``cluster_node.media.private_files.check_private_dir``); raises
    ``UnsafeDirectoryError`` with the line for the operator."""
    driver_dir = Path(driver_dir)
    if in_shm_root(driver_dir):
        root = driver_dir.parent
        make_private_dir(root)
        check_private_dir(
            root,
            f"remove it (rm -r {root}, as its owner or root), or set [driver] dir in the "
            f"config to a directory of this user's",
        )
    make_private_dir(driver_dir)
    check_private_dir(
        driver_dir, f"remove it (rm -r {driver_dir}), or set [driver] dir in the config to a directory of this user's"
    )


def claim(driver_dir: Path, node_dir: Path) -> None:
    """Write the owner file of a driver directory under the shared-memory root."""
    make_private_dir(driver_dir)
    path = driver_dir / OWNER_FILE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        f.write(str(Path(node_dir).resolve()) + "\n")


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the driver directories under ``root`` (default: :func:`shm_driver_root`) whose
    owner file names a node directory that no longer exists; the list removed. A directory
    without an owner file is left alone: it is not known to be ours."""
    root = shm_driver_root() if root is None else root
    removed: list[Path] = []
    if root is None or not root.is_dir():
        return removed
    for child in root.iterdir():
        try:
            owner = (child / OWNER_FILE_NAME).read_text().strip()
        except OSError:
            continue
        if owner and not Path(owner).exists():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed
