"""Fencing: only the current leader writes, to the cluster and to the database.

A leader can be frozen mid-step (a long GC pause, a stopped VM) and resume after a standby took
the Lease over. Two checks keep it from acting on what it decided before the freeze:

* before every cluster write and every record, :meth:`Fence.check` asks whether this replica still
  holds the Lease *now* (its last renewal younger than the lease duration);
* every record also compares fencing numbers in the database (:meth:`Fence.check_db`): a leader
  writes its Lease's ``leaseTransitions`` to the ``leader`` switch when it takes over
  (:func:`claim`); a replica whose number is lower than the one there is stale, whatever its
  clock says. Its transitions carry holder and number, so the audit shows who recorded what.

The pattern is Kleppmann's fencing token ("How to do distributed locking", 2016) with the Lease's
transition count as the token, which only ever grows (client-go increments it on every change of
holder).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from healer.errors import NotLeader
from healer.store import nodes as repo

#: The switch holding the newest leader's identity and fencing number.
SWITCH_LEADER = "leader"  # {"holder": str, "token": int, "since": iso}


def _always() -> bool:
    return True


@dataclass(frozen=True)
class Fence:
    """Who writes (``holder``, the Lease identity), its fencing number (``token``; None: not a
    fenced writer, e.g. the CLI or a test), and ``leading`` (re-asked at each check)."""

    holder: str | None = None
    token: int | None = None
    leading: Callable[[], bool] = field(default=_always)

    def check(self) -> None:
        """Raise :class:`NotLeader` unless this replica leads now (before every cluster write)."""
        if not self.leading():
            raise NotLeader(f"{self.holder or 'this replica'} no longer holds the Lease")

    def check_db(self, session: Session) -> None:
        """:meth:`check`, then the database's fencing number (before every record, in its
        transaction): a newer leader's larger number there means this one is stale."""
        self.check()
        if self.token is None:
            return
        newest = repo.get_switch(session, SWITCH_LEADER)
        if int(newest.get("token", -1)) > self.token:
            raise NotLeader(
                f"{self.holder} (fencing {self.token}) is stale: {newest.get('holder')} leads with "
                f"fencing {newest.get('token')}"
            )


def claim(session: Session, fence: Fence, *, now: datetime) -> bool:
    """Record ``fence`` as the newest leader unless a larger fencing number is there already.

    Returns False (nothing written) when this replica is already stale.
    """
    if fence.token is None or fence.holder is None:
        return True
    newest = repo.get_switch(session, SWITCH_LEADER)
    if int(newest.get("token", -1)) > fence.token:
        return False
    value = {"holder": fence.holder, "token": fence.token, "since": now.isoformat()}
    if newest != value and (newest.get("holder"), newest.get("token")) != (fence.holder, fence.token):
        repo.set_switch(session, SWITCH_LEADER, value, now=now, by=fence.holder)
    return True
