"""scripts/calibration.py: the machine figures printed beside every benchmark."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import calibration


def test_wake_cpu_is_a_positive_median_of_the_sleeps() -> None:
    us = calibration.wake_cpu_us(sleeps=5, sleep_s=0.001)
    assert isinstance(us, float) and 0 < us < 100_000  # (less than the 0.1 s a sleep could take)


def test_python_loop_is_timed_in_seconds() -> None:
    assert 0 <= calibration.python_loop_s(steps=10_000, runs=2) < 10
