"""Fault injection for tests: drop, duplicate, reorder and delay datagrams, by rate, seeded (core).

The driver passes every datagram it sends and/or receives through :meth:`LossGenerator.on_datagram`,
which returns what to deliver and when: nothing (dropped), the datagram now, twice, or later.
Reordering is a short hold that lets the datagrams behind it overtake; delay is a longer hold.
The same seed gives the same decisions for the same sequence of datagrams.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["LossConfig", "LossGenerator"]


@dataclass(frozen=True, slots=True)
class LossConfig:
    drop_rate: float = 0.0
    duplicate_rate: float = 0.0
    reorder_rate: float = 0.0
    reorder_hold_ns: int = 300_000
    delay_rate: float = 0.0
    delay_ns: int = 5_000_000
    seed: int = 0
    on_send: bool = True
    on_receive: bool = True

    def __post_init__(self) -> None:
        for name in ("drop_rate", "duplicate_rate", "reorder_rate", "delay_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"loss {name} must be between 0 and 1, not {value}")

    @property
    def active(self) -> bool:
        return any((self.drop_rate, self.duplicate_rate, self.reorder_rate, self.delay_rate))


class LossGenerator:
    """Decides the fate of each datagram. ``rng`` is injected so runs replay from a seed."""

    def __init__(self, config: LossConfig, rng: random.Random | None = None) -> None:
        self.config = config
        self.rng = rng if rng is not None else random.Random(config.seed)
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0
        self.delayed = 0

    def on_datagram(self, now_ns: int, data: bytes) -> list[tuple[int, bytes]]:
        """``[(due_ns, datagram), ...]``: what to deliver and when (``due_ns <= now_ns``: at once)."""
        cfg = self.config
        r = self.rng.random
        if r() < cfg.drop_rate:
            self.dropped += 1
            return []
        due = now_ns
        if r() < cfg.delay_rate:
            self.delayed += 1
            due = now_ns + cfg.delay_ns
        elif r() < cfg.reorder_rate:
            self.reordered += 1
            due = now_ns + cfg.reorder_hold_ns
        out = [(due, data)]
        if r() < cfg.duplicate_rate:
            self.duplicated += 1
            out.append((due, data))
        return out
