"""The channels a backup and a seeding member use to reach the cluster's members, in one place.

Every channel to or from a member that the backup machinery opens is built here, so that a
parameter every member channel must carry is added once.
"""

from __future__ import annotations

__all__ = ["consensus_channel", "archive_control_channel", "response_channel", "replay_channel"]


def consensus_channel(endpoint: str, term_length: int) -> str:
    """A publication to a member's consensus endpoint (BackupQuery goes there)."""
    return f"aeron:udp?endpoint={endpoint}|term-length={term_length}"


def archive_control_channel(endpoint: str) -> str:
    """A member's archive control channel (replication and replays are asked there)."""
    return f"aeron:udp?endpoint={endpoint}"


def response_channel(endpoint: str) -> str:
    """Where a member sends its BackupResponse: our own endpoint, nothing else (a member
    refuses a response channel with any other parameter)."""
    return f"aeron:udp?endpoint={endpoint}"


def replay_channel(endpoint: str) -> str:
    """Where a member's archive sends the live log replay a backup records."""
    return f"aeron:udp?endpoint={endpoint}"
