"""Publishing repair requests for the node agent: sign, and write them on the Node.

The lifecycle's :class:`~healer.engine.lifecycle.RequestRepair` effect becomes a
:class:`~healer.model.repair.RepairRequest` (node, action, GPU, incident, nonce, expiry) signed
with the shared secret and written as the Node annotation ``<domain>/repair-request``. healer
already patches Nodes (cordon, taint), so publishing needs no RBAC verb beyond the chart's; the
agent answers in ``<domain>/repair-result``, which the next observe reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from healer.config import RepairSettings, Settings
from healer.engine import lifecycle as lc
from healer.errors import ConfigError, TicketError
from healer.model.repair import RepairRequest, request_key
from healer.ruleset.xid_catalog import XidCatalog, load_xid_catalog
from healer.tickets.signing import load_secret


@dataclass(frozen=True)
class RepairPublisher:
    """Signs requests with ``secret``; each expires ``ttl_seconds`` after it is made."""

    domain: str
    secret: bytes
    ttl_seconds: float
    actions: frozenset[str]
    #: How long a ticket waits for the log capture asked at quarantine, seconds (0: none asked).
    capture_wait_seconds: float = 0.0

    def request(self, node: str, effect: lc.RequestRepair, *, incident: int, now: datetime) -> RepairRequest:
        expires = now + timedelta(seconds=self.ttl_seconds)
        return RepairRequest(
            node=node,
            action=effect.action,
            gpu=effect.gpu,
            incident=incident,
            nonce=effect.nonce,
            expires=expires.isoformat(),
        )

    @property
    def key(self) -> str:
        """The Node annotation carrying the signed request."""
        return request_key(self.domain)


def repair_secret(settings: RepairSettings) -> bytes | None:
    """The request-signing secret (None when none is configured). Raises ``ConfigError`` when one
    is configured but missing or empty."""
    try:
        return load_secret(env=settings.secret_env, file=settings.secret_file, what="repair requests")
    except TicketError as exc:
        raise ConfigError(str(exc)) from None


def publisher(settings: Settings) -> RepairPublisher | None:
    """The publisher the settings describe; None when no repair action is enabled."""
    repair = settings.repair
    if not repair.actions:
        return None
    secret = repair_secret(repair)
    if secret is None:
        raise ConfigError("repair.actions needs a signing secret (repair.secret_env or repair.secret_file)")
    return RepairPublisher(
        domain=settings.kubernetes.domain,
        secret=secret,
        ttl_seconds=repair.request_ttl_seconds,
        actions=frozenset(repair.actions),
        capture_wait_seconds=repair.capture_wait_seconds,
    )


def xid_catalog(settings: Settings) -> XidCatalog | None:
    """The Xid catalog for the default ladders: ``repair.xid_catalog``, else
    ``catalog/xid-catalog.yaml`` under the first rules path, else None."""
    path = settings.repair.xid_catalog
    if path is None and settings.rules_paths:
        first = Path(settings.rules_paths[0])
        guess = (first if first.is_dir() else first.parent) / "catalog" / "xid-catalog.yaml"
        path = guess if guess.is_file() else None
    if path is None:
        return None
    return _catalog(str(path), Path(path).stat().st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _catalog(path: str, mtime_ns: int) -> XidCatalog:
    """The catalog at ``path``, parsed once per version of the file (``mtime_ns``)."""
    return load_xid_catalog(Path(path))
