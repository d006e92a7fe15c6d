"""HMAC-SHA256 signatures on webhooks (outbound and inbound) and secrets.

Wire format::

    X-Healer-Timestamp: 1732886400                 unix seconds, integer, when the request was signed
    X-Healer-Signature: sha256=<64 hex digits>
    Idempotency-Key:    healer-<cluster>-incident-<id>-<provider>   (outbound only)

Outbound webhooks (healer → provider) sign ``f"{timestamp}." + raw body`` with the provider's
secret (:func:`sign`). Inbound status callbacks (provider → healer) sign
``f"{timestamp}.POST./api/v1/tickets/{id}/status." + raw body`` with the provider's callback secret
(:func:`sign_callback`): method and path bind the signature to one ticket.

A receiver recomputes the HMAC over the exact bytes it received, compares in constant time
(:func:`hmac.compare_digest`), refuses timestamps further than the allowed clock skew from its own
clock, and remembers accepted signatures per ticket for the skew window so a captured request
cannot be replayed (healer keeps them in ``callback_nonces``).

Secrets come from an environment variable or a file (a Kubernetes Secret mount), never from rule
files, and never appear in logs, errors or API responses: every URL that reaches a message goes
through :func:`healer.redaction.redact_url`, and free text from the outside (transport errors,
response bodies) through :func:`healer.redaction.redact_text`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from healer.errors import SignatureError, TicketError
from healer.store.models import CallbackNonce

TIMESTAMP_HEADER = "X-Healer-Timestamp"
SIGNATURE_HEADER = "X-Healer-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
TICKET_ID_HEADER = "X-Healer-Ticket-Id"
SIGNATURE_PREFIX = "sha256="

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def load_secret(*, env: str | None, file: Path | None, what: str) -> bytes | None:
    """The secret configured by ``env`` (variable name) or ``file`` (path), or ``None`` if neither is set.

    A file's trailing newline is dropped (``kubectl create secret --from-file`` keeps it).
    ``what`` names the owner in errors (e.g. ``provider acme``).

    Raises:
        TicketError: a variable or file is configured but missing or empty. The message names the
            variable or file, never a value.
    """
    if env:
        value = os.environ.get(env, "")
        if not value.strip():
            raise TicketError(f"{what}: secret environment variable {env} is not set or empty")
        return value.strip().encode()
    if file is not None:
        try:
            data = Path(file).read_bytes().strip()
        except OSError as exc:
            raise TicketError(f"{what}: cannot read secret file {file}: {exc.strerror}") from None
        if not data:
            raise TicketError(f"{what}: secret file {file} is empty")
        return data
    return None


def sign(secret: bytes, *, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>." + body`` under ``secret``."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256)
    return SIGNATURE_PREFIX + mac.hexdigest()


def signature_headers(secret: bytes | None, *, body: bytes, now: datetime) -> dict[str, str]:
    """The timestamp and signature headers for ``body`` sent at ``now`` (no signature without a secret)."""
    timestamp = int(now.timestamp())
    headers = {TIMESTAMP_HEADER: str(timestamp)}
    if secret is not None:
        headers[SIGNATURE_HEADER] = sign(secret, timestamp=timestamp, body=body)
    return headers


def _signed_parts(headers: Mapping[str, str], *, now: datetime, max_skew_seconds: float) -> tuple[int, str]:
    """The timestamp and the hex digest a request carries, checked for shape and clock skew."""
    raw_ts = headers.get(TIMESTAMP_HEADER)
    raw_sig = headers.get(SIGNATURE_HEADER)
    if not raw_ts or not raw_sig:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    raw_ts = raw_ts.strip()
    if not raw_ts.isascii() or not raw_ts.isdigit() or len(raw_ts) > 12:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not unix seconds")
    timestamp = int(raw_ts)
    if abs(now.timestamp() - timestamp) > max_skew_seconds:
        raise SignatureError(f"timestamp outside the allowed clock skew of {max_skew_seconds:g}s")
    given = raw_sig.strip()
    digest = given.removeprefix(SIGNATURE_PREFIX).lower()
    if not given.startswith(SIGNATURE_PREFIX) or not _HEX64.match(digest):
        raise SignatureError(f"{SIGNATURE_HEADER} must be sha256=<64 hex digits>")
    return timestamp, digest


def _check(expected: str, digest: str) -> str:
    if not hmac.compare_digest(expected.removeprefix(SIGNATURE_PREFIX).encode(), digest.encode()):
        raise SignatureError("signature does not match")
    return digest


def verify(
    secret: bytes,
    *,
    headers: Mapping[str, str],
    body: bytes,
    now: datetime,
    max_skew_seconds: float,
) -> str:
    """Check an outbound webhook's signature (:func:`sign`) and timestamp; return the hex digest.

    ``headers`` must look names up case-insensitively (Starlette's and httpx's do).

    Raises:
        SignatureError: header missing or malformed, timestamp further than ``max_skew_seconds`` from
            ``now``, or signature mismatch.
    """
    timestamp, digest = _signed_parts(headers, now=now, max_skew_seconds=max_skew_seconds)
    return _check(sign(secret, timestamp=timestamp, body=body), digest)


# --- inbound callbacks --------------------------------------------------------------------------


def callback_path(ticket_id: int | str) -> str:
    """The path a status callback for ``ticket_id`` is signed over: ``/api/v1/tickets/<id>/status``
    (what healer routes, whatever prefix a proxy in front adds or strips)."""
    return f"/api/v1/tickets/{ticket_id}/status"


def sign_callback(secret: bytes, *, timestamp: int, method: str, path: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``b"<timestamp>.<METHOD>.<path>." + body`` under ``secret``.

    Signing the method and path binds a callback to one ticket: the same signed body is worthless
    at another ticket's URL.
    """
    message = f"{timestamp}.{method.upper()}.{path}.".encode() + body
    return SIGNATURE_PREFIX + hmac.new(secret, message, hashlib.sha256).hexdigest()


