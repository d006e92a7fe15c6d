"""Delivery of the outbox: send due webhooks, retry with backoff, record the outcome.

:func:`deliver_due` is the body of the APScheduler delivery job. For each due message it runs
three short steps, so no transaction is open while waiting on the network and a tick is never
blocked:

1. **claim** (one transaction): ``UPDATE outbox SET attempts = attempts + 1, next_attempt_at =
   now + lease WHERE id = ? AND status = 'pending' AND attempts = <seen>``. Only one process wins
   the row (SQLite and PostgreSQL alike); the lease makes a message whose sender died mid-request
   due again. The payload is rendered and stored on the row in the same transaction.
2. **send** (no transaction): one POST with the provider's timeout, signed, with the same
   ``Idempotency-Key`` as every earlier attempt.
3. **record** (one transaction): the outcome, on the outbox row and the ticket.

Outcomes, as in Alertmanager's notifiers:

- 2xx: delivered; the ticket becomes ``sent``, ``external_id`` taken from the response JSON
  (``key``, ``ticket_id`` or ``id``).
- 408, 429, 5xx, transport errors (connect, timeout, TLS), a secret not readable yet: retry.
  The next attempt is due after ``Retry-After`` (seconds or HTTP-date) when the provider sent
  one, else after a full-jitter exponential backoff:
  ``uniform(0, min(backoff_max_seconds, backoff_base_seconds * 2 ** (attempts - 1)))``
  (the "Full Jitter" of the AWS architecture blog; tenacity's ``wait_random_exponential`` is the
  same formula, written here to take the attempt count from the database and a seeded RNG).
  Messages are retried until delivered: a ticket is never dropped; ``attempts`` and
  ``last_error`` show the trouble on the dashboard.
- any other status (3xx, 4xx): permanent; the ticket becomes ``failed`` with the status and the
  response body (truncated, scrubbed of secrets) in ``last_error``. So does a template that does
  not render or a provider no longer configured.

Everything lives in the database, so a restarted (or newly elected) controller carries on.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from healer import __version__
from healer.config import ProviderSettings, Settings, TicketSettings
from healer.errors import TicketError
from healer.model.states import ActionStatus, OutboxStatus, TicketStatus
from healer.redaction import install_log_redaction, redact_text, redact_url
from healer.store import nodes as repo
from healer.store.models import Incident, Node, OutboxMessage, Ticket
from healer.tickets import payloads, signing, targets
from healer.tickets.outbox import wire_key
from healer.tickets.templates import render

log = logging.getLogger(__name__)

#: Actor recorded on delivery outcomes in ``actions``.
ACTOR = "healer:delivery"
#: Characters of a response body or error kept in ``last_error``.
MAX_ERROR_CHARS = 1000
#: Longest ``Retry-After`` honoured, seconds; a provider asking for more is retried after this.
MAX_RETRY_AFTER_SECONDS = 6 * 3600.0
#: Extra seconds a claim holds a message beyond the provider's timeout, before another process may
#: retry it (the sender presumably died).
CLAIM_LEASE_SECONDS = 60.0

Result = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class DeliveryOutcome:
    """What happened to one outbox message in one run."""

    ticket_id: int
    provider: str
    result: Result
    attempts: int
    status_code: int | None = None
    next_attempt_at: datetime | None = None  # for "retry"
    external_id: str | None = None
    error: str | None = None  # redacted


@dataclass
class DeliveryReport:
    """One run of :func:`deliver_due`: what was sent, retried and failed, and what was skipped.

    ``skipped_claimed`` counts messages another process claimed first; ``deferred`` counts messages
    left for the next run because their provider already failed in this one.
    """

    outcomes: list[DeliveryOutcome] = field(default_factory=list)
    skipped_claimed: int = 0
    deferred: int = 0

    def count(self, result: Result) -> int:
        return sum(1 for o in self.outcomes if o.result == result)

    @property
    def delivered(self) -> int:
        return self.count("delivered")

    @property
    def retrying(self) -> int:
        return self.count("retry")

    @property
    def failed(self) -> int:
        return self.count("failed")


@dataclass(frozen=True)
class _Request:
    message_id: int
    ticket_id: int
    attempts: int
    provider: str
    url: str
    body: bytes
    headers: dict[str, str]
    timeout: float
    secrets: tuple[bytes | str, ...]


@dataclass(frozen=True)
class _Failure:
    """Claimed, but nothing to send: ``retry`` (secret not there yet) or ``failed`` (bad template)."""

    message_id: int
    ticket_id: int
    attempts: int
    provider: str
    retry: bool
    error: str


def backoff_seconds(
    attempts: int, *, base_seconds: float, max_seconds: float, rng: random.Random | random.SystemRandom
) -> float:
    """Full-jitter delay before attempt ``attempts + 1``: ``uniform(0, min(max, base * 2**(attempts-1)))``."""
    exponent = min(max(attempts - 1, 0), 60)
    return rng.uniform(0.0, min(max_seconds, base_seconds * 2.0**exponent))


def retry_after_seconds(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    ``None`` when absent or unparsable; capped at :data:`MAX_RETRY_AFTER_SECONDS`.
    """
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - now).total_seconds(), 0.0), MAX_RETRY_AFTER_SECONDS)


