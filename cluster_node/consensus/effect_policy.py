"""What an executor does after each effect, given how it went (core)

The decision table of ``effects.py`` (*When an effect fails*) as one function, so that every
executor of the core's effects follows the same rules: the node's
(``effect_executor.EffectExecutor``, against the real files, archive and driver) and the
deterministic simulator's (``tests/support/sim.py``, against its in-memory disk and network).
A rule changed here changes both, and the simulator's invariants then judge the change (a member
whose durable write failed must send nothing that depends on it).

The outcome of one effect is one of:

* :attr:`Next.CONTINUE`: it was carried out; run the next effect;
* :attr:`Next.COUNT`: it failed, and nothing after it depends on it (best effort, or the core's
  timeouts turn the missing report into an election): count the error, log it, run the next;
* :attr:`Next.STOP`: it failed and the effects after it depend on it (a vote after the candidate
  term it promises, a position report after the term recording.log must hold, a recording
  resumed after a truncation): run nothing more and end the node with :attr:`Decision.exit_code`.

Which error it failed with does not change the decision: the node's executor passes the error
along for the line it prints, not for the rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cluster_node.consensus import effects as fx
from cluster_node.exit_codes import ExitCode

__all__ = ["Next", "Decision", "after", "OK", "COUNT"]


class Next(enum.Enum):
    CONTINUE = "continue"
    COUNT = "count"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Decision:
    next: Next
    exit_code: ExitCode | None = None
    """The node's exit code when ``next`` is STOP."""


OK = Decision(Next.CONTINUE)
COUNT = Decision(Next.COUNT)
_STOP_PERSIST = Decision(Next.STOP, ExitCode.PERSIST_FAILED)
_STOP_NOT_PERSISTED = Decision(Next.STOP, ExitCode.CONSENSUS_FAILED)


def after(effect_type: type[fx.Effect], error: BaseException | None) -> Decision:
    """The decision after an effect of ``effect_type`` ran: ``error`` is None when it was carried
    out, else what it failed with."""
    if error is None:
        return OK
    if effect_type in fx.FAIL_STOP_EFFECTS:
        # The effects after it (the vote, the position report, the recording that resumes)
        # depend on it: none may run.
        return _STOP_PERSIST
    if effect_type in fx.FAIL_STOP_NOT_PERSISTED:
        # No file failed, but the election waits for what this effect would have reported.
        return _STOP_NOT_PERSISTED
    return COUNT
