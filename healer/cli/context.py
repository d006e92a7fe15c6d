"""What every command shares: the invocation's settings, the operator's name, dev tooling.

Imports only typer and the standard library at module level: ``healer --version`` and ``--help``
load every command module, and must stay fast.
"""

from __future__ import annotations

import getpass
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from healer.config import Settings


def settings_from(ctx: typer.Context, **overrides: object) -> Settings:
    """Build the settings for this invocation from ``--config`` and the environment.

    Exits with status 2 and every problem on stderr when the settings are invalid.
    """
    from healer.config import load_settings
    from healer.errors import ConfigError

    root = ctx.find_root()
    config = (root.obj or {}).get("config")
    try:
        return load_settings(config, **overrides)
    except ConfigError as exc:
        typer.echo(f"error: invalid settings\n{exc}", err=True)
        raise typer.Exit(2) from exc


#: How to point healer at rule files elsewhere than the rules_paths default (``./rules``).
RULES_PATHS_HINT = (
    "set rules_paths in a --config file or HEALER_RULES_PATHS='[\"/etc/healer/rules\"]' "
    "(a JSON list of files or directories)"
)


def require_rule_paths(paths: Sequence[Path], *, given: bool, usage: str = "") -> None:
    """Exit 1 when a rule path does not exist, saying which path was looked for (and where) and,
    for the ``rules_paths`` setting (``given`` False), how to set it; ``usage`` adds another way
    (e.g. the command's PATH arguments)."""
    missing = [p for p in paths if not p.exists()]
    if not missing:
        return
    for path in missing:
        looked = [] if path.is_absolute() else [f"looked for {path.absolute()}"]
        if not given:
            looked.append("the rules_paths setting")
        where = f" ({', '.join(looked)})" if looked else ""
        typer.echo(f"error: {path}: no such file or directory{where}", err=True)
    if not given:
        ways = f"{usage}, or {RULES_PATHS_HINT}" if usage else RULES_PATHS_HINT
        typer.echo(f"to read rule files elsewhere, {ways}", err=True)
    raise typer.Exit(1)


def store_sessions(ctx: typer.Context, settings: Settings | None = None) -> sessionmaker[Session]:
    """Sessions on the configured database for an operator command.

    Without healer's schema there, prints one line saying how to create it (``healer db upgrade``)
    and exits with status 1; nothing is created (not even an empty SQLite file).
    """
    from healer import wiring
    from healer.errors import StoreError

    try:
        return wiring.sessions(settings or settings_from(ctx))
    except StoreError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def operator_name() -> str:
    """Who runs the command, as the audit log records it: ``cli:<user>`` (``$USER`` first), or ``cli``."""
    user = os.environ.get("USER")
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = ""
    return f"cli:{user}" if user else "cli"


def dev_tooling(module: str, *, command: str) -> ModuleType:
    """Import ``healer_dev.<module>`` for ``command``; exit 2 with a clear message when the
    development tooling (the ``healer_dev`` package) is not installed."""
    try:
        return importlib.import_module(f"healer_dev.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != "healer_dev":
            raise
        typer.echo(
            f"error: `healer {command}` needs healer's development tooling (the healer_dev package), "
            "which is not installed here; install healer from its source tree (pip install .)",
            err=True,
        )
        raise typer.Exit(2) from exc
