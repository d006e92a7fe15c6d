"""A controller tick that overruns its interval: APScheduler's "skipped" warning is rate-limited to
one line a minute per job (healer.logs.SkippedRunSummary), with the count held back."""

from __future__ import annotations

import logging
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler

from healer.logs import SkippedRunSummary, configure_logging


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_an_overrunning_job_logs_one_skip_line_not_one_per_tick() -> None:
    configure_logging("INFO", json=False)
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    assert sum(isinstance(f, SkippedRunSummary) for f in scheduler_log.filters) == 1
    lines = _Lines()
    scheduler_log.addHandler(lines)
    done = threading.Event()
    scheduler = BackgroundScheduler(timezone="UTC", job_defaults={"coalesce": True, "max_instances": 1})
    scheduler.add_job(done.wait, "interval", args=[1.5], seconds=0.1, id="tick", name="tick")
    try:
        scheduler.start()
        time.sleep(1.2)  # about ten runs due while the first one is still going
    finally:
        done.set()
        scheduler.shutdown(wait=True)
        scheduler_log.removeHandler(lines)
    skipped = [line for line in lines.lines if "skipped" in line]
    assert len(skipped) == 1, lines.lines
    assert 'job "tick' in skipped[0]


def test_the_next_line_after_the_window_counts_what_was_held_back() -> None:
    now = [0.0]
    summary = SkippedRunSummary(window_seconds=60.0, clock=lambda: now[0])

    class Job:
        id = "tick"

    def record() -> logging.LogRecord:
        return logging.LogRecord(
            "apscheduler.scheduler",
            logging.WARNING,
            __file__,
            1,
            'Execution of job "%s" skipped: maximum number of running instances reached (%d)',
            (Job(), 1),
            None,
        )

    assert summary.filter(record())
    for t in range(1, 30):
        now[0] = float(t)
        assert not summary.filter(record())
    now[0] = 61.0
    passed = record()
    assert summary.filter(passed)
    assert passed.getMessage().endswith("(29 more like this in the last 61s)")
    other = logging.LogRecord(
        "apscheduler.scheduler", logging.WARNING, __file__, 1, "scheduler started", (), None
    )
    assert summary.filter(other)
