"""The [auth] config, the credentials files and the loading of authenticators
(cluster_node.auth, cluster_node.config.AuthSection)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from cluster_node.auth import (
    AuthLoadError,
    load_authenticator,
    load_authorisation,
    read_client_credentials,
    read_credentials,
)
from cluster_node.client import SharedSecretCredentials
from cluster_node.config import (
    AuthSection,
    ConfigError,
    generate_loopback_cluster,
    node_config_to_toml,
    parse_node_config,
)
from cluster_node.consensus.auth import (
    AllowListAuthorisation,
    NullAuthenticator,
    SharedSecretAuthenticator,
    challenge_answer,
)
from cluster_node.secret_file import SecretFileError

KEY_A = "11" * 32
KEY_B = "22" * 16


def private(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_a_credentials_file_maps_client_ids_to_keys(tmp_path):
    f = private(tmp_path / "keys", f"# clients\n\nalice {KEY_A}\n  bob\t{KEY_B}  \n")
    assert read_credentials(f) == {b"alice": bytes.fromhex(KEY_A), b"bob": bytes.fromhex(KEY_B)}


@pytest.mark.parametrize(
    "text,error",
    [
        (f"alice {KEY_A} extra\n", "line 1: expected `client-id hexkey`, found 3 fields"),
        ("alice zz\n", "line 1: the key is not hexadecimal"),
        ("alice 0011\n", "the key has 2 bytes, at least 16"),
        (f"{'x' * 129} {KEY_A}\n", "a client id is 1 to 128 letters"),
        (f"a/b {KEY_A}\n", "a client id is 1 to 128 letters"),
        (f"alice {KEY_A}\nalice {KEY_B}\n", "line 2: client alice appears twice"),
        ("# nothing\n", "no `client-id hexkey` line"),
    ],
)
def test_a_bad_credentials_file_is_one_line_naming_the_file(tmp_path, text, error):
    f = private(tmp_path / "keys", text)
    with pytest.raises(SecretFileError) as e:
        read_credentials(f)
    assert str(e.value).startswith(f"{f}: ") and error in str(e.value) and "\n" not in str(e.value)


def test_a_credentials_file_others_can_read_is_refused(tmp_path):
    f = private(tmp_path / "keys", f"alice {KEY_A}\n", mode=0o644)
    with pytest.raises(SecretFileError, match="lets others read it"):
        read_credentials(f)


def test_a_client_file_has_one_line_and_answers_as_the_cluster_expects(tmp_path):
    f = private(tmp_path / "alice.cred", f"alice {KEY_A}\n")
    assert read_client_credentials(f) == (b"alice", bytes.fromhex(KEY_A))
    creds = SharedSecretCredentials.from_file(f)
    assert creds.encoded_credentials() == b"alice" and KEY_A not in repr(creds)
    assert creds.on_challenge(b"n" * 32) == challenge_answer(bytes.fromhex(KEY_A), b"n" * 32, b"alice")
    two = private(tmp_path / "two.cred", f"alice {KEY_A}\nbob {KEY_B}\n")
    with pytest.raises(SecretFileError, match="one `client-id hexkey` line, not 2"):
        read_client_credentials(two)


def test_the_null_authenticator_is_the_default_and_warns(tmp_path):
    with capture_logs() as logs:
        authenticator = load_authenticator(AuthSection())
    assert isinstance(authenticator, NullAuthenticator)
    assert any(e["log_level"] == "warning" and "authentication is off" in e["event"] for e in logs)
    service = load_authorisation(AuthSection())
    assert isinstance(service, AllowListAuthorisation) and not service.is_authorised(111, 26, 0, b"")


def test_the_shared_secret_authenticator_reads_its_file(tmp_path):
    f = private(tmp_path / "keys", f"alice {KEY_A}\n")
    a = load_authenticator(
        AuthSection(authenticator="shared-secret", credentials_file=str(f), challenge_timeout_ns=3_000_000_000)
    )
    assert isinstance(a, SharedSecretAuthenticator)
    assert a.keys == {b"alice": bytes.fromhex(KEY_A)} and a.challenge_timeout_ms == 3000
    assert len(a.random_bytes(32)) == 32 and a.random_bytes(32) != a.random_bytes(32)
    allow = load_authorisation(AuthSection(admin_principals=("alice",)))
    assert allow.is_authorised(111, 26, 0, b"alice") and not allow.is_authorised(111, 26, 0, b"bob")


class PluginAuthenticator(NullAuthenticator):
    def __init__(self, section: AuthSection) -> None:
        self.section = section


def test_a_plugin_is_built_with_the_auth_section_and_bad_names_are_one_line():
    section = AuthSection(authenticator=f"{__name__}:PluginAuthenticator")
    assert load_authenticator(section).section is section
    for name, error in [
        ("nomodule_x:Y", "cannot import nomodule_x"),
        (f"{__name__}:Nope", "has no Nope"),
        ("plain", "use a built-in name or package.module:ClassName"),
        (f"{__name__}:KEY_A", "failed"),
    ]:
        with pytest.raises(AuthLoadError, match=error):
            load_authenticator(AuthSection(authenticator=name))


def test_the_auth_section_is_validated_and_written_back(tmp_path):
    configs, _ = generate_loopback_cluster(
        1,
        tmp_path,
        auth=AuthSection(
            authenticator="shared-secret", credentials_file="/etc/keys", admin_principals=("alice", "ops@x")
        ),
    )
    text = node_config_to_toml(configs[0])
    assert parse_node_config(text).auth == configs[0].auth
    base = text.split("[auth]")[0]
    with pytest.raises(ConfigError, match="auth.credentials_file: the shared-secret authenticator needs"):
        parse_node_config(base + '[auth]\nauthenticator = "shared-secret"\n')
    with pytest.raises(ConfigError, match="auth.admin_principals: an empty principal"):
        parse_node_config(base + '[auth]\nadmin_principals = [""]\n')
    with pytest.raises(ConfigError, match="auth.authenticatr: unknown key"):
        parse_node_config(base + '[auth]\nauthenticatr = "null"\n')
