"""The clocks (issue 24): the shared clock every replica reads the same way and the monotonic one
leader election times the Lease with. Time faked, never slept."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from healer.clock import MonotonicClock, SharedClock
from healer.errors import StoreError

DB_NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
LOCAL = DB_NOW + timedelta(seconds=90)  # this replica's wall clock runs 90 s ahead


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Database:
    """The reference: the database server's time, moving with the same ticks; can be down."""

    def __init__(self, ticks: Ticks) -> None:
        self.ticks, self.start, self.reads, self.down = ticks, ticks.now, 0, False

    def __call__(self) -> datetime:
        self.reads += 1
        if self.down:
            raise StoreError("reading the database server's time failed: connection refused")
        return DB_NOW + timedelta(seconds=self.ticks.now - self.start)


def test_the_shared_clock_reads_the_database_not_this_machine() -> None:
    ticks = Ticks()
    db = Database(ticks)
    clock = SharedClock(db, resync_seconds=5, monotonic=ticks, fallback=lambda: LOCAL)
    assert clock() == DB_NOW
    ticks.now += 3.5
    assert clock() == DB_NOW + timedelta(seconds=3.5)  # carried on the monotonic clock
    assert db.reads == 1
    ticks.now += 2
    assert clock() == DB_NOW + timedelta(seconds=5.5)
    assert db.reads == 2  # read again after resync_seconds


def test_a_database_that_cannot_be_read_leaves_the_last_reading_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks = Ticks()
    db = Database(ticks)
    clock = SharedClock(db, resync_seconds=5, monotonic=ticks, fallback=lambda: LOCAL)
    clock()
    db.down = True
    with caplog.at_level(logging.WARNING, logger="healer.clock"):
        for _ in range(3):
            ticks.now += 10
            assert clock() == DB_NOW + timedelta(seconds=ticks.now - db.start)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1  # said once
    assert "cannot be read" in caplog.records[0].message


def test_before_any_reading_the_local_clock_stands_in() -> None:
    ticks = Ticks()
    db = Database(ticks)
    db.down = True
    clock = SharedClock(db, resync_seconds=5, monotonic=ticks, fallback=lambda: LOCAL)
    assert not clock.synced and clock() == LOCAL
    db.down = False
    ticks.now += 5
    assert clock() == DB_NOW + timedelta(seconds=5) and clock.synced


def test_the_monotonic_clock_ignores_a_wall_clock_set_back() -> None:
    ticks = Ticks()
    wall = [LOCAL]
    clock = MonotonicClock(wall=lambda: wall[0], monotonic=ticks)
    wall[0] = LOCAL - timedelta(hours=1)  # an operator's `date -s`, or NTP stepping
    ticks.now += 12
    assert clock() == LOCAL + timedelta(seconds=12)
