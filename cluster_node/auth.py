"""The node's authenticator and authorisation service, built from its ``[auth]`` config, and
the credential files of the shared-secret authenticator and its clients.

Credentials file format (``auth.credentials_file`` on the members, ``client.credentials_file``
or ``--credentials-file`` on a client)::

    # comment lines and blank lines are ignored
    alice  6f1c...e2   (client id, blanks, the key in hexadecimal)
    bob    0a9d...41

A client id is 1 to :data:`~cluster_node.consensus.auth.MAX_CLIENT_ID_BYTES` bytes of letters,
digits and ``._@-``; a key at least ``secret_file.MIN_KEY_BYTES`` bytes (``cluster-node secret
generate`` makes one). The members' file lists every client; a client's file is its own line
only. Either file must be this user's and readable by nobody else (``secret_file
.check_private_file``): a key others can read is no secret. Every problem is one line naming the
file (:class:`SecretFileError`).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path

import structlog

from cluster_node.config import AuthSection
from cluster_node.consensus.auth import (
    MAX_CLIENT_ID_BYTES,
    AllowListAuthorisation,
    Authenticator,
    AuthorisationService,
    NullAuthenticator,
    SharedSecretAuthenticator,
)
from cluster_node.plugins import find_class
from cluster_node.secret_file import MIN_KEY_BYTES, SecretFileError, check_private_file

__all__ = ["AuthLoadError", "load_authenticator", "load_authorisation", "read_credentials", "read_client_credentials"]

log = structlog.get_logger("auth")

_CLIENT_ID = re.compile(rf"^[A-Za-z0-9._@-]{{1,{MAX_CLIENT_ID_BYTES}}}$")


class AuthLoadError(ValueError):
    """``[auth]`` names nothing usable (one-line message)."""


def read_credentials(path: str | Path) -> dict[bytes, bytes]:
    """client id -> key, from a credentials file (see the module docstring)."""
    check_private_file(path)
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise SecretFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    keys: dict[bytes, bytes] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 2:
            raise SecretFileError(f"{path}: line {number}: expected `client-id hexkey`, found {len(fields)} fields")
        client_id, hex_key = fields
        if not _CLIENT_ID.match(client_id):
            raise SecretFileError(
                f"{path}: line {number}: a client id is 1 to {MAX_CLIENT_ID_BYTES} letters, digits or ._@-"
            )
        try:
            key = bytes.fromhex(hex_key)
        except ValueError:
            raise SecretFileError(f"{path}: line {number}: the key is not hexadecimal") from None
        if len(key) < MIN_KEY_BYTES:
            raise SecretFileError(
                f"{path}: line {number}: the key has {len(key)} bytes, at least {MIN_KEY_BYTES} are needed"
            )
        if client_id.encode() in keys:
            raise SecretFileError(f"{path}: line {number}: client {client_id} appears twice")
        keys[client_id.encode()] = key
    if not keys:
        raise SecretFileError(f"{path}: no `client-id hexkey` line")
    return keys


def read_client_credentials(path: str | Path) -> tuple[bytes, bytes]:
    """A client's (id, key): a credentials file of exactly one line."""
    keys = read_credentials(path)
    if len(keys) != 1:
        raise SecretFileError(f"{path}: a client's credentials file has one `client-id hexkey` line, not {len(keys)}")
    return next(iter(keys.items()))


def _plugin(spec: str, what: str, section: AuthSection):
    cls = find_class(spec, f"auth.{what} {spec!r}", "use a built-in name or package.module:ClassName", AuthLoadError)
    try:
        return cls(section)
    except Exception as ex:  # noqa: BLE001 - any failure of the operator's code becomes one line
        raise AuthLoadError(f"auth.{what} {spec!r}: {spec.partition(':')[2]}(auth section) failed: {ex}") from None


def load_authenticator(section: AuthSection) -> Authenticator:
    """The authenticator ``auth.authenticator`` names; raises AuthLoadError or SecretFileError."""
    name = section.authenticator
    if name == "null":
        log.warning(
            'client authentication is off (auth.authenticator = "null"): any client that reaches'
            " the ingress may open a session; see docs/security.md"
        )
        return NullAuthenticator()
    if name == "shared-secret":
        return SharedSecretAuthenticator(
            read_credentials(section.credentials_file), secrets.token_bytes, section.challenge_timeout_ns // 1_000_000
        )
    authenticator = _plugin(name, "authenticator", section)
    if not isinstance(authenticator, Authenticator):
        raise AuthLoadError(
            f"auth.authenticator {name!r}: not an Authenticator (on_connect_request,"
            " on_challenge_response, on_connected_session, on_challenged_session)"
        )
    return authenticator


def load_authorisation(section: AuthSection) -> AuthorisationService:
    """The authorisation service ``auth.authorisation_service`` names; raises AuthLoadError."""
    name = section.authorisation_service
    if name == "allow-list":
        return AllowListAuthorisation(frozenset(p.encode() for p in section.admin_principals))
    service = _plugin(name, "authorisation_service", section)
    if not isinstance(service, AuthorisationService):
        raise AuthLoadError(f"auth.authorisation_service {name!r}: not an AuthorisationService (is_authorised)")
    return service
