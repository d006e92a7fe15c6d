"""Structured JSON logs on stderr (one object per line), for ``healer run`` and ``healer serve``."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from healer import redaction


def configure_logging(level: str = "INFO", *, json: bool = True) -> None:
    """Send every logger to stderr, as JSON lines (``json=False``: plain text for a terminal).

    Fields: ``time`` (ISO 8601 UTC), ``level``, ``logger``, ``message`` plus whatever ``extra=`` a
    call passes (node, rule, incident ...).
    """
    handler = logging.StreamHandler(sys.stderr)
    if json:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
                datefmt="%Y-%m-%dT%H:%M:%S%z",
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    # Every line is redacted: URLs lose credentials, tokens and query values (healer.redaction).
    redaction.install(handler)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter that is not about healer's work.
    for noisy in ("apscheduler", "httpx", "kubernetes.client.rest", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Connection retries are reported by healer itself (e.g. "standing by, not acting: ...").
    logging.getLogger("urllib3").setLevel(logging.ERROR)