def external_id_from(response: httpx.Response) -> str | None:
    """The provider's id for the ticket from a JSON response body (``key``, ``ticket_id`` or ``id``)."""
    try:
        data = response.json()
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for name in ("key", "ticket_id", "id"):
        value = data.get(name)
        if isinstance(value, str | int) and not isinstance(value, bool) and str(value):
            return str(value)[:200]
    return None


_PLACEHOLDER = re.compile(r"^\$\{(env|file):([^}]+)\}$")
_SENSITIVE_HEADER = re.compile(r"auth|token|key|secret|signature|cookie|password", re.IGNORECASE)


def provider_headers(provider: ProviderSettings) -> tuple[dict[str, str], tuple[str, ...]]:
    """The provider's configured headers, with ``${env:NAME}`` / ``${file:/path}`` values read now.

    Returns the headers and the values to scrub from any text (expanded values and those of
    headers that look like credentials: Authorization, tokens, keys).

    Raises:
        TicketError: a referenced variable or file is missing (named, never its value).
    """
    headers: dict[str, str] = {}
    sensitive: list[str] = []
    for name, value in provider.headers.items():
        match = _PLACEHOLDER.match(value)
        if match:
            kind, ref = match.groups()
            secret = signing.load_secret(
                env=ref if kind == "env" else None,
                file=None if kind == "env" else Path(ref),
                what=f"provider {provider.name} header {name}",
            )
            value = (secret or b"").decode()
            sensitive.append(value)
        elif _SENSITIVE_HEADER.search(name):
            sensitive.append(value)
        headers[name] = value
    return headers, tuple(sensitive)


def _ticket_settings(settings: Settings | TicketSettings) -> TicketSettings:
    return settings.tickets if isinstance(settings, Settings) else settings


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "… (truncated)"


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _choose_template(
    ticket: Ticket, target: ProviderSettings, requested: ProviderSettings | None, rerouted: bool
) -> str:
    if ticket.escalated and requested is not None and requested.escalation_template:
        return requested.escalation_template
    if rerouted:
        return target.template
    return ticket.template or target.template


