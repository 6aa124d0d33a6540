"""The schema's constants, protocol versions and enums (core)

Values follow the reference schema (``aeron-cluster-codecs.xml``, schema id 111). They sit apart
from the message classes because the hot paths (the binary session header, the log and ingress
adapters) need only these numbers, and the message layouts need them too.
"""

from __future__ import annotations

import enum


class CodecError(ValueError):
    """Bytes that are not a valid message of the expected stream, or a message that cannot be sent.

    The only exception the decoders raise for bad input: the network adapters count, log and drop
    on it, never crash.
    """


# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

SCHEMA_ID = 111
"""The reference schema id; also written into every binary session header as a sanity check."""
SCHEMA_VERSION = 12

NULL_VALUE = -1
"""The reference's null for ids, term ids and member ids (``Aeron.NULL_VALUE``)."""
NULL_POSITION = -1

SESSION_MESSAGE_TEMPLATE_ID = 1
SESSION_HEADER_LENGTH = 32

MAX_MESSAGE_LENGTH = 16 * 1024 * 1024
"""Largest session message (header + payload): the reference's absolute message-length cap."""
MAX_PAYLOAD_LENGTH = MAX_MESSAGE_LENGTH - SESSION_HEADER_LENGTH
MAX_CONTROL_MESSAGE_LENGTH = 256 * 1024
"""Largest msgpack-encoded (non session) message accepted by a decoder or produced by an encoder."""
MAX_TEXT_LENGTH = 4096
"""Channels, endpoints, detail and error text: characters."""
MAX_MEMBERS_TEXT_LENGTH = 16384
"""Cluster member strings (``id,ingress,consensus,log,catchup,archive|...``): characters."""
MAX_BLOB_LENGTH = 64 * 1024
"""Credentials, challenges, principals, admin payloads: bytes."""
MAX_MEMBERS = 64
"""Entries in a ClusterMembersExtendedResponse member list."""
MAX_ERROR_PAYLOAD_PREFIX = 64
"""Bytes of the failed message that a ServiceErrorEvent carries back to its client."""

APPEND_POSITION_FLAG_NONE = 0
APPEND_POSITION_FLAG_CATCHUP = 1
CLUSTER_ACTION_FLAGS_DEFAULT = 0
CLUSTER_ACTION_FLAGS_STANDBY_SNAPSHOT = 1
SNAPSHOT_TYPE_ID_CONSENSUS_MODULE = 1
SNAPSHOT_TYPE_ID_SERVICE = 2

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


# --------------------------------------------------------------------------------------------
# Semantic versions: major << 16 | minor << 8 | patch in an int32, as the reference packs them
# --------------------------------------------------------------------------------------------


def compose_semantic_version(major: int, minor: int, patch: int) -> int:
    """Pack a version as the reference does (``SemanticVersion.compose``); each part is 0..255."""
    for part in (major, minor, patch):
        if not 0 <= part <= 255:
            raise ValueError(f"semantic version parts must be 0..255, got {major}.{minor}.{patch}")
    if major == minor == patch == 0:
        # 0 is the null value of version_t, so 0.0.0 cannot be expressed.
        raise ValueError("semantic version 0.0.0 is the null version")
    return (major << 16) | (minor << 8) | patch


def semantic_version_major(version: int) -> int:
    return (version >> 16) & 0xFF


def semantic_version_minor(version: int) -> int:
    return (version >> 8) & 0xFF


def semantic_version_patch(version: int) -> int:
    return version & 0xFF


def semantic_version_to_str(version: int) -> str:
    return f"{semantic_version_major(version)}.{semantic_version_minor(version)}.{semantic_version_patch(version)}"


CONSENSUS_PROTOCOL_VERSION = compose_semantic_version(1, 0, 0)
"""Sent in CanvassPosition and RequestVote (reference ``ConsensusModule.Configuration``)."""
CLIENT_PROTOCOL_VERSION = compose_semantic_version(0, 3, 0)
"""Sent in SessionConnectRequest and SessionEvent (reference ``AeronCluster.Configuration``)."""
CONSENSUS_PROTOCOL_MAJOR_VERSION = semantic_version_major(CONSENSUS_PROTOCOL_VERSION)
CLIENT_PROTOCOL_MAJOR_VERSION = semantic_version_major(CLIENT_PROTOCOL_VERSION)


# --------------------------------------------------------------------------------------------
# Enums (reference values)
# --------------------------------------------------------------------------------------------


class EventCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    REDIRECT = 2
    AUTHENTICATION_REJECTED = 3
    CLOSED = 4


class CloseReason(enum.IntEnum):
    CLIENT_ACTION = 0
    SERVICE_ACTION = 1
    TIMEOUT = 2


class ClusterAction(enum.IntEnum):
    SUSPEND = 0
    RESUME = 1
    SNAPSHOT = 2
    PURGE_LOG = 16
    """Beyond the reference (``cluster-node tool purge-log`` on a running cluster): every member
    reaching the entry removes its log before its N-th latest snapshot set (N in ``flags``)."""


class SnapshotMark(enum.IntEnum):
    BEGIN = 0
    SECTION = 1
    END = 2


class ClusterTimeUnit(enum.IntEnum):
    MILLIS = 0
    MICROS = 1
    NANOS = 2


class AdminRequestType(enum.IntEnum):
    SNAPSHOT = 0


class AdminResponseCode(enum.IntEnum):
    OK = 0
    ERROR = 1
    UNAUTHORISED_ACCESS = 2
