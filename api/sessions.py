"""Server-side end of login sessions: a logout revokes the session on every replica.

A login cookie carries a random session id (``sid``). Logging out records the sid as revoked in
the database (the ``switches`` row ``revoked_sessions``: sid → unix time after which the cookie
has expired anyway), so a copied cookie stops working at once, on every replica. Entries are
pruned once their cookie could no longer be valid, which bounds the row by the logouts of one
session lifetime.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from healer.store import nodes as repo
from healer.store.session import transaction

SWITCH_REVOKED_SESSIONS = "revoked_sessions"


class RevokedSessions:
    """Revoked login session ids, kept in the database."""

    def __init__(
        self, session_factory: sessionmaker[Session], *, clock: Callable[[], datetime], lifetime_seconds: int
    ) -> None:
        self._sessions = session_factory
        self._clock = clock
        self._lifetime = lifetime_seconds

    def is_revoked(self, sid: str) -> bool:
        """True when ``sid`` was logged out."""
        with self._sessions() as session:
            return sid in repo.get_switch(session, SWITCH_REVOKED_SESSIONS)

    def revoke(self, sid: str, *, by: str) -> None:
        """Revoke ``sid`` (and prune entries whose cookies have expired)."""
        now = self._clock()
        with transaction(self._sessions) as session:
            revoked = {
                k: v
                for k, v in repo.get_switch(session, SWITCH_REVOKED_SESSIONS).items()
                if isinstance(v, int | float) and v > now.timestamp()
            }
            revoked[sid] = (now + timedelta(seconds=self._lifetime)).timestamp()
            repo.set_switch(session, SWITCH_REVOKED_SESSIONS, revoked, now=now, by=by)
