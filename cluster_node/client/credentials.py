"""Credentials suppliers: what a client sends in its connect request and how it answers a challenge.

The reference's ``CredentialsSupplier``: ``encoded_credentials() -> bytes`` and
``on_challenge(encoded_challenge) -> bytes``. An application may pass any object with those two
methods; these are the ones the project ships (none, fixed bytes, and the shared-secret one the
cluster's authenticator checks).
"""

from __future__ import annotations

from cluster_node.client.errors import AuthenticationError

__all__ = ["NullCredentialsSupplier", "SharedSecretCredentials", "FixedCredentials"]


class NullCredentialsSupplier:
    """No credentials: what a cluster with the null authenticator expects."""

    def encoded_credentials(self) -> bytes:
        return b""

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        raise AuthenticationError(
            "the cluster asked for an authentication challenge and this client has no"
            " credentials (give it a credentials file)"
        )


class SharedSecretCredentials:
    """The client's side of the shared-secret authenticator: its id as the credentials, and
    HMAC-SHA256(key, challenge || id) as the answer (``consensus.auth.challenge_answer``)."""

    def __init__(self, client_id: bytes, key: bytes) -> None:
        self.client_id = bytes(client_id)
        self._key = bytes(key)

    @classmethod
    def from_file(cls, path) -> SharedSecretCredentials:
        """From a credentials file of one ``client-id hexkey`` line (``cluster_node.auth``);
        raises ``secret_file.SecretFileError`` (one line) when it cannot be used."""
        from cluster_node.auth import read_client_credentials

        return cls(*read_client_credentials(path))

    def encoded_credentials(self) -> bytes:
        return self.client_id

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        from cluster_node.consensus.auth import challenge_answer

        return challenge_answer(self._key, bytes(encoded_challenge), self.client_id)

    def __repr__(self) -> str:
        return f"SharedSecretCredentials({self.client_id!r})"  # never the key


class FixedCredentials:
    """``encoded_credentials=`` bytes given without a supplier: sent as they are; a challenge
    cannot be answered."""

    def __init__(self, credentials: bytes) -> None:
        self._credentials = credentials

    def encoded_credentials(self) -> bytes:
        return self._credentials

    def on_challenge(self, encoded_challenge: bytes) -> bytes:
        return NullCredentialsSupplier().on_challenge(encoded_challenge)
