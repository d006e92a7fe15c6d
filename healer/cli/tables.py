"""Plain-text tables for terminal output."""

from __future__ import annotations


def columns(rows: list[list[str]]) -> str:
    """``rows`` (the first one the header) as left-aligned columns two spaces apart, no trailing
    blanks."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
