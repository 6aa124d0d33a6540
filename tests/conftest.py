"""Suite-wide options: the long chaos runs are opt-in (``pytest --chaos`` or ``CLUSTER_CHAOS=1``);
without either, tests marked ``chaos`` are deselected (not skipped), so the default suite stays
within its time budget and reports no skips."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos",
        action="store_true",
        default=False,
        help="also run the long chaos tests (tests marked chaos; CLUSTER_CHAOS=1 does the same)",
    )


def chaos_enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("--chaos")) or os.environ.get("CLUSTER_CHAOS", "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if chaos_enabled(config):
        return
    chaos = [item for item in items if item.get_closest_marker("chaos") is not None]
    if chaos:
        config.hook.pytest_deselected(items=chaos)
        items[:] = [item for item in items if item.get_closest_marker("chaos") is None]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the shared-memory driver directories of node directories that are gone (earlier
    runs' temporary directories, which pytest deletes as it makes new ones): nodes started by a
    test outside ``TestCluster`` (``cluster-node up``, the CLI) do not remove theirs."""
    from cluster_node.driver_dir import sweep_orphans

    sweep_orphans()