def callback_headers(secret: bytes, *, method: str, path: str, body: bytes, now: datetime) -> dict[str, str]:
    """The timestamp and signature headers of a status callback (what a provider sends)."""
    timestamp = int(now.timestamp())
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign_callback(secret, timestamp=timestamp, method=method, path=path, body=body),
    }


def verify_callback(
    secrets: Iterable[bytes],
    *,
    headers: Mapping[str, str],
    method: str,
    path: str,
    body: bytes,
    now: datetime,
    max_skew_seconds: float,
) -> str:
    """Check a status callback signed with :func:`sign_callback` under any of ``secrets``; return
    the hex digest (the nonce).

    Raises:
        SignatureError: header missing or malformed, stale timestamp, or no secret matches.
    """
    timestamp, digest = _signed_parts(headers, now=now, max_skew_seconds=max_skew_seconds)
    for secret in secrets:
        expected = sign_callback(secret, timestamp=timestamp, method=method, path=path, body=body)
        if hmac.compare_digest(expected.removeprefix(SIGNATURE_PREFIX).encode(), digest.encode()):
            return digest
    raise SignatureError("signature does not match")


def remember_nonce(
    session: Session, *, nonce: str, now: datetime, max_skew_seconds: float, ticket_id: int | None = None
) -> None:
    """Record an accepted signature; refuse one seen before. Prunes nonces past the replay window.

    With ``ticket_id`` the nonce is kept per ticket (``<id>:<digest>``): only a repeat for the same
    ticket is a replay.

    A signed request is only valid while its timestamp is within ``max_skew_seconds`` of the clock,
    so a nonce older than twice that can never match again and is deleted.

    Raises:
        SignatureError: the signature was already accepted (a replay).
    """
    session.execute(
        delete(CallbackNonce).where(CallbackNonce.received_at < now - timedelta(seconds=2 * max_skew_seconds))
    )
    if ticket_id is not None:
        nonce = f"{ticket_id}:{nonce}"
    if session.scalar(select(CallbackNonce.id).where(CallbackNonce.signature == nonce)) is not None:
        raise SignatureError("signature already used (replay)")
    session.add(CallbackNonce(signature=nonce, received_at=now))
    # A concurrent duplicate fails here on the unique constraint; the caller turns it into a 401.
    session.flush()
