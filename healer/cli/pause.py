"""``healer pause`` and ``healer resume``: stop and restart all actions (recorded in the audit log)."""

from __future__ import annotations

from typing import Annotated

import typer

from healer.cli.context import operator_name, store_sessions


def pause(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option("--reason", help="Why (shown on the dashboard).")] = "",
) -> None:
    """Pause healer: no new quarantine, drain or ticket; detection and recording go on."""
    from healer import operations, wiring
    from healer.store.session import transaction

    with transaction(store_sessions(ctx)) as session:
        operations.set_paused(
            session, paused=True, actor=operator_name(), now=wiring.utc_now(), reason=reason
        )
    typer.echo("healer paused" + (f": {reason}" if reason else ""))


def resume(ctx: typer.Context) -> None:
    """Resume healer after a pause."""
    from healer import operations, wiring
    from healer.store.session import transaction

    with transaction(store_sessions(ctx)) as session:
        was_paused = operations.is_paused(session)
        operations.set_paused(session, paused=False, actor=operator_name(), now=wiring.utc_now())
    typer.echo("healer resumed" if was_paused else "healer was not paused (recorded all the same)")
