"""Inbound provider status callbacks: ``POST /api/v1/tickets/{ticket_id}/status``.

The provider signs the raw body the same way healer signs its webhooks
(:mod:`healer.tickets.signing`: ``X-Healer-Timestamp`` and ``X-Healer-Signature: sha256=<hex>`` of
``f"{timestamp}." + body`` under the callback secret, ``tickets.callback_secret_env``/``_file``).
An unsigned, badly signed, stale (outside ``tickets.max_clock_skew_seconds``) or replayed request
gets 401 and changes nothing; so does any callback while no callback secret is configured. The
signature is the authentication: this route needs no dashboard identity and no CSRF token.

Body::

    {"status": "acknowledged" | "in_progress" | "needs_info" | "resolved" | "rejected",
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
from typing import Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import AwareDatetime, BaseModel, Field, ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from healer.config import Settings, TicketSettings
from healer.engine.states import TicketStatus
from healer.errors import SignatureError, TicketError
from healer.tickets import service, signing

log = logging.getLogger(__name__)

router = APIRouter(tags=["tickets"])


class StatusCallback(BaseModel):
    """A provider's report on one ticket."""

    status: Literal["acknowledged", "in_progress", "needs_info", "resolved", "rejected"]
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


def _handle(
    *,
    ticket_id: int,
    body: bytes,
    headers: Mapping[str, str],
    tickets: TicketSettings,
    factory: sessionmaker[Session],
    now: datetime,
) -> StatusResult:
    try:
        secret = signing.load_secret(
            env=tickets.callback_secret_env, file=tickets.callback_secret_file, what="ticket callbacks"
        )
    except TicketError as exc:
        log.error("%s", exc)
        raise _unauthorized(ticket_id, "callback secret not available") from None
    if secret is None:
        raise _unauthorized(ticket_id, "no callback secret is configured")
    skew = float(tickets.max_clock_skew_seconds)
    try:
        nonce = signing.verify(secret, headers=headers, body=body, now=now, max_skew_seconds=skew)
    except SignatureError as exc:
        raise _unauthorized(ticket_id, str(exc)) from None
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
            signing.remember_nonce(session, nonce=nonce, now=now, max_skew_seconds=skew)
            change = service.apply_provider_status(
                session,
                ticket_id=ticket_id,
                status=TicketStatus(report.status),
                now=now,
                at=at,
                reason=report.reason,
                external_id=report.external_id,
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
async def ticket_status_callback(ticket_id: int, request: Request) -> StatusResult:
    """Move a ticket forward from the provider's side (acknowledged, in progress, resolved, ...)."""
    body = await request.body()
    state = request.app.state
    settings: Settings | TicketSettings = state.settings
    tickets = settings.tickets if isinstance(settings, Settings) else settings
    now: datetime = state.clock()
    return await run_in_threadpool(
        _handle,
        ticket_id=ticket_id,
        body=body,
        headers=request.headers,
        tickets=tickets,
        factory=state.session_factory,
        now=now,
    )
