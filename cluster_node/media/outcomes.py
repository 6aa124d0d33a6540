"""What an offer returns and how a fragment handler ends a poll: values of the client API that need no log buffer (core)

They live apart from the publication and the subscription (which map log buffers and wake trio
tasks) so that a sans-I/O core, the clustered service's agent, can name them without importing
either.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["OfferResult", "StopPolling"]


class OfferResult(IntEnum):
    """Why an offer did not append (all negative, as in the reference client)."""

    NOT_CONNECTED = -1
    BACK_PRESSURED = -2
    ADMIN_ACTION = -3
    CLOSED = -4
    MAX_POSITION_EXCEEDED = -5


class StopPolling(Exception):
    """Raised by a fragment handler to end :meth:`Image.bounded_poll` after the fragment it was
    given (which counts as consumed): the reader must act before it sees anything later, as a
    clustered service taking a snapshot at the entry that asks for one."""
