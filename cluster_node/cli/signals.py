"""How a long-running command (a watch, an exporter, a client) is asked to stop.

Ctrl-C (SIGINT) and a supervisor's SIGTERM both end it cleanly, with exit code 0: each raises
KeyboardInterrupt where the command waits, and the command ends its work there. The handlers are
set explicitly because Python installs its SIGINT handler only when the signal is not ignored at
start, and a command started in the background by a non-interactive shell (``cmd &`` in a
script) inherits SIGINT ignored: without this, Ctrl-C sent to it by pid would do nothing.
"""

from __future__ import annotations

import signal

__all__ = ["stop_on_signals"]


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt


def stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt from here on (see the module docstring)."""
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
