"""The numbers a node, its tools and its clients must agree on, in one place: counter type ids,
the consensus module's and the cluster control toggle's state codes, the node roles and the
stream ids of the cluster's channels.

They are the reference cluster's numbers (``ConsensusModule.Configuration``, ``ClusterControl``,
``Cluster.Role``), so a counters file reads the same to the reference's tools; the type ids from
1200 on are this project's own. A tool that reads another process's counters finds them by these
ids: change one and a running node and the tools of the new version no longer understand each
other.
"""

from __future__ import annotations

from cluster_node.consensus.effects import Role
from cluster_node.consensus.election import ElectionState

__all__ = [
    "CounterTypes",
    "ModuleState",
    "ToggleState",
    "Role",
    "ROLE_NAMES",
    "ElectionState",
    "StreamIds",
    "MODULE_STATE_NAMES",
    "ELECTION_STATE_NAMES",
    "code_name",
]


class CounterTypes:
    """Counter type ids of the node's own counters (the reference cluster's numbers)."""

    CONSENSUS_MODULE_STATE = 200
    NODE_ROLE = 201
    COMMIT_POSITION = 203
    RECOVERY_STATE = 204
    SNAPSHOT_COUNTER = 205
    ELECTION_STATE = 207
    LEADERSHIP_TERM_ID = 239
    APPEND_POSITION = 240
    ERRORS = 212
    CLUSTER_CONTROL = 202
    CLIENT_TIMEOUT_COUNT = 213
    MAX_CYCLE_TIME = 216
    CYCLE_TIME_THRESHOLD_EXCEEDED = 217
    TOTAL_MAX_SNAPSHOT_DURATION = 234
    ELECTION_COUNT = 238
    SERVICE_ERRORS = 215
    """A member's count of service callback errors (the reference's clustered service error count)."""
    # Ours (the reference keeps these in its mark file or in its tools, not as counters):
    LEADER_MEMBER_ID = 1201
    LAST_SNAPSHOT_DURATION = 1202
    PEER_APPEND_POSITION = 1203
    """One per member, keyed by that member's id: the append position it last reported to this
    node while this node leads (-1 when it does not lead), so a lagging follower shows on the
    leader."""
    SNAPSHOT_TRANSFERS = 1204
    LOG_PURGE_REQUEST = 1206
    """An operator's ``tool purge-log`` on the running leader (``consensus/log_retention.py``)."""
    """1 when this start copied its snapshot set from another member (an empty directory), else 0."""


class ModuleState:
    """ConsensusModule.State codes (counter type 200)."""

    INIT, ACTIVE, SUSPENDED, SNAPSHOT, QUITTING, TERMINATING, CLOSED = range(7)


MODULE_STATE_NAMES = {
    ModuleState.INIT: "INIT",
    ModuleState.ACTIVE: "ACTIVE",
    ModuleState.SUSPENDED: "SUSPENDED",
    ModuleState.SNAPSHOT: "SNAPSHOT",
    ModuleState.QUITTING: "QUITTING",
    ModuleState.TERMINATING: "TERMINATING",
    ModuleState.CLOSED: "CLOSED",
}


class ToggleState:
    """ClusterControl.ToggleState codes (counter type 202): an operator sets one, the leader acts
    on it and puts NEUTRAL back."""

    INACTIVE, NEUTRAL, SUSPEND, RESUME, SNAPSHOT, SHUTDOWN, ABORT, STANDBY_SNAPSHOT = range(8)


ROLE_NAMES = {role.value: role.name for role in Role}
"""Role code (counter type 201) -> the reference's name, upper case (``LEADER``); a view that
shows roles in lower case lowers these."""


def code_name(names: dict[int, str], code: int | None, missing: str = "?", unknown: str = "UNKNOWN({})") -> str:
    """The name of a counter's code (a role, a state); ``missing`` when there is no counter and
    ``unknown`` (formatted with the code) for a code of a newer version."""
    if code is None:
        return missing
    return names.get(code, unknown.format(code))


ELECTION_STATE_NAMES = {state.value: state.name for state in ElectionState}


class StreamIds:
    """The default stream ids of the cluster's channels (the reference's); a node's config may
    set others (``[cluster]`` ``*_stream_id``), so a reader of a node's files takes its config's
    when it has one."""

    LOG = 100
    INGRESS = 101
    EGRESS = 102
    REPLAY = 103
    CONSENSUS_TO_SERVICE = 104
    SERVICE_TO_CONSENSUS = 105
    SERVICE_SNAPSHOT = 106
    CONSENSUS_MODULE_SNAPSHOT = 107
    CONSENSUS = 108
