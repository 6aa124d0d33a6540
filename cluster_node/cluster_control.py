"""The cluster control client: steering a running cluster through its leader's ClusterControl
counter, as the reference's ClusterTool does (``cluster-node tool suspend|resume|snapshot|
shutdown|abort``).

The node must be the leader (role LEADER, election CLOSED) and its consensus module (state
counter, type 200) in the state the action needs (ACTIVE, or SUSPENDED for ``resume``). The
client then compare-and-sets the ClusterControl toggle (type 202) from NEUTRAL to the action;
the leader acts on it and puts NEUTRAL back::

    toggle  INACTIVE 0  NEUTRAL 1  SUSPEND 2  RESUME 3  SNAPSHOT 4  SHUTDOWN 5  ABORT 6
    state   INIT 0  ACTIVE 1  SUSPENDED 2  SNAPSHOT 3  QUITTING 4  TERMINATING 5  CLOSED 6

* suspend/resume: done when the toggle is NEUTRAL again and the state is SUSPENDED/ACTIVE.
  A suspended leader leaves client messages unread (they wait, and back-pressure the clients).
* snapshot: every member snapshots at the same log position. The leader releases the toggle
  when its own snapshot set is complete *or failed* (a failed service snapshot writes nothing),
  so success is judged by ``recording.log``: a consensus-module SNAPSHOT entry newer than the
  one seen before the request. (The snapshot-count counter, type 205, tells a SHUTDOWN that
  snapshots apart from a refused one.)
* shutdown/abort: the cluster snapshots (shutdown only) and every member stops at the same log
  position. The request is taken once the leader leaves ACTIVE, releases the toggle or exits;
  the client then waits for the node's process to exit and reports the end position the node
  committed to its last TERM entry (an orderly stop writes it).

The node's counters live in another process's file: there is no doorbell to wait on, so the
client polls. A refusal or a failure raises ``ToolRefusal`` with the one line to show.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cluster_node.consensus.election import ElectionState
from cluster_node.consensus.recording_log import Entry, RecordingLog
from cluster_node.identifiers import CounterTypes, ModuleState, ToggleState
from cluster_node.media.counters import CountersError, CountersReader
from cluster_node.node_inspect import (
    CM_STATE_NAMES,
    COUNTER_TYPES,
    NodeDir,
    ToolRefusal,
    election_state_name,
    is_newer_entry,
    latest_cm_snapshot,
    node_pid_alive,
    role_name,
    snapshot_services,
)

# ------------------------------------------------------------------------------ cluster control

TOGGLE_NEUTRAL, TOGGLE_SUSPEND, TOGGLE_RESUME = ToggleState.NEUTRAL, ToggleState.SUSPEND, ToggleState.RESUME
TOGGLE_SNAPSHOT, TOGGLE_SHUTDOWN, TOGGLE_ABORT = ToggleState.SNAPSHOT, ToggleState.SHUTDOWN, ToggleState.ABORT
STATE_ACTIVE, STATE_SUSPENDED, STATE_SNAPSHOT = ModuleState.ACTIVE, ModuleState.SUSPENDED, ModuleState.SNAPSHOT
STOPPABLE = (STATE_ACTIVE, STATE_SUSPENDED, STATE_SNAPSHOT)
"""States in which SHUTDOWN and ABORT are taken (a snapshot under way: ABORT abandons it,
SHUTDOWN waits for it)."""
_CONTROL_TYPE = CounterTypes.CLUSTER_CONTROL
_STATE_NAMES = CM_STATE_NAMES
_POLL_S = 0.02
_TOGGLE_TIMEOUT_S = 10.0
"""How long the leader may take to act on a toggle (it reads it every duty cycle)."""
SNAPSHOT_TIMEOUT_S = 30.0
TERMINATE_TIMEOUT_S = 60.0
_ENTRY_GRACE_S = 1.0
"""After the leader released a SNAPSHOT toggle: how long to look for the new recording.log entry
before calling the snapshot failed."""


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``predicate`` every 20 ms until it holds (True) or ``timeout_s`` has passed (False).
    The node's counters live in another process's file: there is no doorbell to wait on."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def require_leader(node: NodeDir, action: str, needs_state: int) -> None:
    """A running leader in ``needs_state``, or one line and exit 1 saying what is not so."""
    if not node.running:
        _refuse(f"no node runs in {node.path} (member {node.member_id}, {node.why_not_running}): cannot {action}")
    if not node.counters_current:
        _refuse(
            f"member {node.member_id} runs in {node.path} but its counters are not readable "
            f"({node.counters_note}): cannot {action}"
        )
    if not node.is_leader():
        what = role_name(node.counter("role"))
        election = node.counter("election_state")
        if election != ElectionState.CLOSED:
            what += f", election {election_state_name(election)}"
        _refuse(f"Current node is not the leader (member {node.member_id} is {what})")
    state = node.counter("cm_state")
    if state not in _states(needs_state):
        _refuse(_state_refusal(action, state, needs_state))


def _states(needs_state: int | tuple[int, ...]) -> tuple[int, ...]:
    return needs_state if isinstance(needs_state, tuple) else (needs_state,)


def _state_refusal(action: str, state: int, needs_state: int | tuple[int, ...]) -> str:
    wanted = " or ".join(_STATE_NAMES[s] for s in _states(needs_state))
    return (
        f"Unable to {action.upper()} as the state of the consensus module is "
        f"{_STATE_NAMES.get(state, state)}, but needs to be {wanted}"
    )


class LiveControl:
    """The running leader's counters a control command watches, mapped once: its ClusterControl
    toggle (writable, for the compare-and-set), its consensus module state and snapshot count."""

    def __init__(self, node: NodeDir) -> None:
        self.member_id = node.member_id
        try:
            self.reader = CountersReader.open(node.counters_path, writable=True)
        except CountersError as e:
            _refuse(f"cannot open the counters of member {node.member_id}: {e}")
        wanted = {
            _CONTROL_TYPE: "control",
            COUNTER_TYPES["cm_state"]: "cm_state",
            COUNTER_TYPES["snapshot_count"]: "snapshot_count",
        }
        self.ids: dict[str, int] = {}
        suffix = f"member {node.member_id}"
        for c in self.reader.counters():
            name = wanted.get(c.type_id)
            if name is not None and c.label.endswith(suffix):
                self.ids.setdefault(name, c.counter_id)
        if "control" not in self.ids:
            self.close()
            _refuse(f"member {node.member_id} has no cluster control counter (a node of an older version?)")

    def get(self, name: str) -> int | None:
        """The counter's value; None when the node has no such counter or freed it (stopping)."""
        counter_id = self.ids.get(name)
        if counter_id is None:
            return None
        try:
            return self.reader.get(counter_id)
        except CountersError:
            return None

    def request(self, toggle: int, action: str, needs_state: int | tuple[int, ...]) -> None:
        """Compare-and-set the toggle from NEUTRAL (the leader resets it only after acting),
        after checking the state once more on the live counter (it may have moved since the
        directory was read). SHUTDOWN and ABORT may also replace a SNAPSHOT request still in
        progress."""
        state = self.get("cm_state")
        if state not in _states(needs_state):
            self.close()
            _refuse(_state_refusal(action, state, needs_state))
        try:
            taken = self.reader.set_if(self.ids["control"], TOGGLE_NEUTRAL, toggle)
            if not taken and toggle in (TOGGLE_SHUTDOWN, TOGGLE_ABORT):
                taken = self.reader.set_if(self.ids["control"], TOGGLE_SNAPSHOT, toggle)
        except CountersError as e:
            _refuse(f"member {self.member_id}: cannot set the cluster control toggle: {e}")
        if not taken:
            _refuse(f"another cluster control request is in progress on member {self.member_id}; try again")

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> LiveControl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse(message: str) -> None:
    raise ToolRefusal(message)


