"""Inbound provider status callbacks: ``POST /api/v1/tickets/{ticket_id}/status``.

The provider signs method, path and raw body (:func:`healer.tickets.signing.sign_callback`:
``X-Healer-Timestamp`` and ``X-Healer-Signature: sha256=<hex>`` of
``f"{timestamp}.POST./api/v1/tickets/{id}/status." + body``) under its callback secret: the
provider's ``callback_secret_env``/``_file``, else the shared ``tickets.callback_secret_env``/
``_file`` when that is configured. A signature is therefore good for one ticket only, and nonces
are kept per ticket. An unsigned, badly signed, stale (outside ``tickets.max_clock_skew_seconds``)
or replayed request gets 401 and changes nothing; so does any callback for a provider without a
secret. The signature is the authentication: this route needs no dashboard identity and no CSRF
token. Bodies are limited before they are read (413; :mod:`api.limits`).

Body::

    {"status": "acknowledged" | "in_progress" | "needs_info" | "resolved" | "rejected",
     "resolution": "replaced" | "fault_found" | "no_fault_found" (with resolved, optional),
     "reason": "...",          required for needs_info and rejected
     "external_id": "...",     the provider's ticket id, kept if healer has none yet
     "at": "2026-11-29T10:00:00Z"}   when it happened at the provider (default: now)

Answers 200 with ``{"ticket_id", "status", "previous", "changed", "node_state"}``; a duplicate or
late callback answers 200 with ``changed: false`` (so the provider stops retrying). 404 for an
unknown ticket (only after the signature checked out), 422 for a malformed body.

Reads ``app.state.settings`` (:class:`~healer.config.Settings`), ``app.state.session_factory`` and
``app.state.clock`` (a callable returning aware UTC now).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import AwareDatetime, BaseModel, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from api.deps import RowId
from healer.config import ProviderSettings, Settings, TicketSettings
from healer.errors import SignatureError, TicketError
from healer.model.states import TicketStatus
from healer.store.models import Ticket
from healer.tickets import service, signing

log = logging.getLogger(__name__)

router = APIRouter(tags=["tickets"])


class StatusCallback(BaseModel):
    """A provider's report on one ticket."""

    status: Literal["acknowledged", "in_progress", "needs_info", "resolved", "rejected"]
    resolution: Literal["replaced", "fault_found", "no_fault_found"] | None = Field(
        None,
        description=(
            "With 'resolved': what the repair found: a part replaced, a fault found (and fixed), or "
            "no fault found. It decides the incident's outcome (the rule's precision)."
        ),
    )
    reason: str | None = Field(None, max_length=4000)
    external_id: str | None = Field(None, max_length=200)
    at: AwareDatetime | None = Field(None, description="When it happened at the provider (ISO 8601).")


class StatusResult(BaseModel):
    """What the callback did: ``changed`` is false for a duplicate or out-of-order report."""

    ticket_id: int
    status: str
    previous: str
    changed: bool
    node_state: str | None = None


def _unauthorized(ticket_id: int, why: str) -> HTTPException:
    log.warning("refused status callback for ticket %d: %s", ticket_id, why)
    return HTTPException(401, f"signature refused: {why}", headers={"WWW-Authenticate": "HMAC-SHA256"})


def _secret(env: str | None, file: Path | None, what: str) -> bytes | None:
    try:
        return signing.load_secret(env=env, file=file, what=what)
    except TicketError as exc:
        log.error("%s", exc)
        return None


def callback_secrets(tickets: TicketSettings, provider: str | None) -> list[bytes]:
    """The secrets a callback for a ticket of ``provider`` may be signed with: the provider's own
    callback secret, else the shared ``tickets.callback_secret_*`` when one is configured. For an
    unknown ticket (``provider`` None) every configured one, so a genuine provider still learns 404."""
    shared = _secret(tickets.callback_secret_env, tickets.callback_secret_file, "ticket callbacks")

    def own_or_shared(p: ProviderSettings | None) -> bytes | None:
        if p is None or not (p.callback_secret_env or p.callback_secret_file):
            return shared
        return _secret(p.callback_secret_env, p.callback_secret_file, f"provider {p.name} callbacks")

    if provider is not None:
        secret = own_or_shared(next((p for p in tickets.providers if p.name == provider), None))
        return [secret] if secret is not None else []
    found: list[bytes] = []
    for secret in [*(own_or_shared(p) for p in tickets.providers), shared]:
        if secret is not None and secret not in found:
            found.append(secret)
    return found


def _handle(
    *,
    ticket_id: int,
    method: str,
    body: bytes,
    headers: Mapping[str, str],
    tickets: TicketSettings,
    factory: sessionmaker[Session],
    now: datetime,
) -> StatusResult:
    with factory() as session:
        provider = session.scalar(select(Ticket.provider).where(Ticket.id == ticket_id))
    secrets = callback_secrets(tickets, provider)
    if not secrets:
        raise _unauthorized(ticket_id, "no callback secret is configured for this ticket's provider")
    skew = float(tickets.max_clock_skew_seconds)
    try:
        nonce = signing.verify_callback(
            secrets,
            headers=headers,
            method=method,
            path=signing.callback_path(ticket_id),
            body=body,
            now=now,
            max_skew_seconds=skew,
        )
    except SignatureError as exc:
        raise _unauthorized(ticket_id, str(exc)) from None
    if provider is None:
        raise HTTPException(404, f"ticket {ticket_id} not found")
    try:
        report = StatusCallback.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in exc.errors(include_input=False)
        )
        raise HTTPException(422, problems) from None
    at = min(report.at, now) if report.at else None
    try:
        with factory() as session, session.begin():
            signing.remember_nonce(session, nonce=nonce, now=now, max_skew_seconds=skew, ticket_id=ticket_id)
            change = service.apply_provider_status(
                session,
                ticket_id=ticket_id,
                status=TicketStatus(report.status),
                now=now,
                at=at,
                reason=report.reason,
                external_id=report.external_id,
                resolution=report.resolution,
            )
    except SignatureError as exc:
        raise _unauthorized(ticket_id, str(exc)) from None
    except IntegrityError:
        # The same signature committed by a concurrent request: a replay.
        raise _unauthorized(ticket_id, "signature already used (replay)") from None
    except service.TicketNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return StatusResult(
        ticket_id=change.ticket_id,
        status=change.status,
        previous=change.previous,
        changed=change.changed,
        node_state=change.node_state,
    )


@router.post(
    "/api/v1/tickets/{ticket_id}/status",
    response_model=StatusResult,
    summary="Provider status callback (HMAC-signed)",
    responses={401: {"description": "missing, wrong, stale or replayed signature"}, 404: {}, 422: {}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": StatusCallback.model_json_schema()}},
        }
    },
)
async def ticket_status_callback(ticket_id: RowId, request: Request) -> StatusResult:
    """Move a ticket forward from the provider's side (acknowledged, in progress, resolved, ...)."""
    body = await request.body()  # bounded by the app's body limit (api.limits)
    state = request.app.state
    settings: Settings | TicketSettings = state.settings
    tickets = settings.tickets if isinstance(settings, Settings) else settings
    now: datetime = state.clock()
    return await run_in_threadpool(
        _handle,
        ticket_id=ticket_id,
        method=request.method,
        body=body,
        headers=request.headers,
        tickets=tickets,
        factory=state.session_factory,
        now=now,
    )
