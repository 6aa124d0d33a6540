"""Cluster members as one member sees them, and the quorum maths (core)

Every member keeps a ``ClusterMember`` for each member of the static cluster, itself included.
What it holds about the others is its own, possibly stale, view: the log they last reported
(``log_leadership_term_id``, ``log_position``), their vote in the current ballot and when they last
reported an append position.

Member configuration string (reference ``ClusterMember.parse``)::

    id,ingress,consensus,log,catchup,archive|id,ingress,consensus,log,catchup,archive|...

Quorum rules
============
* ``quorum_threshold(n) = n // 2 + 1``.
* ``quorum_position``: the highest position a quorum holds, counting only members whose last
  report is *in the given leadership term*. A follower reports its log's last term with its
  position; a position held under an older term is not counted, because a member only adopts a
  term (writes its TERM entry) once its log up to the term's base is the leader's log. Counting
  older-term positions would let a leader commit old-term entries that a later election could
  still discard (Raft's "commit only by counting current-term replicas" rule).
* ``compare_log``: the log leadership term decides first, the position second.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "NULL_VALUE",
    "NULL_POSITION",
    "ClusterMember",
    "MemberConfigError",
    "parse_members",
    "members_text",
    "quorum_threshold",
    "quorum_position",
    "compare_log",
    "is_unanimous_candidate",
    "is_quorum_candidate",
    "is_unanimous_leader",
    "is_quorum_leader",
    "has_active_quorum",
    "has_quorum_at_position",
    "have_voters_reached_position",
    "reset_log_positions",
    "reset_votes",
]

NULL_VALUE = -1
NULL_POSITION = -1


class MemberConfigError(ValueError):
    """A cluster member string that cannot be parsed (one line, for the operator)."""


class ClusterMember:
    """One member of the cluster: its endpoints and this member's view of its state."""

    __slots__ = (
        "member_id",
        "ingress_endpoint",
        "consensus_endpoint",
        "log_endpoint",
        "catchup_endpoint",
        "archive_endpoint",
        "log_leadership_term_id",
        "log_position",
        "leadership_term_id",
        "candidate_term_id",
        "vote",
        "time_of_last_append_position_ns",
        "catchup_replay_from_position",
        "catchup_reported",
    )

    def __init__(
        self,
        member_id: int,
        ingress_endpoint: str = "",
        consensus_endpoint: str = "",
        log_endpoint: str = "",
        catchup_endpoint: str = "",
        archive_endpoint: str = "",
    ) -> None:
        self.member_id = member_id
        self.ingress_endpoint = ingress_endpoint
        self.consensus_endpoint = consensus_endpoint
        self.log_endpoint = log_endpoint
        self.catchup_endpoint = catchup_endpoint
        self.archive_endpoint = archive_endpoint
        self.log_leadership_term_id = NULL_VALUE
        """Term of the last entry of the member's log, as last reported."""
        self.log_position = NULL_POSITION
        """The member's appended (recorded) position as last reported; NULL = no report yet."""
        self.leadership_term_id = NULL_VALUE
        """The newest leadership (or candidate) term the member said it has seen (canvass)."""
        self.candidate_term_id = NULL_VALUE
        """The candidate term of the member's vote in ``vote``."""
        self.vote: bool | None = None
        self.time_of_last_append_position_ns = NULL_VALUE
        self.catchup_replay_from_position = NULL_POSITION
        """Leader: the position a catchup replay to this member runs from, NULL when none runs."""
        self.catchup_reported = False

    def __repr__(self) -> str:
        return (
            f"ClusterMember(id={self.member_id}, log=({self.log_leadership_term_id}, "
            f"{self.log_position}), vote={self.vote})"
        )

    def endpoints_text(self) -> str:
        return ",".join(
            (
                str(self.member_id),
                self.ingress_endpoint,
                self.consensus_endpoint,
                self.log_endpoint,
                self.catchup_endpoint,
                self.archive_endpoint,
            )
        )


def parse_members(text: str) -> list[ClusterMember]:
    """Parse ``id,ingress,consensus,log,catchup,archive|...``; ids must be unique."""
    members: list[ClusterMember] = []
    seen: set[int] = set()
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        fields = part.split(",")
        if len(fields) < 6:
            raise MemberConfigError(f"cluster member {part!r} needs id,ingress,consensus,log,catchup,archive")
        try:
            member_id = int(fields[0])
        except ValueError:
            raise MemberConfigError(f"cluster member id {fields[0]!r} is not an integer") from None
        if member_id < 0 or member_id in seen:
            raise MemberConfigError(f"cluster member id {member_id} is negative or repeated")
        seen.add(member_id)
        members.append(ClusterMember(member_id, *fields[1:6]))
    if not members:
        raise MemberConfigError("no cluster members given")
    return members