def _prepare(
    session: Session, message: OutboxMessage, *, tickets: TicketSettings, now: datetime
) -> _Request | _Failure:
    """Decide escalation, render and sign ``message`` (claimed, in the claim transaction)."""
    ticket = session.get(Ticket, message.ticket_id)
    assert ticket is not None  # ON DELETE CASCADE
    providers = {p.name: p for p in tickets.providers}
    if not message.idempotency_key.startswith("healer-"):
        message.idempotency_key = wire_key(tickets.cluster_name, message.idempotency_key)

    def failure(error: str, *, retry: bool = False) -> _Failure:
        return _Failure(message.id, ticket.id, message.attempts, message.provider, retry, error)

    if ticket.escalation is None:
        escalation = payloads.decide_escalation(
            session, ticket=ticket, window_days=tickets.repeat_window_days, findings=ticket.findings or []
        )
        requested_cfg = providers.get(ticket.provider)
        if escalation["escalated"]:
            ticket.escalated = True
            incident = session.get(Incident, ticket.incident_id)
            if incident is not None:
                incident.escalated = True
            if (
                requested_cfg is not None
                and requested_cfg.escalation_provider
                and requested_cfg.escalation_provider in providers
                and requested_cfg.escalation_provider != ticket.provider
            ):
                escalation["from_provider"] = ticket.provider
                ticket.provider = requested_cfg.escalation_provider
                message.provider = requested_cfg.escalation_provider
            log.warning("ticket %s escalated: %s", message.idempotency_key, escalation["reason"])
        ticket.escalation = escalation
        ticket.updated_at = now

    escalation = dict(ticket.escalation)
    requested_name = escalation.get("from_provider") or ticket.provider
    target = providers.get(message.provider)
    if target is None:
        return failure(f"provider {message.provider!r} is not configured")
    template = _choose_template(ticket, target, providers.get(requested_name), "from_provider" in escalation)
    missed = targets.overdue_target(message.idempotency_key)
    if missed is not None:
        # A missed repair target (healer.tickets.targets): the same ticket, escalated.
        within = target.ack_within_seconds if missed == "ack" else target.repair_within_seconds
        escalation = {
            **escalation,
            "escalated": True,
            "reason": f"the provider missed its {missed} target ({within:.0f} s from delivery)",
            "overdue": {"target": missed, "within_seconds": within, "sent_at": _iso(ticket.sent_at)},
        }
        template = target.escalation_template or template
    try:
        secret = signing.load_secret(
            env=target.secret_env, file=target.secret_file, what=f"provider {target.name}"
        )
        extra_headers, sensitive = provider_headers(target)
    except TicketError as exc:
        return failure(str(exc), retry=True)
    context = payloads.build_context(
        session,
        ticket=ticket,
        cluster=tickets.cluster_name,
        dashboard_url=tickets.dashboard_url,
        idempotency_key=message.idempotency_key,
        escalation=escalation,
    )
    try:
        text = render(template, context, templates_dir=tickets.templates_dir)
    except TicketError as exc:
        return failure(str(exc))
    message.body = text
    body = text.encode()
    headers = {
        **extra_headers,
        "Content-Type": "application/json",
        "User-Agent": f"healer/{__version__}",
        signing.IDEMPOTENCY_HEADER: message.idempotency_key,
        signing.TICKET_ID_HEADER: str(ticket.id),
        **signing.signature_headers(secret, body=body, now=now),
    }
    return _Request(
        message_id=message.id,
        ticket_id=ticket.id,
        attempts=message.attempts,
        provider=target.name,
        url=target.url,
        body=body,
        headers=headers,
        timeout=target.timeout_seconds,
        secrets=(*(s for s in (secret,) if s), *sensitive),
    )


