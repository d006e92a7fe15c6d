"""HMAC-SHA256 signatures on webhooks (outbound and inbound) and secrets.

Wire format (the same both ways)::

    X-Healer-Timestamp: 1732886400                 unix seconds, integer, when the request was signed
    X-Healer-Signature: sha256=<64 hex digits>     HMAC-SHA256(secret, f"{timestamp}." + raw body)
    Idempotency-Key:    healer-<cluster>-incident-<id>-<provider>   (outbound only)

A receiver recomputes the HMAC over the exact bytes it received, compares in constant time
(:func:`hmac.compare_digest`), refuses timestamps further than the allowed clock skew from its own
clock, and remembers accepted signatures for the skew window so a captured request cannot be
replayed (healer keeps them in ``callback_nonces``).

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
from collections.abc import Mapping
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


def verify(
    secret: bytes,
    *,
    headers: Mapping[str, str],
    body: bytes,
    now: datetime,
    max_skew_seconds: float,
) -> str:
    """Check a request's signature and timestamp; return the signature's hex digest (the nonce).

    ``headers`` must look names up case-insensitively (Starlette's and httpx's do).

    Raises:
        SignatureError: header missing or malformed, timestamp further than ``max_skew_seconds`` from
            ``now``, or signature mismatch. Replays are checked by :func:`remember_nonce`.
    """
    raw_ts = headers.get(TIMESTAMP_HEADER)
    raw_sig = headers.get(SIGNATURE_HEADER)
    if not raw_ts or not raw_sig:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        timestamp = int(raw_ts.strip())
    except ValueError:
        raise SignatureError(f"{TIMESTAMP_HEADER} is not unix seconds") from None
    if abs(now.timestamp() - timestamp) > max_skew_seconds:
        raise SignatureError(f"timestamp outside the allowed clock skew of {max_skew_seconds:g}s")
    given = raw_sig.strip()
    digest = given.removeprefix(SIGNATURE_PREFIX).lower()
    if not given.startswith(SIGNATURE_PREFIX) or not _HEX64.match(digest):
        raise SignatureError(f"{SIGNATURE_HEADER} must be sha256=<64 hex digits>")
    expected = sign(secret, timestamp=timestamp, body=body).removeprefix(SIGNATURE_PREFIX)
    if not hmac.compare_digest(expected.encode(), digest.encode()):
        raise SignatureError("signature does not match")
    return digest


def remember_nonce(session: Session, *, nonce: str, now: datetime, max_skew_seconds: float) -> None:
    """Record an accepted signature; refuse one seen before. Prunes nonces past the replay window.

    A signed request is only valid while its timestamp is within ``max_skew_seconds`` of the clock,
    so a nonce older than twice that can never match again and is deleted.

    Raises:
        SignatureError: the signature was already accepted (a replay).
    """
    session.execute(
        delete(CallbackNonce).where(CallbackNonce.received_at < now - timedelta(seconds=2 * max_skew_seconds))
    )
    if session.scalar(select(CallbackNonce.id).where(CallbackNonce.signature == nonce)) is not None:
        raise SignatureError("signature already used (replay)")
    session.add(CallbackNonce(signature=nonce, received_at=now))
    # A concurrent duplicate fails here on the unique constraint; the caller turns it into a 401.
    session.flush()
