"""Early ticks on request, coalesced and rate-limited (alerts mode's Alertmanager receiver).

:class:`Wakeups` runs one action on a thread of its own each time it is asked, but never twice at
once and at most once per ``min_interval`` seconds: requests that arrive while a run waits or runs
are one more run after it, however many they are. A flood of notifications therefore costs at most
one extra tick per ``min_interval``; a request that arrives mid-run is never lost (the run may have
read Prometheus before the alert fired).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["Wakeups"]


class Wakeups:
    """Runs ``action`` on request (see the module docstring); :meth:`start` before, :meth:`stop` after.

    Args:
        action: what a wakeup runs (the controller's woken tick); an exception is logged and the
            next request runs it again.
        min_interval: seconds between the starts of two runs, at least.
        monotonic: the clock the spacing is measured on (seconds; must not jump).

    ``runs`` counts the runs started.
    """

    def __init__(
        self,
        action: Callable[[], None],
        *,
        min_interval: float,
        monotonic: Callable[[], float] = time.monotonic,
        name: str = "healer-wake",
    ) -> None:
        self.action = action
        self.min_interval = min_interval
        self.runs = 0
        self._monotonic = monotonic
        self._requested = threading.Event()
        self._stopping = threading.Event()
        self._last_start: float | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def pending(self) -> bool:
        """A run is requested and has not started yet."""
        return self._requested.is_set() and not self._stopping.is_set()

    def request(self) -> None:
        """Ask for a run: the next one if none is pending (returns at once, never blocks)."""
        self._requested.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop after the run in progress, if any (a pending request is dropped)."""
        self._stopping.set()
        self._requested.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self._requested.wait()
            if self._stopping.is_set():
                return
            if self._last_start is not None:
                wait = self._last_start + self.min_interval - self._monotonic()
                if wait > 0 and self._stopping.wait(wait):
                    return
            # Cleared before the run: a request from now on is one more run after this one.
            self._requested.clear()
            self._last_start = self._monotonic()
            self.runs += 1
            try:
                self.action()
            except Exception:
                log.exception("woken run failed")
