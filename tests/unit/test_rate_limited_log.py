"""cluster_node.media.rate_limited_log: once per key, then one summary per interval, with a bounded key table."""

from __future__ import annotations

from cluster_node.media.rate_limited_log import RateLimitedLog

S = 1_000_000_000


class _Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def warning(self, event: str, **fields) -> None:
        self.lines.append((event, fields))


def _limited(**kwargs):
    now = [0]
    logger = _Logger()
    return RateLimitedLog(logger, clock_ns=lambda: now[0], **kwargs), logger, now


def test_a_flood_of_one_warning_is_one_line_then_one_summary_per_interval():
    limited, logger, now = _limited(interval_ns=10 * S)
    for i in range(10_000):
        now[0] = i * 1_000_000  # 1 ms apart: 10 s in all
        limited.warning("bad", "bad request dropped", n=i)
    assert logger.lines == [("bad request dropped", {"n": 0})]
    now[0] = 10 * S
    limited.warning("bad", "bad request dropped", n=10_000)
    assert logger.lines[1:] == [("bad request dropped", {"n": 10_000, "repeated": 10_000, "over_s": 10.0})]
    limited.warning("bad", "bad request dropped", n=10_001)
    assert len(logger.lines) == 2
    limited.flush()
    assert logger.lines[2] == ("bad request dropped", {"n": 10_001, "repeated": 1, "over_s": 0.0})
    limited.flush()
    assert len(logger.lines) == 3


def test_distinct_keys_are_each_logged_once_and_their_number_is_bounded():
    limited, logger, _now = _limited(max_keys=3)
    for i in range(1000):
        limited.warning(("kind", i % 500), "dropped", i=i)
    # Keys 0, 1 and 2 have a line each; every later key shares one more key, and its one line.
    assert [f["i"] for _e, f in logger.lines] == [0, 1, 2, 3]
    assert len(limited._held) == 4
