"""``healer provider-receiver``: a stand-in ticket provider (from healer_dev), for demos and tests."""

from __future__ import annotations

import logging
import os
from typing import Annotated

import typer

from healer.cli.context import dev_tooling


def _env_secret(name: str | None, what: str) -> bytes | None:
    from healer.errors import TicketError
    from healer.tickets import signing

    try:
        return signing.load_secret(env=name, file=None, what=what)
    except TicketError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


def provider_receiver(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 9300,
    secret_env: Annotated[
        str | None, typer.Option(help="Env var with the secret healer signs webhooks with (verified).")
    ] = None,
    callback_url: Annotated[
        str | None, typer.Option(help="healer's base URL for status callbacks, e.g. http://127.0.0.1:8080.")
    ] = None,
    callback_secret_env: Annotated[
        str | None, typer.Option(help="Env var with the secret to sign callbacks with.")
    ] = None,
    fail_first: Annotated[
        int, typer.Option(min=0, help="Answer the first N webhooks with --fail-status.")
    ] = 0,
    fail_status: Annotated[int, typer.Option(help="Status of the simulated failures.")] = 500,
    retry_after: Annotated[str | None, typer.Option(help="Retry-After header on simulated failures.")] = None,
    reject_status: Annotated[int | None, typer.Option(help="Refuse every webhook with this status.")] = None,
    ack_after: Annotated[
        float | None, typer.Option(help="Seconds after a new ticket to call back acknowledged.")
    ] = None,
    resolve_after: Annotated[
        float | None, typer.Option(help="Seconds after a new ticket to call back resolved.")
    ] = None,
    max_skew_seconds: Annotated[float, typer.Option(help="Refuse webhooks signed further from now.")] = 300.0,
) -> None:
    """Run a stand-in provider: receives signed webhooks, can fail first, calls back signed statuses."""
    provider = dev_tooling("provider", command="provider-receiver")
    logging.basicConfig(level=os.environ.get("HEALER_LOG_LEVEL", "INFO"), format="%(asctime)s %(message)s")
    receiver = provider.Receiver(
        host=host,
        port=port,
        secret=_env_secret(secret_env, "--secret-env"),
        fail_first=fail_first,
        fail_status=fail_status,
        retry_after=retry_after,
        reject_status=reject_status,
        callback_url=callback_url,
        callback_secret=_env_secret(callback_secret_env, "--callback-secret-env"),
        ack_after=ack_after,
        resolve_after=resolve_after,
        max_skew_seconds=max_skew_seconds,
    )
    receiver.start()
    typer.echo(f"provider receiver listening on {receiver.url} (GET /requests lists what it received)")
    try:
        receiver.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        receiver.stop()
