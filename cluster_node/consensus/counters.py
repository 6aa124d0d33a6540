"""The consensus module's counter type ids and the codes its counters hold.

The numbers are the reference cluster's (ConsensusModule.State, ClusterControl.ToggleState and
the counter type ids of its AeronCluster counters), plus a few of our own; the operator's tools
(``cluster-node tool``, ``stat``, ``up``) read the same counters by these ids.
"""

from __future__ import annotations

from cluster_node.service.container import RECOVERY_STATE_TYPE_ID


class CounterTypes:
    """Counter type ids of the node's own counters (the reference cluster's numbers)."""

    CONSENSUS_MODULE_STATE = 200
    NODE_ROLE = 201
    COMMIT_POSITION = 203
    RECOVERY_STATE = RECOVERY_STATE_TYPE_ID  # 204
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
    # Ours (the reference keeps these in its mark file or in its tools, not as counters):
    LEADER_MEMBER_ID = 1201
    LAST_SNAPSHOT_DURATION = 1202
    PEER_APPEND_POSITION = 1203
    """One per member, keyed by that member's id: the append position it last reported to this
    node while this node leads (-1 when it does not lead), so a lagging follower shows on the
    leader."""
    SNAPSHOT_TRANSFERS = 1204
    """1 when this start copied its snapshot set from another member (an empty directory), else 0."""


class ModuleState:
    """ConsensusModule.State codes (counter type 200)."""

    INIT, ACTIVE, SUSPENDED, SNAPSHOT, QUITTING, TERMINATING, CLOSED = range(7)


class ToggleState:
    """ClusterControl.ToggleState codes (counter type 202): an operator sets one, the leader acts
    on it and puts NEUTRAL back."""

    INACTIVE, NEUTRAL, SUSPEND, RESUME, SNAPSHOT, SHUTDOWN, ABORT, STANDBY_SNAPSHOT = range(8)
