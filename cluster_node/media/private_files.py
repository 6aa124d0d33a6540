"""Files and directories that only the user running the node may read: modes, and checks of
directories that someone else could have made.

A node's files hold its whole history (the log, snapshots) and its live memory (IPC log buffers,
counters); other users of the host must not read them, let alone write them. So every file is
created 0600 and every directory 0700, whatever the process's umask (a node also sets
``umask 0o077`` for what libraries create); tools run as the same user and read them as before.

A temporary file that is renamed over the real one is created with ``O_EXCL | O_NOFOLLOW``: a
name that exists (a link planted by someone else, or one left by a crash) is never written
through. One left by a crash is ours to remove, so it is unlinked (which removes a link, never
its target) and the exclusive create is tried once more.

A directory at a predictable path in a shared place (``/dev/shm/pycluster-<uid>``) could have
been made by another user before the node first ran; :func:`check_private_dir` refuses one that
is not ours, is writable by others, or is a symbolic link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = [
    "FILE_MODE",
    "DIR_MODE",
    "UnsafeDirectoryError",
    "make_private_dir",
    "create_new",
    "check_private_dir",
    "tighten_own_dir",
]

FILE_MODE = 0o600
DIR_MODE = 0o700


class UnsafeDirectoryError(Exception):
    """A directory the node would use is not safely its own. One line: the path, why, what to do."""


def make_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and its parents) 0700 if missing; ``path``."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return path


def tighten_own_dir(path: str | os.PathLike[str]) -> None:
    """Make a directory of this user's 0700 when others could read or enter it (one made before
    files were private, or by a tool under a looser umask). Another user's is left as it is:
    the operator chose it, and the opens that follow say whether it can be used."""
    st = os.stat(path)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, DIR_MODE)


def create_new(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """A file descriptor of a new, empty file at ``path`` (mode 0600), never one through a link.

    For temporary files that are renamed into place; an existing one is removed first (see the
    module docstring)."""
    flags |= os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, FILE_MODE)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, FILE_MODE)


def check_private_dir(path: str | os.PathLike[str], what_to_do: str) -> None:
    """Raise :class:`UnsafeDirectoryError` unless ``path`` is a real directory owned by this user
    and writable by no one else. A directory of ours that others can only read (made before
    files were private) is made 0700. ``what_to_do`` ends the error line."""
    path = Path(path)
    st = os.lstat(path)
    uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectoryError(f"{path} is a symbolic link, not a directory of this user's: {what_to_do}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path} is not a directory: {what_to_do}")
    if st.st_uid != uid:
        raise UnsafeDirectoryError(
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {uid}), who could then read and "
            f"replace the node's files: {what_to_do}"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise UnsafeDirectoryError(
            f"{path} is writable by other users (mode {mode:04o}), who could replace the node's files: {what_to_do}"
        )
    if mode & 0o077:
        os.chmod(path, DIR_MODE)
