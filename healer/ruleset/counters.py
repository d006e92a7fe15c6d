"""dcgm-exporter counters CSVs (``deploy/dcgm-exporter/counters-<line>.csv``): which line enables
which metric.

dcgm-exporter exports exactly the fields its counters CSV lists, one per line
``DCGM_FI_<FIELD>, <prometheus type>, <help>`` (``#`` starts a comment); the metric is named after
the field. healer ships one CSV per exporter line (3.x and 4.x name field 112 differently, and an
exporter refuses to start on a field its DCGM does not know; deploy/README.md). A field a CSV
keeps commented out (``# DCGM_FI_..., gauge, ...``: not every exporter of the line has it) is
found too, as a line to uncomment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: ``DCGM_FI_X, gauge, help`` (optionally behind ``#``): the field and the Prometheus type.
_LINE = re.compile(r"^\s*(?P<comment>#\s*)?(?P<field>DCGM_(?:FI|EXP)_[A-Z0-9_]+)\s*,\s*(?P<type>[a-z]+)\s*,")


@dataclass(frozen=True)
class CounterLine:
    """One CSV line naming a field: ``file`` (its name), 1-based ``line``, the ``text`` as written,
    and whether it is ``commented`` out (uncomment it to enable the field)."""

    file: str
    line: int
    text: str
    commented: bool

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" + (" (commented out: uncomment it)" if self.commented else "")
        return f"{where}: {self.text.lstrip('# ').strip()}"


def read_counters(directory: Path) -> dict[str, list[CounterLine]]:
    """Field (metric) name → the lines naming it in every ``counters-*.csv`` of ``directory``
    (sorted by file); empty when the directory holds none."""
    found: dict[str, list[CounterLine]] = {}
    for path in sorted(directory.glob("counters-*.csv")):
        for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            m = _LINE.match(text)
            if m is not None:
                line = CounterLine(path.name, number, text, commented=m.group("comment") is not None)
                found.setdefault(m.group("field"), []).append(line)
    return found
