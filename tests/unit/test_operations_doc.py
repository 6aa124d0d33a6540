"""docs/operations.md lists every exit code of a node with its number and name, as
cluster_node.exit_codes defines them (the table is the operators' copy of the interface)."""

from __future__ import annotations

import re
from pathlib import Path

from cluster_node.exit_codes import ExitCode

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_exit_code_table_lists_every_code():
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`(\w+)`\s*\|", DOC.read_text(), flags=re.MULTILINE)
    assert [(int(n), name) for n, name in rows] == [(int(c), c.name) for c in ExitCode]


def test_the_skip_procedure_names_the_tool_command():
    text = DOC.read_text()
    assert "skip-entry --position" in text and 'service_errors = "stop"' in text


def test_every_metric_and_counter_is_documented():
    from cluster_node.metrics import CLUSTER_METRICS, JSON_KEYS

    text = DOC.read_text()
    missing = [m.name for m in CLUSTER_METRICS.values() if f"`{m.name}`" not in text]
    missing += [key for key in JSON_KEYS.values() if f"`{key}`" not in text]
    missing += [
        str(type_id) for type_id in CLUSTER_METRICS if not re.search(rf"^\|[^|]*\b{type_id}\b", text, re.MULTILINE)
    ]
    assert not missing, f"not in docs/operations.md: {missing}"
