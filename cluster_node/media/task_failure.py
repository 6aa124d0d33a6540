"""What a component does when one of its long-running tasks fails.

The driver's loops (sender, receiver, conductor) and the archive's (control sessions, recordings,
replays, replications) run in nurseries of their own inside the node's trio loop. An exception
that escapes one of them used to unwind the whole process through nested exception groups,
closing the driver's mappings under the service thread, so the operator saw a service error
and a traceback instead of the cause. Each such task now runs under :func:`run_guarded`: the
failure is logged once with its traceback and handed to the component's ``on_task_failure``
hook, which the node sets to end the process with an exit code of its own
(cluster_node.exit_codes); without a hook (a library user, a test) it is raised as one
:class:`TaskFailure` that names the component and the task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from cluster_node.media.library_log import library_logger

__all__ = ["TaskFailure", "run_guarded"]

log = library_logger("media.task_failure")


class TaskFailure(Exception):
    """Task ``task`` of ``component`` failed with ``error``; ``str()`` is one line."""

    def __init__(self, component: str, task: str, error: BaseException) -> None:
        super().__init__(f"{component} task '{task}' failed: {type(error).__name__}: {error}")
        self.component = component
        self.task = task
        self.error = error


class _HasFailureHook(Protocol):
    on_task_failure: Callable[[TaskFailure], None] | None


async def run_guarded(
    owner: _HasFailureHook, component: str, task: str, fn: Callable[..., Awaitable[None]], *args
) -> None:
    """Run ``fn(*args)``; an exception from it is logged, given to ``owner.on_task_failure``
    (read at the time of the failure) and raised as a :class:`TaskFailure`. Cancellation is
    not a failure."""
    try:
        await fn(*args)
    except Exception as e:  # every failure of the task is reported the same way
        failure = TaskFailure(component, task, e)
        log.error("task failed", component=component, task=task, error=repr(e), exc_info=True)
        hook = owner.on_task_failure
        if hook is not None:
            hook(failure)
        raise failure from e
