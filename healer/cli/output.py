"""The CLI's one output convention: ``-o table|wide|json|yaml`` on every listing command, times in
ISO 8601 UTC. ``table`` on a terminal cuts its lines to the terminal's width (``…`` ends a cut
line); ``wide``, and any table written to a pipe or file, keeps whole lines.

``--json`` (and ``--format`` where it existed) stay as hidden, deprecated aliases of ``-o json``
(``-o FORMAT``). Imports only typer and the standard library at module level.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer


class Output(StrEnum):
    """How a listing command prints: an aligned table (cut to a terminal's width, or whole lines:
    ``wide``), JSON (one document), or YAML."""

    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"


OutputOption = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        help="table (cut to the terminal's width), wide (whole lines), json or yaml.",
        case_sensitive=False,
    ),
]
JsonAlias = Annotated[bool, typer.Option("--json", hidden=True, help="Deprecated: -o json.")]
FormatAlias = Annotated[
    Output | None, typer.Option("--format", hidden=True, help="Deprecated: -o.", case_sensitive=False)
]


def chosen(output: Output, *, as_json: bool = False, format_alias: Output | None = None) -> Output:
    """The format asked for: ``-o``, unless a deprecated alias was given."""
    if as_json:
        return Output.JSON
    return format_alias or output


def table_width(output: Output) -> int | None:
    """The width to cut table lines to: the terminal's for ``-o table`` on a terminal; None (whole
    lines) for ``-o wide`` or when stdout is a pipe or a file."""
    if output is not Output.TABLE or not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def iso(value: datetime | str | None) -> str | None:
    """``value`` as ISO 8601 UTC to the second (``2026-12-01T14:05:00Z``); None stays None.

    Naive datetimes are taken as UTC (what the store holds); strings are parsed first.
    """
    if value is None:
        return None
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def emit(document: Any, output: Output) -> bool:
    """Print ``document`` as JSON or YAML and return True; return False for ``table`` and ``wide``
    (the caller prints its table, :func:`table_width` wide)."""
    if output is Output.JSON:
        typer.echo(json.dumps(document, indent=2, default=str))
        return True
    if output is Output.YAML:
        from ruamel.yaml import YAML

        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = False
        yaml.width = 4096
        buf = io.StringIO()
        yaml.dump(json.loads(json.dumps(document, default=str)), buf)
        typer.echo(buf.getvalue(), nl=False)
        return True
    return False
