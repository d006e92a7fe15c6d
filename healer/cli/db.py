"""``healer db ...``: schema management."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="Database schema.")


@app.command()
def upgrade(ctx: typer.Context, revision: str = typer.Argument("head")) -> None:
    """Create or migrate the schema at the configured database URL."""
    from sqlalchemy.exc import SQLAlchemyError

    from healer.cli.context import settings_from
    from healer.store import migrate

    settings = settings_from(ctx)
    try:
        migrate.upgrade(settings.database.url, revision)
    except SQLAlchemyError as exc:
        typer.echo(f"error: cannot upgrade the database: {exc.__class__.__name__}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"database at revision {revision}")