def members_text(members: Sequence[ClusterMember]) -> str:
    return "|".join(m.endpoints_text() for m in members)


def quorum_threshold(member_count: int) -> int:
    return member_count // 2 + 1


def quorum_position(members: Sequence[ClusterMember], leadership_term_id: int) -> int:
    """Highest position held by a quorum of members whose reported log term is
    ``leadership_term_id``; NULL_POSITION when no quorum has reported in that term."""
    positions = sorted(
        (m.log_position if m.log_leadership_term_id == leadership_term_id else NULL_POSITION) for m in members
    )
    return positions[len(positions) - quorum_threshold(len(positions))]


def compare_log(term_a: int, position_a: int, term_b: int, position_b: int) -> int:
    """>0 when log a is more recent than log b: the log's term first, then its position."""
    if term_a != term_b:
        return 1 if term_a > term_b else -1
    if position_a != position_b:
        return 1 if position_a > position_b else -1
    return 0


def is_unanimous_candidate(
    members: Sequence[ClusterMember], candidate: ClusterMember, graceful_closed_leader_id: int
) -> bool:
    """Every member (but a leader that closed gracefully) has reported, none has a newer log than
    the candidate, and at least a quorum of members counted."""
    count = 0
    for m in members:
        if m.member_id == graceful_closed_leader_id:
            continue
        if m.log_position == NULL_POSITION:
            return False
        if (
            compare_log(
                candidate.log_leadership_term_id,
                candidate.log_position,
                m.log_leadership_term_id,
                m.log_position,
            )
            < 0
        ):
            return False
        count += 1
    return count >= quorum_threshold(len(members))


def is_quorum_candidate(members: Sequence[ClusterMember], candidate: ClusterMember) -> bool:
    """At least a quorum of members have reported a log no newer than the candidate's."""
    count = 0
    for m in members:
        if m.log_position == NULL_POSITION:
            continue
        if (
            compare_log(
                candidate.log_leadership_term_id,
                candidate.log_position,
                m.log_leadership_term_id,
                m.log_position,
            )
            >= 0
        ):
            count += 1
    return count >= quorum_threshold(len(members))


def is_unanimous_leader(
    members: Sequence[ClusterMember], candidate_term_id: int, graceful_closed_leader_id: int
) -> bool:
    """Every member (but a gracefully closed leader) voted YES in ``candidate_term_id``."""
    count = 0
    for m in members:
        if m.member_id == graceful_closed_leader_id:
            continue
        if m.candidate_term_id != candidate_term_id or m.vote is not True:
            return False
        count += 1
    return count >= quorum_threshold(len(members))


def is_quorum_leader(members: Sequence[ClusterMember], candidate_term_id: int) -> bool:
    """At least a quorum voted YES in ``candidate_term_id``.

    The reference also requires that nobody voted NO; a competing candidate of the same term
    always votes NO, so with that rule near-simultaneous nominations kept failing each other's
    ballots round after round in simulation (five members, 60 ms delays). A NO vote does not
    affect safety (each member votes YES at most once per term), so it is not counted.
    """
    yes = 0
    for m in members:
        if m.candidate_term_id == candidate_term_id and m.vote is True:
            yes += 1
    return yes >= quorum_threshold(len(members))


def has_active_quorum(members: Sequence[ClusterMember], self_id: int, now_ns: int, timeout_ns: int) -> bool:
    """The leader (always active) plus others that reported within ``timeout_ns`` form a quorum."""
    active = 0
    for m in members:
        if m.member_id == self_id or (
            m.time_of_last_append_position_ns != NULL_VALUE and now_ns - m.time_of_last_append_position_ns <= timeout_ns
        ):
            active += 1
    return active >= quorum_threshold(len(members))


def has_quorum_at_position(members: Sequence[ClusterMember], leadership_term_id: int, position: int) -> bool:
    return quorum_position(members, leadership_term_id) >= position


def have_voters_reached_position(members: Sequence[ClusterMember], leadership_term_id: int, position: int) -> bool:
    """Every member that voted YES for this term (the candidate votes for itself) reports
    ``position`` or beyond in the term."""
    for m in members:
        if m.vote is True and m.candidate_term_id == leadership_term_id:
            if m.log_leadership_term_id != leadership_term_id or m.log_position < position:
                return False
    return True


def reset_log_positions(members: Sequence[ClusterMember]) -> None:
    for m in members:
        m.log_leadership_term_id = NULL_VALUE
        m.log_position = NULL_POSITION
        m.leadership_term_id = NULL_VALUE
        m.time_of_last_append_position_ns = NULL_VALUE


def reset_votes(members: Sequence[ClusterMember]) -> None:
    for m in members:
        m.vote = None
        m.candidate_term_id = NULL_VALUE
