"""The channels a backup and a seeding member use to reach the cluster's members, in one place.

Every channel to or from a member that the backup machinery opens is built here, so that a
parameter every member channel must carry is added once: ``auth=mac`` when the cluster has a
member key (``cluster.secret_file``; a backup holds the same key as the members). The response
channel a BackupQuery names carries none: a member answers only a plain ``endpoint=H:P``
(cluster_node.media.channel.reply_channel_refusal), so a BackupResponse is not authenticated; it names only
recordings the backup then copies from the configured members' archives, over MAC'd channels.
"""

from __future__ import annotations

__all__ = [
    "consensus_channel",
    "archive_control_channel",
    "archive_local_channel",
    "response_channel",
    "replay_channel",
]


def _auth(auth: bool) -> str:
    return "|auth=mac" if auth else ""


def consensus_channel(endpoint: str, term_length: int, auth: bool = False) -> str:
    """A publication to a member's consensus endpoint (BackupQuery goes there)."""
    return f"aeron:udp?endpoint={endpoint}|term-length={term_length}{_auth(auth)}"


def archive_control_channel(endpoint: str, auth: bool = False) -> str:
    """A member's archive control channel (replication and replays are asked there)."""
    return f"aeron:udp?endpoint={endpoint}{_auth(auth)}"


def archive_local_channel(endpoint: str, auth: bool = False) -> str:
    """One of our own archive's or archive client's endpoints that a member's archive sends to
    (control responses, replication, the live log replay)."""
    return f"aeron:udp?endpoint={endpoint}{_auth(auth)}"


def response_channel(endpoint: str) -> str:
    """Where a member sends its BackupResponse: our own endpoint, nothing else (a member
    refuses a response channel with any other parameter)."""
    return f"aeron:udp?endpoint={endpoint}"


def replay_channel(endpoint: str, auth: bool = False) -> str:
    """Where a member's archive sends the live log replay a backup records."""
    return f"aeron:udp?endpoint={endpoint}{_auth(auth)}"
