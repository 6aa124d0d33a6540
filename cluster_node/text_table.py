"""The plain-text tables of the command line (``tool recording-log``, ``tool list-members``,
``archive list``, the ``up`` view): columns two spaces apart, each as wide as its widest cell.

Hand-written rather than a table library: the output is read by scripts and tests line by line,
and a dozen lines give exactly that layout with no box drawing or terminal detection to turn off.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

__all__ = ["format_table"]


def format_table(rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> list[str]:
    """``rows`` (the headings first, when there are any) as lines: the columns whose index is in
    ``right`` aligned right (numbers), the others left; trailing spaces cut."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]
