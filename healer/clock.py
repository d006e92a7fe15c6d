"""The clocks: aware UTC ``now`` for the composition root, a clock that never jumps, and the clock
that every replica of the controller reads the same way.

Only the composition (``healer.wiring``, the CLI's entry points, the dashboard factory) reads a
clock; everything else takes ``now`` (or a ``clock``) as a parameter, so tests and backtests set the
time.

Why two more than :func:`utc_now` (see ``docs/operations.md``, "Clocks"):

* **Durations that outlive a leader** (``for``, ``keep_firing_for``, the recovery hold, drain
  deadlines, ladder step timeouts) are a new leader's ``now`` minus a time the old leader stored.
  Taken from two machines' wall clocks, a replica whose clock runs 90 s ahead would cut a
  ``for: 5m`` to 3.5 minutes. :class:`SharedClock` reads one reference every replica shares (the
  database server's time, :func:`healer.store.clock.database_now`) and carries it forward on this
  process's monotonic clock between reads, so stored times and ``now`` come from the same source.
* **Leader election** times the Lease's observed changes on the reader's own clock (client-go);
  :class:`MonotonicClock` gives it one that steps neither with NTP nor with an operator's ``date``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from healer.errors import HealerError

log = logging.getLogger(__name__)

#: How often :class:`SharedClock` reads its reference again, seconds; between reads it advances
#: on the monotonic clock (a drift of parts per million: microseconds over this interval).
RESYNC_SECONDS = 5.0


def utc_now() -> datetime:
    """The current time, aware, in UTC."""
    return datetime.now(UTC)


class MonotonicClock:
    """Aware UTC datetimes that advance with ``time.monotonic()`` from one wall-clock reading.

    Only differences of its readings mean anything across a process's life: they never step back
    or forward when the wall clock is set.
    """

    def __init__(
        self, *, wall: Callable[[], datetime] = utc_now, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._monotonic = monotonic
        self._start, self._start_mono = wall(), monotonic()

    def __call__(self) -> datetime:
        return self._start + timedelta(seconds=self._monotonic() - self._start_mono)


class SharedClock:
    """``reference``'s time (aware UTC; the database server's), read at most every
    ``resync_seconds`` and carried forward on the monotonic clock in between.

    When the reference cannot be read (a :class:`~healer.errors.HealerError`), the last reading
    goes on advancing on the monotonic clock, and before any reading the local wall clock stands
    in; either is said once in the log. Thread-safe.
    """

    def __init__(
        self,
        reference: Callable[[], datetime],
        *,
        resync_seconds: float = RESYNC_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        fallback: Callable[[], datetime] = utc_now,
    ) -> None:
        self._reference = reference
        self._resync = resync_seconds
        self._monotonic = monotonic
        self._fallback = fallback
        self._lock = threading.Lock()
        self._anchor: datetime | None = None
        self._anchor_mono = 0.0
        self._failing = False
        self._syncing = False

    @property
    def synced(self) -> bool:
        """The reference has been read at least once."""
        return self._anchor is not None

    def __call__(self) -> datetime:
        mono = self._monotonic()
        with self._lock:
            due = not self._syncing and (self._anchor is None or mono - self._anchor_mono >= self._resync)
            self._syncing = self._syncing or due
        if due:
            # Read outside the lock: a database slow to answer holds up this caller only; the
            # others go on from the last reading meanwhile.
            try:
                self._sync(mono)
            finally:
                with self._lock:
                    self._syncing = False
        with self._lock:
            anchor, anchor_mono = self._anchor, self._anchor_mono
        if anchor is None:
            return self._fallback()
        return anchor + timedelta(seconds=self._monotonic() - anchor_mono)

    def _sync(self, before: float) -> None:
        try:
            at = self._reference()
            mono = (before + self._monotonic()) / 2  # the reading's moment: mid round trip
        except HealerError as exc:
            if not self._failing:
                log.warning("shared clock: the reference time cannot be read (%s); carrying on", exc)
            self._failing = True
            return
        if self._failing:
            log.info("shared clock: reading the reference time again")
        self._failing = False
        with self._lock:
            self._anchor, self._anchor_mono = at.astimezone(UTC), mono
