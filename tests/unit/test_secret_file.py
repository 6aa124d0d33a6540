"""Key files: generated 0600 and never overwritten; refused when others can read them, when they
are not hex or too short; the CLI says why in one line."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from cluster_node.cli import main
from cluster_node.secret_file import KEY_BYTES, SecretFileError, generate, read_key


def test_generate_then_read(tmp_path):
    path = tmp_path / "member.key"
    key = generate(path)
    assert len(key) == KEY_BYTES
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_key(path) == key
    with pytest.raises(SecretFileError, match="already exists"):
        generate(path)
    assert read_key(path) == key


def test_a_key_others_can_read_is_refused(tmp_path):
    path = tmp_path / "k"
    generate(path)
    os.chmod(path, 0o644)
    with pytest.raises(SecretFileError, match="chmod 600"):
        read_key(path)


@pytest.mark.parametrize(
    "text,match",
    [
        ("zz\n", "not hexadecimal"),
        ("00" * 8 + "\n", "at least 16"),
        ("", "found 0 lines"),
        ("aa" * 16 + "\n" + "bb" * 16 + "\n", "found 2 lines"),
    ],
)
def test_bad_contents_are_refused(tmp_path, text, match):
    path = tmp_path / "k"
    path.write_text(text)
    os.chmod(path, 0o600)
    with pytest.raises(SecretFileError, match=match):
        read_key(path)


def test_comments_are_allowed(tmp_path):
    path = tmp_path / "k"
    path.write_text("# rotated 2026-01\n\n" + "ab" * 32 + "\n")
    os.chmod(path, 0o600)
    assert read_key(path) == bytes.fromhex("ab" * 32)


def test_missing_file_names_the_command(tmp_path):
    with pytest.raises(SecretFileError, match="cluster-node secret generate"):
        read_key(tmp_path / "nope")


def test_cli_generate(tmp_path):
    path = tmp_path / "k"
    r = CliRunner().invoke(main, ["secret", "generate", str(path)])
    assert r.exit_code == 0, r.output
    assert len(read_key(path)) == KEY_BYTES
    r = CliRunner().invoke(main, ["secret", "generate", str(path)])
    assert r.exit_code == 1
    assert "already exists" in r.output and "Traceback" not in r.output
