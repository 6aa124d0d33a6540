"""DistinctErrors: each kind logged once, counted after, bounded, kept in a file for tools."""

from __future__ import annotations

import structlog.testing

from cluster_node.media.distinct_errors import DistinctErrors, read_error_table


def test_each_kind_is_logged_once_then_counted_and_the_kinds_are_bounded(tmp_path):
    errors = DistinctErrors("test", max_kinds=2)
    errors.path = tmp_path / "errors.json"
    with structlog.testing.capture_logs() as logs:
        for _ in range(5):
            errors.record("a", "kind a")
        errors.record("b", "kind b")
        for i in range(10):  # more kinds than kept: one overflow entry
            errors.record(f"forged {i}", "kind with attacker-made names")
    assert [e["event"] for e in logs] == ["kind a", "kind b", "(other errors: too many distinct kinds to keep each)"]
    assert [(e.key, e.count) for e in errors.entries()][:2] == [
        ("(other errors: too many distinct kinds to keep each)", 10),
        ("a", 5),
    ]
    assert errors.total == 16
    errors.flush()
    table = read_error_table(errors.path)
    assert {(e.key, e.count) for e in table} == {(e.key, e.count) for e in errors.entries()}
    assert all(e.first_ms <= e.last_ms for e in table)
    assert read_error_table(tmp_path / "missing.json") == []
