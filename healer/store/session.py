"""Engine and session factory. The caller (a tick, a request) owns the transaction."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, *, echo: bool = False, **engine_kwargs: Any) -> Engine:
    """Create an engine for ``url`` (``sqlite:///file.db`` or ``postgresql+psycopg://...``).

    SQLite gets foreign keys on and a busy timeout so the API and the controller can share a file.
    """
    kwargs: dict[str, Any] = {"echo": echo, **engine_kwargs}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs.setdefault("pool_pre_ping", True)
    engine = create_engine(url, **kwargs)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commits on success, rolls back on error."""
    with factory() as session, session.begin():
        yield session


class LazyTransaction:
    """A transaction opened on first use and committed where the caller says, so consecutive
    stages share one transaction until one of them must be durable (e.g. before a cluster write).

    ``on_open(session)`` runs first in every transaction it opens (e.g. the fencing check).
    """

    def __init__(self, factory: sessionmaker[Session], on_open: Callable[[Session], None]) -> None:
        self._factory = factory
        self._on_open = on_open
        self._session: Session | None = None

    @property
    def open(self) -> bool:
        return self._session is not None

    def session(self) -> Session:
        """The open transaction's session (a new transaction when none is open)."""
        if self._session is None:
            session = self._factory()
            session.begin()
            try:
                self._on_open(session)
            except BaseException:
                session.close()
                raise
            self._session = session
        return self._session

    def commit(self) -> None:
        """Commit the open transaction, if any."""
        self._end(commit=True)

    def rollback(self) -> None:
        """Roll the open transaction back, if any."""
        self._end(commit=False)

    def _end(self, *, commit: bool) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        try:
            if commit:
                session.commit()
            else:
                session.rollback()
        finally:
            session.close()