def _claim(
    factory: sessionmaker[Session],
    message_id: int,
    seen_attempts: int,
    *,
    tickets: TicketSettings,
    now: datetime,
) -> _Request | _Failure | None:
    """Claim one message (``None`` if another process got it first) and prepare its request."""
    timeouts = {p.name: p.timeout_seconds for p in tickets.providers}
    with factory() as session, session.begin():
        provider = session.scalar(select(OutboxMessage.provider).where(OutboxMessage.id == message_id))
        lease = timedelta(seconds=timeouts.get(provider or "", 10.0) + CLAIM_LEASE_SECONDS)
        claimed = session.execute(
            update(OutboxMessage)
            .where(
                OutboxMessage.id == message_id,
                OutboxMessage.status == OutboxStatus.PENDING,
                OutboxMessage.attempts == seen_attempts,
            )
            .values(attempts=seen_attempts + 1, next_attempt_at=now + lease)
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            return None
        message = session.get(OutboxMessage, message_id, populate_existing=True)
        assert message is not None
        return _prepare(session, message, tickets=tickets, now=now)


def _send(client: httpx.Client, request: _Request) -> tuple[int | None, httpx.Response | None, str | None]:
    """POST the request; (status, response, error). Transport errors come back as text, redacted."""
    try:
        response = client.post(
            request.url, content=request.body, headers=request.headers, timeout=request.timeout
        )
    except httpx.HTTPError as exc:
        text = f"{exc.__class__.__name__}: {exc}" if str(exc) else exc.__class__.__name__
        return None, None, redact_text(text, urls=[request.url], secrets=request.secrets)
    return response.status_code, response, None


def _retryable(status: int | None) -> bool:
    return status is None or status in (408, 425, 429) or status >= 500


def _record(
    factory: sessionmaker[Session],
    request: _Request | _Failure,
    *,
    status: int | None,
    response: httpx.Response | None,
    error: str | None,
    now: datetime,
    backoff: dict[str, Any],
) -> DeliveryOutcome:
    """Write the outcome of one attempt (its own transaction)."""
    url = request.url if isinstance(request, _Request) else ""
    secrets = request.secrets if isinstance(request, _Request) else ()
    with factory() as session, session.begin():
        message = session.get(OutboxMessage, request.message_id)
        ticket = session.get(Ticket, request.ticket_id)
        assert message is not None and ticket is not None
        ours = message.attempts == request.attempts and message.status == OutboxStatus.PENDING
        node = session.get(Node, ticket.node_id)
        incident = session.get(Incident, ticket.incident_id)
        where = f"{request.provider} ({redact_url(url)})" if url else request.provider

        if status is not None and 200 <= status < 300 and response is not None:
            external_id = external_id_from(response)
            message.status = OutboxStatus.DELIVERED
            message.delivered_at = now
            message.last_status_code = status
            message.last_error = None
            if ticket.status in (TicketStatus.PENDING, TicketStatus.FAILED):
                ticket.status = TicketStatus.SENT
            ticket.sent_at = ticket.sent_at or now
            ticket.external_id = ticket.external_id or external_id
            ticket.last_error = None
            ticket.updated_at = now
            repo.record_action(
                session,
                kind="ticket",
                status=ActionStatus.SUCCEEDED,
                actor=ACTOR,
                now=now,
                node=node,
                incident=incident,
                target=request.provider,
                attempts=request.attempts,
                detail={"ticket_id": ticket.id, "status_code": status, "external_id": ticket.external_id},
            )
            log.info(
                "ticket %s delivered to %s: HTTP %d after %d attempt(s)",
                message.idempotency_key,
                where,
                status,
                request.attempts,
            )
            return DeliveryOutcome(
                ticket.id, request.provider, "delivered", request.attempts, status, external_id=external_id
            )

        if isinstance(request, _Failure):
            retry, text = request.retry, request.error
        elif status is None:
            retry, text = True, f"{where}: {error}"
        else:
            body = redact_text(response.text if response is not None else "", urls=[url], secrets=secrets)
            retry = _retryable(status)
            text = f"HTTP {status} from {where}: {body.strip()}"
        text = _truncate(text)

        if not ours:
            # Someone re-claimed the message after our lease ran out (or an SRE closed the ticket):
            # the newer attempt owns the row.
            log.warning(
                "ticket %s: stale attempt %d ignored: %s", message.idempotency_key, request.attempts, text
            )
            return DeliveryOutcome(ticket.id, request.provider, "retry", request.attempts, status, error=text)

        message.last_status_code = status
        message.last_error = text
        ticket.last_error = text
        ticket.updated_at = now
        if retry:
            delay = retry_after_seconds(response.headers.get("Retry-After") if response else None, now=now)
            if delay is None:
                delay = backoff_seconds(request.attempts, **backoff)
            message.next_attempt_at = now + timedelta(seconds=delay)
            log.warning(
                "ticket %s: attempt %d failed, retrying in %.1fs: %s",
                message.idempotency_key,
                request.attempts,
                delay,
                text,
            )
            return DeliveryOutcome(
                ticket.id,
                request.provider,
                "retry",
                request.attempts,
                status,
                message.next_attempt_at,
                error=text,
            )

        message.status = OutboxStatus.FAILED
        if ticket.status == TicketStatus.PENDING:
            ticket.status = TicketStatus.FAILED
        repo.record_action(
            session,
            kind="ticket",
            status=ActionStatus.FAILED,
            actor=ACTOR,
            now=now,
            node=node,
            incident=incident,
            target=request.provider,
            attempts=request.attempts,
            error=text,
            detail={"ticket_id": ticket.id, "status_code": status},
        )
        log.error("ticket %s failed permanently: %s", message.idempotency_key, text)
        return DeliveryOutcome(ticket.id, request.provider, "failed", request.attempts, status, error=text)


def deliver_due(
    *,
    session_factory: sessionmaker[Session],
    settings: Settings | TicketSettings,
    now: datetime,
    client: httpx.Client,
    batch_size: int = 50,
    backoff_base_seconds: float = 5.0,
    backoff_max_seconds: float = 900.0,
    rng: random.Random | random.SystemRandom | None = None,
) -> DeliveryReport:
    """Send every outbox message due at ``now`` (status pending, ``next_attempt_at <= now``).

    Args:
        session_factory: one short transaction per step per message is opened from it.
        settings: the full settings or just their ``tickets`` group (providers, cluster name,
            dashboard URL, repeat window).
        now: aware UTC; the signature timestamp and every recorded time.
        client: the HTTP client (per-request timeout from each provider's ``timeout_seconds``).
        batch_size: most messages handled in one run (oldest due first).
        backoff_base_seconds / backoff_max_seconds: the full-jitter window after the first failed
            attempt, and its cap (seconds).
        rng: source of jitter (tests pass a seeded ``random.Random``).

    Returns:
        what happened to each message. Never raises for a provider's failure; those are recorded.
    """
    install_log_redaction()
    tickets = _ticket_settings(settings)
    backoff = {
        "base_seconds": backoff_base_seconds,
        "max_seconds": backoff_max_seconds,
        "rng": rng or random.SystemRandom(),
    }
    report = DeliveryReport()
    with session_factory() as session:
        due = session.execute(
            select(OutboxMessage.id, OutboxMessage.attempts, OutboxMessage.provider)
            .where(OutboxMessage.status == OutboxStatus.PENDING, OutboxMessage.next_attempt_at <= now)
            .order_by(OutboxMessage.next_attempt_at, OutboxMessage.id)
            .limit(batch_size)
        ).all()
    troubled: set[str] = set()
    for message_id, attempts, provider in due:
        if provider in troubled:
            report.deferred += 1
            continue
        prepared = _claim(session_factory, message_id, attempts, tickets=tickets, now=now)
        if prepared is None:
            report.skipped_claimed += 1
            continue
        if isinstance(prepared, _Failure):
            outcome = _record(
                session_factory, prepared, status=None, response=None, error=None, now=now, backoff=backoff
            )
        else:
            status, response, error = _send(client, prepared)
            outcome = _record(
                session_factory,
                prepared,
                status=status,
                response=response,
                error=error,
                now=now,
                backoff=backoff,
            )
        if outcome.result == "retry" and (outcome.status_code is None or outcome.status_code >= 500):
            # A provider that is down now is down for its next message too: leave those for the
            # next run instead of waiting out a timeout per message.
            troubled.add(outcome.provider)
        report.outcomes.append(outcome)
    return report
