"""Early ticks on request (healer.controller.wake): a burst is one run more, spaced, never lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from healer.controller.wake import Wakeups
from tests.services import wait_until


class Blocking:
    """An action that records when each run starts and waits for ``release`` before it returns."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.release = threading.Event()

    def __call__(self) -> None:
        self.starts.append(time.monotonic())
        assert self.release.wait(10)


@pytest.fixture
def action() -> Blocking:
    return Blocking()


@pytest.fixture
def wakeups(action: Blocking) -> Iterator[Wakeups]:
    made = Wakeups(action, min_interval=0.3)
    made.start()
    yield made
    action.release.set()
    made.stop()


def test_requests_during_a_run_are_one_more_run_after_it(wakeups: Wakeups, action: Blocking) -> None:
    wakeups.request()
    wait_until(lambda: len(action.starts) == 1, timeout=5, what="the first run")
    for _ in range(50):
        wakeups.request()
    action.release.set()
    wait_until(lambda: len(action.starts) == 2, timeout=5, what="the second run")
    assert not wakeups.pending, "50 requests during one run are one run more, not 50"
    assert wakeups.runs == 2


def test_runs_are_spaced_by_min_interval(wakeups: Wakeups, action: Blocking) -> None:
    action.release.set()
    wakeups.request()
    wait_until(lambda: len(action.starts) == 1, timeout=5, what="the first run")
    wakeups.request()
    wait_until(lambda: len(action.starts) == 2, timeout=5, what="the second run")
    assert action.starts[1] - action.starts[0] >= 0.3


def test_a_failing_run_does_not_stop_the_next() -> None:
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    wakeups = Wakeups(failing, min_interval=0.01)
    wakeups.start()
    try:
        wakeups.request()
        wait_until(lambda: len(calls) == 1, timeout=5)
        wakeups.request()
        wait_until(lambda: len(calls) == 2, timeout=5)
    finally:
        wakeups.stop()


def test_stop_returns_with_a_request_pending(action: Blocking) -> None:
    wakeups = Wakeups(action, min_interval=60)
    wakeups.start()
    action.release.set()
    wakeups.request()
    wait_until(lambda: len(action.starts) == 1, timeout=5)
    wakeups.request()  # waits 60 s for its turn
    started = time.monotonic()
    wakeups.stop()
    assert time.monotonic() - started < 5
    assert len(action.starts) == 1
