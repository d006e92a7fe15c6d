"""Request dependencies: the database session, the caller's identity, the clock, the rule set."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session

from api.auth import Auth, Identity
from api.errors import ApiError
from api.queries import Judging
from api.verdict import Policy
from healer.config import Settings
from healer.ruleset.schema import RuleSet
from healer.sources.prometheus_range import PrometheusRange

#: A row id in a path (a ticket's): 1 .. 2**31-1, what the database's ``integer`` holds. Anything
#: else is a 400 before a query runs.
RowId = Annotated[int, Path(ge=1, le=2**31 - 1, description="A row id (1 to 2147483647).")]


def get_session(request: Request) -> Iterator[Session]:
    """A read session for the request; handlers that write open their own transaction."""
    with request.app.state.session_factory() as session:
        yield session


def get_identity(request: Request) -> Identity:
    """The caller (see :mod:`api.auth`); also stored on ``request.state.identity`` for templates.

    Raises:
        ApiError: 401 when nothing identifies the caller and anonymous access is off.
    """
    auth: Auth = request.app.state.auth
    identity = auth.identify(request)
    if identity is None:
        raise ApiError(401, "authentication required: a bearer token, a login, or the proxy's user header")
    request.state.identity = identity
    return identity


def require_operator(identity: Annotated[Identity, Depends(get_identity)]) -> Identity:
    """The caller, if an operator.

    Raises:
        ApiError: 403 for viewers.
    """
    if not identity.is_operator:
        raise ApiError(403, f"{identity.user} is a {identity.role}; this action needs the operator role")
    return identity


def get_now(request: Request) -> datetime:
    """Now, aware UTC, from the app's clock (tests pass a fixed one)."""
    now: datetime = request.app.state.clock()
    return now


def get_ruleset(request: Request) -> RuleSet | None:
    """The rule set the controller runs (or ``healer serve`` loaded); None when there is none."""
    provider = request.app.state.ruleset_provider
    return provider() if provider is not None else None


@dataclass(frozen=True)
class FleetQuery:
    """The fleet page's query parameters, shared by ``/`` and its fragment ``/fragments/fleet``:
    ``state`` (a lifecycle state; none = every node not healthy), ``pool``, ``rule`` (nodes with a
    finding of it), ``q`` (text in the node name) and ``cursor`` (the next page's)."""

    state: str | None = None
    pool: str | None = None
    rule: str | None = None
    q: str | None = None
    cursor: str | None = None

    @property
    def filters(self) -> dict[str, str | None]:
        """The filters alone (no cursor), as the links and the template use them."""
        return {"state": self.state, "pool": self.pool, "rule": self.rule, "q": self.q}


def get_prometheus(request: Request) -> PrometheusRange:
    """The dashboard's Prometheus adapter (range queries with a short timeout)."""
    prometheus: PrometheusRange = request.app.state.prometheus
    return prometheus


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_history(request: Request) -> PrometheusRange:
    """The range-query source for replays of history (built by the composition root)."""
    history: PrometheusRange = request.app.state.history
    return history


def get_judging(
    now: Annotated[datetime, Depends(get_now)],
    ruleset: Annotated[RuleSet | None, Depends(get_ruleset)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> Judging:
    """What node summaries need for their verdicts: now, the rule set and the settings it reads."""
    return Judging(
        now=now,
        ruleset=ruleset,
        policy=Policy(
            recovery_hold_seconds=settings.safety.recovery_hold_seconds,
            validation_job=settings.validation.enabled,
            awaiting_repair_attention_seconds=settings.api.awaiting_repair_attention_hours * 3600,
        ),
    )


SessionDep = Annotated[Session, Depends(get_session)]
IdentityDep = Annotated[Identity, Depends(get_identity)]
OperatorDep = Annotated[Identity, Depends(require_operator)]
NowDep = Annotated[datetime, Depends(get_now)]
RuleSetDep = Annotated[RuleSet | None, Depends(get_ruleset)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
HistoryDep = Annotated[PrometheusRange, Depends(get_history)]
PrometheusDep = Annotated[PrometheusRange, Depends(get_prometheus)]
JudgingDep = Annotated[Judging, Depends(get_judging)]
#: FastAPI reads a dataclass dependency's fields as query parameters.
FleetQueryDep = Annotated[FleetQuery, Depends(FleetQuery)]
