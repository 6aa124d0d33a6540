"""A member's cluster counters as ``cluster-node up`` shows them: read from the counters file its
driver publishes (``counters.dat`` in its driver directory), never by talking to the member.

The counter ids are found by label once and kept while the file's owner and start time stay the
same, since a scan of every slot is the costly part of a read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster_node.identifiers import ELECTION_STATE_NAMES, CounterTypes, ElectionState, Role, code_name
from cluster_node.identifiers import ROLE_NAMES as REFERENCE_ROLE_NAMES

__all__ = [
    "MemberView",
    "CounterIds",
    "read_member_view",
    "election_state_name",
    "ROLE_NAMES",
    "LEADER_ROLE",
    "CLOSED_ELECTION_STATE",
]

ROLE_NAMES = {code: name.lower() for code, name in REFERENCE_ROLE_NAMES.items()}
"""Role names as ``up`` shows them: lower case, but for a running leader (``LEADER``)."""
LEADER_ROLE = Role.LEADER
CLOSED_ELECTION_STATE = ElectionState.CLOSED


def _counter_types() -> dict[str, int]:
    """The consensus agent's counter type ids, by the names the table uses."""
    return {
        "role": CounterTypes.NODE_ROLE,
        "commit": CounterTypes.COMMIT_POSITION,
        "state": CounterTypes.ELECTION_STATE,
        "term": CounterTypes.LEADERSHIP_TERM_ID,
        "append": CounterTypes.APPEND_POSITION,
        "errors": CounterTypes.ERRORS,
        "elections": CounterTypes.ELECTION_COUNT,
        "peer": CounterTypes.PEER_APPEND_POSITION,
    }


def election_state_name(code: int | None) -> str:
    return code_name(ELECTION_STATE_NAMES, code, missing="-", unknown="{}")


@dataclass(frozen=True)
class MemberView:
    """What the counters file of one member says, at one moment."""

    owner_pid: int | None = None
    owner_alive: bool = False
    values: dict[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int | None:
        return self.values.get(name)


class CounterIds:
    """Counter ids found by label, kept while the file's owner and start time stay the same
    (a scan of every slot is the costly part of a read; a restarted driver writes a new file)."""

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.ids: dict[str, int] = {}


def read_member_view(counters_path: Path, member_id: int, cache: CounterIds | None = None) -> MemberView:
    """The member's cluster counters from its driver's counters file (a missing or unreadable
    file gives an empty view: the member has not started yet, or its directory is gone)."""
    from cluster_node.media.counters import CountersError, CountersReader

    try:
        reader = CountersReader.open(counters_path)
    except (CountersError, OSError, ValueError):
        return MemberView()
    with reader:
        key = (reader.owner_pid, reader.start_timestamp_ms)
        if cache is None or cache.key != key or not cache.ids:
            types = _counter_types()
            by_type = {type_id: name for name, type_id in types.items()}
            ids: dict[str, int] = {}
            suffix = f": member {member_id}"
            for info in reader.counters():
                name = by_type.get(info.type_id)
                if name is not None and info.label.startswith("cluster ") and info.label.endswith(suffix):
                    if name == "peer":  # one per member, keyed by its id: "peer<id>"
                        name = f"peer{info.registration_id}"
                    ids[name] = info.counter_id
            if cache is not None:
                cache.key, cache.ids = key, ids
        else:
            ids = cache.ids
        values: dict[str, int] = {}
        for name, counter_id in ids.items():
            try:
                values[name] = reader.get(counter_id)
            except CountersError:
                if cache is not None:
                    cache.ids = {}  # freed or reused: scan again next time
        return MemberView(reader.owner_pid, reader.owner_alive(), values)
