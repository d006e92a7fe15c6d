"""The database server's time: the one clock every replica of the controller reads the same way
(:class:`healer.clock.SharedClock`).

PostgreSQL: ``clock_timestamp()`` (the time of the call, not of the transaction's start, as
``now()`` would be). SQLite runs inside this process, so its time is this machine's clock: replicas
sharing a SQLite file share a machine and its clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from healer.clock import utc_now
from healer.errors import StoreError


def database_now(sessions: sessionmaker[Session]) -> datetime:
    """The database server's current time, aware UTC.

    Raises:
        StoreError: the database cannot be reached or answered something that is not a time.
    """
    bind = sessions.kw.get("bind")
    if bind is None or bind.dialect.name != "postgresql":
        return utc_now()
    try:
        with sessions() as session:
            value = session.execute(text("SELECT clock_timestamp()")).scalar_one()
    except SQLAlchemyError as exc:
        raise StoreError(f"reading the database server's time failed: {exc}") from exc
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise StoreError(f"the database server's time is not an aware timestamp: {value!r}")
    return value.astimezone(UTC)
