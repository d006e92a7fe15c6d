"""Plain-text tables for terminal output."""

from __future__ import annotations


def columns(rows: list[list[str]], *, width: int | None = None) -> str:
    """``rows`` (the first one the header) as left-aligned columns two spaces apart, no trailing
    blanks; with ``width``, each line longer than that is cut to it, ending in ``…``."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if width is not None:
        lines = [line if len(line) <= width else line[: max(width - 1, 0)] + "…" for line in lines]
    return "\n".join(lines)
