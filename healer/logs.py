"""Structured JSON logs on stderr (one object per line), for ``healer run`` and ``healer serve``."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from pythonjsonlogger.core import RESERVED_ATTRS
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
                # uvicorn's terminal copy of each message, with ANSI colour codes: not for JSON.
                reserved_attrs=[*RESERVED_ATTRS, "color_message"],
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
    # A tick skipped because the previous one overran: worth a line a minute per job, not a flood.
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    if not any(isinstance(f, SkippedRunSummary) for f in scheduler_log.filters):
        scheduler_log.addFilter(SkippedRunSummary())
    # Connection retries are reported by healer itself (e.g. "standing by, not acting: ...").
    logging.getLogger("urllib3").setLevel(logging.ERROR)


class SkippedRunSummary(logging.Filter):
    """Rate-limit APScheduler's per-run warnings (``Execution of job ... skipped: maximum number of
    running instances reached``, ``Run time of job ... was missed``) to one line per job and kind
    every ``window_seconds`` seconds; the line that passes says how many were held back before it.

    APScheduler (3.x ``schedulers/base.py``) logs one such warning for every run it skips, so a
    controller whose ticks overrun their interval would write one every interval.
    """

    def __init__(self, window_seconds: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_seconds = window_seconds
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a skipped/missed-run line within the window of the last one passed for its job."""
        message = record.msg if isinstance(record.msg, str) else ""
        if " skipped: " not in message and " was missed by " not in message:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        job = str(getattr(args[0], "id", args[0])) if args else ""
        key = (message, job)
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.window_seconds:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        self._last[key] = now
        held = self._held.pop(key, 0)
        if held and last is not None:
            record.msg = f"{record.getMessage()} ({held} more like this in the last {now - last:.0f}s)"
            record.args = ()
        return True
