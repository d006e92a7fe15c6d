"""One redaction for URLs and secrets, used wherever text leaves healer: logs, pages, API, CLI, audit.

- :func:`redact_url`: a URL fit to show. User info (``user:pass@``) goes, every query value
  becomes ``REDACTED``, and path segments that carry credentials are replaced: everything after
  ``/services/``, ``/webhooks/`` or ``/hooks/`` (Slack, Discord, Teams, Mattermost) and any
  segment of 16+ token characters mixing letters and digits. Scheme, host, port and the plain
  path stay so a human can tell endpoints apart.
- :func:`redact_text`: free text (a transport error, a body a provider echoed back, a stored
  error). Known URLs and secrets are replaced wherever they appear, whole or in parts (a provider
  may echo only the path or only the token); then every URL found in the text is passed through
  :func:`redact_url`, ``Bearer``/``Basic`` credentials and ``password=``/``token=``-style values
  are replaced. Idempotent.
- :class:`RedactingFilter`: a logging filter for handlers that applies :func:`redact_text` to
  every record's message and traceback (:func:`healer.logs.configure_logging` installs it).

Source of the well-known webhook shapes: Slack ``hooks.slack.com/services/T/B/X``, Discord
``/api/webhooks/<id>/<token>``, Teams ``/webhookb2/...``, Mattermost ``/hooks/<key>``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "REDACTED"
#: Path segments after these are credentials in well-known webhook URLs.
_SECRET_PATH_AFTER = ("services", "webhooks", "webhookb2", "IncomingWebhook", "hooks")
_TOKENISH = re.compile(r"^[A-Za-z0-9_\-.~=+]{16,}$")
#: Shortest known secret (or part of one) replaced inside free text: shorter strings would
#: redact ordinary words.
_MIN_SECRET = 4
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]{1,20}://[^\s\"'<>`]+")
_URL_TRAILING = ".,;:!?)]}"
_AUTH = re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=\-]{6,}")
_KEY_VALUE = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?token|private[_-]?token|"
    r"authorization|signature)(\"?\s*[:=]\s*\"?)([^\s\"&,;]+)"
)


def _looks_secret(segment: str) -> bool:
    if segment == REDACTED or not _TOKENISH.match(segment):
        return False
    has_digit = any(c.isdigit() for c in segment)
    has_alpha = any(c.isalpha() for c in segment)
    return (has_digit and has_alpha) or len(segment) >= 32


def _secret_segments(path: str) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    after_marker = False
    for segment in path.split("/"):
        out.append((segment, bool(segment) and (after_marker or _looks_secret(segment))))
        if segment in _SECRET_PATH_AFTER:
            after_marker = True
    return out


def redact_url(url: str) -> str:
    """``url`` fit for logs, errors and pages (see the module docstring). Unparsable: ``REDACTED``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return REDACTED
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port else host
    if parts.username or parts.password:
        netloc = f"{REDACTED}@{netloc}"
    path = "/".join(REDACTED if secret else seg for seg, secret in _secret_segments(parts.path))
    query = urlencode([(k, REDACTED) for k, _ in parse_qsl(parts.query, keep_blank_values=True)])
    return urlunsplit((parts.scheme, netloc, path, query, ""))


def secret_parts(url: str) -> set[str]:
    """The pieces of ``url`` that :func:`redact_url` hides (password, user, query values, secret
    path segments), to find them when they come back alone in free text."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return {url}
    found = {p for p in (parts.username, parts.password) if p}
    found |= {v for _, v in parse_qsl(parts.query, keep_blank_values=True) if v}
    found |= {seg for seg, secret in _secret_segments(parts.path) if secret}
    return {p for p in found if len(p) >= _MIN_SECRET and p != REDACTED}


def _redact_found_url(match: re.Match[str]) -> str:
    text = match.group()
    stripped = text.rstrip(_URL_TRAILING)
    return redact_url(stripped) + text[len(stripped) :]


def redact_text(
    text: str, *, urls: Iterable[str | None] = (), secrets: Iterable[bytes | str | None] = ()
) -> str:
    """``text`` without the secrets it may carry (see the module docstring).

    ``urls``: URLs healer knows (a provider's, Prometheus's) whose parts must go even when they
    appear alone; ``secrets``: values (HMAC keys, tokens) replaced wherever they appear.
    """
    known: set[str] = set()
    for url in urls:
        if url:
            text = text.replace(url, redact_url(url))
            known |= secret_parts(url)
    for secret in secrets:
        if secret:
            value = secret.decode(errors="replace") if isinstance(secret, bytes) else secret
            if len(value) >= _MIN_SECRET:
                known.add(value)
    for value in sorted(known, key=len, reverse=True):  # longest first: parts of parts stay hidden
        text = text.replace(value, REDACTED)
    text = _URL.sub(_redact_found_url, text)
    text = _AUTH.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)


class RedactingFilter(logging.Filter):
    """Redacts every record's message, arguments and traceback with :func:`redact_text`.

    Put it on handlers (a logger's filter misses records propagated from child loggers). The
    message is formatted here (``record.getMessage()``) and its arguments dropped; a traceback is
    formatted to ``exc_text`` and ``exc_info`` cleared, so formatters only see redacted text.
    """

    def __init__(self, *, urls: Iterable[str | None] = (), secrets: Iterable[str | None] = ()) -> None:
        super().__init__()
        self.urls = [u for u in urls if u]
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string must not lose the record
            message = f"{record.msg!r} {record.args!r}"
        record.msg = redact_text(message, urls=self.urls, secrets=self.secrets)
        record.args = ()
        if record.exc_info:
            formatted = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact_text(formatted, urls=self.urls, secrets=self.secrets)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact_text(record.exc_text, urls=self.urls, secrets=self.secrets)
        return True


def install(
    handler: logging.Handler, *, urls: Iterable[str | None] = (), secrets: Iterable[str | None] = ()
) -> None:
    """Add a :class:`RedactingFilter` to ``handler`` (replacing one added before)."""
    for old in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
        handler.removeFilter(old)
    handler.addFilter(RedactingFilter(urls=urls, secrets=secrets))


def install_log_redaction(logger_name: str = "httpx") -> None:
    """Redact the records of ``logger_name`` itself (idempotent). httpx logs every request's full
    URL at INFO (``HTTP Request: POST https://...``); a Slack or Teams webhook URL is a credential.
    Handlers installed by :func:`healer.logs.configure_logging` redact everything anyway; this
    covers processes that log through other handlers."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())
