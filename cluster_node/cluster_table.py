"""What ``cluster-node up`` draws: the members' table, the leader it reads off the counters, and the
full-screen view redrawn in place on a terminal."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cluster_node.identifiers import Role
from cluster_node.local_cluster import Member, Supervisor, exit_text
from cluster_node.member_view import CLOSED_ELECTION_STATE, LEADER_ROLE, ROLE_NAMES, election_state_name
from cluster_node.text_table import format_table

__all__ = ["render_table", "member_row", "member_lag", "leader_of", "Screen", "screen_lines"]

_HEADINGS = ("MEMBER", "PID", "ALIVE", "ROLE", "TERM", "ELECTION", "ELECTIONS", "COMMIT", "APPEND", "LAG", "ERRORS")


def _num(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def member_lag(m: Member, leader: Member | None) -> int | None:
    """How far ``m``'s append position, as the running leader last heard it, is behind the
    leader's own (None without a running leader, or when it has not heard from ``m``)."""
    if leader is None or leader.running_pid is None:
        return None
    position = leader.view.get(f"peer{m.member_id}")
    append = leader.view.get("append")
    if position is None or position < 0 or append is None:
        return None
    return max(0, append - position)


def member_row(m: Member, leader: Member | None = None) -> tuple[str, ...]:
    v = m.view
    running = m.running_pid is not None
    role = v.get("role")
    role_text = ROLE_NAMES.get(role, str(role)) if running and role is not None else "-"
    if role == LEADER_ROLE and running:
        role_text = Role.LEADER.name
    down_note = ""
    if not running and m.exit_code is not None:
        down_note = f" ({exit_text(m.exit_code)})"
    pid = m.running_pid or m.pid
    return (
        str(m.member_id),
        str(pid) if pid is not None else "-",
        m.alive_text + down_note,
        role_text,
        _num(v.get("term")) if (v.get("term") or 0) >= 0 else "-",
        election_state_name(v.get("state")) if running else "-",
        _num(v.get("elections")),
        _num(v.get("commit")),
        _num(v.get("append")),
        _num(member_lag(m, leader)),
        _num(v.get("errors")),
    )


def render_table(members: list[Member]) -> list[str]:
    leading = [
        m
        for m in members
        if m.running_pid is not None
        and m.view.get("role") == LEADER_ROLE
        and m.view.get("state") == CLOSED_ELECTION_STATE
    ]
    leader = leading[0] if len(leading) == 1 else None
    return format_table([_HEADINGS, *(member_row(m, leader) for m in members)], right={0, 1, 4, 6, 7, 8, 9, 10})


def leader_of(members: list[Member]) -> tuple[int, int] | None:
    """``(member_id, term)`` when one running member leads with its election closed and a
    majority of the members are in that term with their election closed (a client can then
    connect and commit); else None."""
    leaders = []
    for m in members:
        v = m.view
        if m.running_pid is not None and v.get("role") == LEADER_ROLE and v.get("state") == CLOSED_ELECTION_STATE:
            leaders.append((m.member_id, v.get("term")))
    if len(leaders) != 1:
        return None
    leader_id, term = leaders[0]
    settled = sum(
        1
        for m in members
        if m.running_pid is not None and m.view.get("term") == term and m.view.get("state") == CLOSED_ELECTION_STATE
    )
    return (leader_id, term) if settled * 2 > len(members) else None


class Screen:
    """Redraws the table in place on a terminal (cursor home, each line cleared to its end)."""

    def __init__(self) -> None:
        self.drawn = False

    def draw(self, lines: list[str]) -> None:
        out = ["\x1b[H\x1b[2J" if not self.drawn else "\x1b[H"]
        out += [line + "\x1b[K\n" for line in lines]
        out.append("\x1b[J")
        sys.stdout.write("".join(out))
        sys.stdout.flush()
        self.drawn = True


def screen_lines(
    header: str,
    members: list[Member],
    sup: Supervisor,
    client_path: Path | None,
    leader: tuple[int, int] | None,
    stopping: bool = False,
) -> list[str]:
    now = time.strftime("%H:%M:%S")
    lead = f"leader: member {leader[0]}, term {leader[1]}" if leader else "leader: none"
    lines = [f"{header}    {now}", lead, ""]
    lines += render_table(members)
    lines.append("")
    lines += sup.events
    lines.append("")
    if stopping:
        lines.append("stopping the members (SIGTERM; Ctrl-C again to kill at once) ...")
    else:
        if client_path is not None:
            lines.append(f"client:  cluster-node client --config {client_path} put k v | get k")
        down = [m for m in members if m.running_pid is None and m.proc is not None]
        if down:
            lines.append(f"restart: cluster-node run --config {down[0].config_path}")
        lines.append("Ctrl-C stops the cluster.")
    return lines
