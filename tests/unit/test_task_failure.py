"""run_guarded: a component's failed task is reported once, named, and given to its hook."""

from __future__ import annotations

import pytest
import trio

from cluster_node.media.task_failure import TaskFailure, run_guarded


class _Owner:
    def __init__(self) -> None:
        self.on_task_failure = None


async def _boom() -> None:
    await trio.lowlevel.checkpoint()
    raise ValueError("bad frame")


async def test_a_failure_goes_to_the_hook_and_is_raised_as_one_named_error() -> None:
    owner = _Owner()
    seen: list[TaskFailure] = []
    owner.on_task_failure = seen.append
    with pytest.raises(TaskFailure) as info:
        await run_guarded(owner, "media driver", "receiver", _boom)
    assert str(info.value) == "media driver task 'receiver' failed: ValueError: bad frame"
    assert seen == [info.value] and isinstance(info.value.error, ValueError)


async def test_without_a_hook_it_is_raised_and_cancellation_is_no_failure() -> None:
    owner = _Owner()
    with pytest.raises(TaskFailure):
        await run_guarded(owner, "archive", "replay", _boom)
    seen: list[TaskFailure] = []
    owner.on_task_failure = seen.append
    with trio.move_on_after(0.01):
        await run_guarded(owner, "archive", "control", trio.sleep_forever)
    assert seen == []