def toggle(node: NodeDir, action: str, toggle: int, needs_state: int, done_state: int) -> str:
    """Set the leader's ClusterControl toggle and wait (up to 10 s) for it to act and put
    NEUTRAL back; applied when the consensus module is then in ``done_state``. The line to show."""
    require_leader(node, action, needs_state)
    pid = node.mark.pid
    with LiveControl(node) as live:
        live.request(toggle, action, needs_state)
        if not wait_until(lambda: live.get("control") == TOGGLE_NEUTRAL or not node_pid_alive(pid), _TOGGLE_TIMEOUT_S):
            _refuse(f"{action}: member {node.member_id} did not act within {_TOGGLE_TIMEOUT_S:g} s")
        if not node_pid_alive(pid):
            _refuse(f"{action}: member {node.member_id} (pid {pid}) stopped before acting on the request")
        after = live.get("cm_state")
    if after != done_state:
        _refuse(f"{action} was not applied: the consensus module is {_STATE_NAMES.get(after, after)}")
    return f"{action.upper()} applied successfully"


def snapshot_set_line(rl: RecordingLog, cm: Entry) -> str:
    parts = [f"consensus module recording {cm.recording_id}"]
    parts += [f"service {e.service_id} recording {e.recording_id}" for e in snapshot_services(rl, cm)]
    return f"snapshot at log position {cm.log_position}, leadership term {cm.leadership_term_id}: " + ", ".join(parts)


