"""The decision after each effect (``consensus.effect_policy``), which the node's executor and the
simulator both follow: the table of ``effects.py``, *When an effect fails*."""

from __future__ import annotations

import errno

import pytest

from cluster_node.consensus import effect_policy as policy
from cluster_node.consensus import effects as fx
from cluster_node.consensus.effect_executor import EFFECT_HANDLERS
from cluster_node.exit_codes import ExitCode

ALL_EFFECTS = sorted(EFFECT_HANDLERS, key=lambda t: t.__name__)
ERROR = OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize("t", ALL_EFFECTS, ids=lambda t: t.__name__)
def test_an_effect_carried_out_lets_the_next_run(t) -> None:
    assert policy.after(t, None).next is policy.Next.CONTINUE


@pytest.mark.parametrize(
    "t", [fx.PersistCandidateTerm, fx.WriteRecordingLog, fx.TruncateRecording], ids=lambda t: t.__name__
)
def test_a_failed_durable_write_stops_the_node_persist_failed(t) -> None:
    d = policy.after(t, ERROR)
    assert d.next is policy.Next.STOP and d.exit_code == ExitCode.PERSIST_FAILED


def test_a_recording_that_cannot_be_stopped_stops_the_node_consensus_failed() -> None:
    d = policy.after(fx.StopLogRecording, ERROR)
    assert d.next is policy.Next.STOP and d.exit_code == ExitCode.CONSENSUS_FAILED


@pytest.mark.parametrize(
    "t",
    [
        t
        for t in ALL_EFFECTS
        if t not in (fx.PersistCandidateTerm, fx.WriteRecordingLog, fx.TruncateRecording, fx.StopLogRecording)
    ],
    ids=lambda t: t.__name__,
)
def test_every_other_failure_is_counted_and_the_list_goes_on(t) -> None:
    d = policy.after(t, ERROR)
    assert d.next is policy.Next.COUNT and d.exit_code is None
