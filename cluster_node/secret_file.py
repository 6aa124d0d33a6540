"""Secret files: the keys that members share (member-only traffic) and that clients prove they
hold (the shared-secret authenticator).

Format: one line of hexadecimal, at least :data:`MIN_KEY_BYTES` bytes (``cluster-node secret
generate`` writes :data:`KEY_BYTES` random bytes), optionally followed by a newline; ``#``
comment lines and blank lines are allowed before it. A secret is never written inline in a config
file: configs are copied, shown and committed, a key file is not.

A key file must be this user's and readable by nobody else (mode 0600 or stricter), as ssh
demands of a private key: a key that others can read is not a secret, and refusing it at start
is kinder than a cluster that anyone on the host can join. Every problem is one line naming the
file (:class:`SecretFileError`).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

__all__ = ["KEY_BYTES", "MIN_KEY_BYTES", "SecretFileError", "generate", "read_key", "check_private_file"]

KEY_BYTES = 32
MIN_KEY_BYTES = 16
_MAX_FILE_BYTES = 1 << 20  # a key file is a line or a small table; anything larger is not one


class SecretFileError(Exception):
    """A secret file cannot be used: one line with the path and why."""


def generate(path: str | os.PathLike[str]) -> bytes:
    """Write a new random key to ``path`` (mode 0600) and return it; an existing file is never
    overwritten (a rotated key is a new file, so the old one stays until every member moved)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        raise SecretFileError(f"{path}: already exists (a key is never overwritten; choose a new file name)")
    key = secrets.token_bytes(KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise SecretFileError(f"{path}: cannot create: {e.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
        f.flush()
        os.fsync(f.fileno())
    return key


def check_private_file(path: str | os.PathLike[str]) -> None:
    """Refuse a file that is not a regular file of this user or that others may read or write."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise SecretFileError(f"{path}: no such file (create one with: cluster-node secret generate {path})") from None
    except OSError as e:
        raise SecretFileError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SecretFileError(f"{path}: not a regular file")
    if st.st_uid != os.geteuid():
        raise SecretFileError(f"{path}: owned by uid {st.st_uid}, not by this user ({os.geteuid()})")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise SecretFileError(f"{path}: mode {stat.S_IMODE(st.st_mode):04o} lets others read it; run: chmod 600 {path}")
    if st.st_size > _MAX_FILE_BYTES:
        raise SecretFileError(f"{path}: {st.st_size} bytes is too large for a secret file")


def read_key(path: str | os.PathLike[str]) -> bytes:
    """The key in ``path`` (see the module docstring for the format and the checks)."""
    check_private_file(path)
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise SecretFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if len(lines) != 1:
        raise SecretFileError(f"{path}: expected one line of hexadecimal, found {len(lines)} lines")
    try:
        key = bytes.fromhex(lines[0])
    except ValueError:
        raise SecretFileError(f"{path}: the key is not hexadecimal") from None
    if len(key) < MIN_KEY_BYTES:
        raise SecretFileError(f"{path}: the key has {len(key)} bytes, at least {MIN_KEY_BYTES} are needed")
    return key