def take_snapshot(node: NodeDir, timeout_s: float) -> list[str]:
    """SNAPSHOT through the leader; the lines to show once the new set is in its recording.log."""
    require_leader(node, "snapshot", STATE_ACTIVE)
    pid, member = node.mark.pid, node.member_id
    _, before = latest_cm_snapshot(node.path)
    with LiveControl(node) as live:
        live.request(TOGGLE_SNAPSHOT, "snapshot", STATE_ACTIVE)
        released = wait_until(lambda: live.get("control") == TOGGLE_NEUTRAL or not node_pid_alive(pid), timeout_s)
    alive = node_pid_alive(pid)
    if not released:
        _refuse(
            f"snapshot: member {member} did not finish within {timeout_s:g} s (its control toggle is still SNAPSHOT)"
        )
    # The node writes the set to recording.log (and counts it) before it releases the toggle; the
    # grace only delays the verdict on a failed snapshot, in case a node releases first.
    found: list[tuple[RecordingLog | None, Entry | None]] = []

    def new_entry() -> bool:
        found[:] = [latest_cm_snapshot(node.path)]
        return is_newer_entry(found[0][1], before)

    if not wait_until(new_entry, _ENTRY_GRACE_S if alive else 0):
        if not alive:
            _refuse(f"snapshot failed: member {member} (pid {pid}) stopped before its snapshot completed")
        _refuse("snapshot failed: no new snapshot in recording.log (a service snapshot failed? see `tool errors`)")
    rl, cm = found[0]
    assert rl is not None and cm is not None
    return ["SNAPSHOT applied successfully", snapshot_set_line(rl, cm)]


def terminate(
    node: NodeDir, action: str, toggle: int, wait: bool, timeout_s: float, say: Callable[[str], None]
) -> None:
    """SHUTDOWN or ABORT through the leader, then (``wait``) until its process has exited;
    ``say`` shows each line as soon as it is known (the request taken, then how the node ended)."""
    require_leader(node, action, STOPPABLE)
    pid, member, name = node.mark.pid, node.member_id, action.upper()
    deadline = time.monotonic() + timeout_s
    _, before = latest_cm_snapshot(node.path)
    with LiveControl(node) as live:
        live.request(toggle, action, STOPPABLE)
        left_active = False

        def taken() -> bool:
            # The leader sets its new state before it releases the toggle (agent
            # _on_control_toggle), so the state read after seeing the release is its decision:
            # still ACTIVE or SUSPENDED means refused, anything else (or no counter: closing)
            # means taken.
            nonlocal left_active
            if not node_pid_alive(pid):
                return True
            if live.get("control") == toggle:
                return False
            left_active = live.get("cm_state") not in (STATE_ACTIVE, STATE_SUSPENDED)
            return True

        if not wait_until(taken, min(_TOGGLE_TIMEOUT_S, timeout_s)):
            _refuse(
                f"{action}: member {member} did not take the request within "
                f"{min(_TOGGLE_TIMEOUT_S, timeout_s):g} s (its control toggle is still {name})"
            )
        if not left_active and node_pid_alive(pid):
            stays = live.get("cm_state")
            _refuse(
                f"{name} was not applied: member {member} released the control toggle and stays "
                f"{_STATE_NAMES.get(stays, stays)} (see `tool errors`)"
            )
    say(f"{name} applied successfully")
    if not wait:
        return
    if not wait_until(lambda: not node_pid_alive(pid), max(0.0, deadline - time.monotonic())):
        _refuse(f"member {member} (pid {pid}) is still running {timeout_s:g} s after the {action} request")
    rl, cm = latest_cm_snapshot(node.path)
    last = None if rl is None else rl.last_term()
    if last is not None and last.log_position >= 0:
        say(f"member {member} stopped at log position {last.log_position} (leadership term {last.leadership_term_id})")
    else:
        say(
            f"member {member} stopped (pid {pid} exited); recording.log holds no end position for its "
            f"last term (not an orderly stop?)"
        )
    if action == "shutdown":
        if rl is not None and cm is not None and is_newer_entry(cm, before):
            say(snapshot_set_line(rl, cm))
        else:
            say(
                "warning: no new snapshot in recording.log (a service snapshot failed? see `tool errors`); "
                "the next start replays the log"
            )
