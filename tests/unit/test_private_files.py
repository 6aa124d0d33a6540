"""Private files and directories (cluster_node.media.private_files) and the checks of the driver directories."""

from __future__ import annotations

import os
import stat

import pytest

from cluster_node import driver_dir
from cluster_node.media.private_files import UnsafeDirectoryError, check_private_dir, create_new, make_private_dir

OTHER_UID = 65534  # nobody


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_files_and_directories_are_private_whatever_the_umask(tmp_path, open_umask):
    d = make_private_dir(tmp_path / "a" / "b")
    assert _mode(d) == 0o700
    fd = create_new(d / "x.tmp")
    os.close(fd)
    assert _mode(d / "x.tmp") == 0o600


def test_a_temporary_file_is_never_written_through_a_planted_link(tmp_path):
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    (tmp_path / "x.tmp").symlink_to(target)
    fd = create_new(tmp_path / "x.tmp", os.O_WRONLY)
    os.write(fd, b"new")
    os.close(fd)
    assert target.read_bytes() == b"precious"
    assert not (tmp_path / "x.tmp").is_symlink() and (tmp_path / "x.tmp").read_bytes() == b"new"


def test_a_directory_writable_by_others_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(UnsafeDirectoryError, match=r"writable by other users \(mode 0777\).*: do this"):
        check_private_dir(d, "do this")


def test_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        check_private_dir(tmp_path / "link", "do this")


def test_a_directory_of_another_user_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another user needs root")
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectoryError, match=rf"owned by uid {OTHER_UID}, not by this user"):
        check_private_dir(d, "do this")


def test_our_directory_readable_by_others_is_made_private(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    os.chmod(d, 0o755)
    check_private_dir(d, "do this")
    assert _mode(d) == 0o700


@pytest.fixture
def shm(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_dir, "SHM_ROOT", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    return tmp_path / "shm" / f"pycluster-{os.getuid()}"


def test_the_shm_root_and_driver_directory_are_made_private(tmp_path, shm, open_umask):
    ddir = driver_dir.default_driver_dir(tmp_path / "node0")
    assert ddir.parent == shm
    driver_dir.prepare(ddir)
    assert _mode(shm) == 0o700 and _mode(ddir) == 0o700


@pytest.mark.parametrize("how", ["other-owner", "world-writable"])
def test_a_pre_made_shm_root_not_ours_alone_is_refused(tmp_path, shm, how):
    shm.mkdir()
    if how == "other-owner":
        if os.geteuid() != 0:
            pytest.skip("making a directory owned by another user needs root")
        os.chown(shm, OTHER_UID, OTHER_UID)
    else:
        os.chmod(shm, 0o777)
    with pytest.raises(UnsafeDirectoryError) as info:
        driver_dir.prepare(driver_dir.default_driver_dir(tmp_path / "node0"))
    line = str(info.value)
    assert "\n" not in line and line.startswith(str(shm)) and "[driver] dir" in line
    assert not any(shm.iterdir())  # nothing made in it


def test_only_our_own_directories_are_tightened(tmp_path):
    from cluster_node.media.private_files import tighten_own_dir

    ours = tmp_path / "ours"
    ours.mkdir()
    os.chmod(ours, 0o755)
    tighten_own_dir(ours)
    assert _mode(ours) == 0o700
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chmod(theirs, 0o755)
        os.chown(theirs, OTHER_UID, OTHER_UID)
        tighten_own_dir(theirs)
        assert _mode(theirs) == 0o755
