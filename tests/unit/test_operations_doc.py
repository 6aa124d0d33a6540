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
