"""Alertmanager's webhook: ``POST /api/v1/alertmanager/webhook`` (alerts mode, ``healer run``).

Alertmanager tells healer that an alert of healer's rules fired or resolved; healer then ticks
early instead of at its next poll (:meth:`healer.controller.Controller.wake`). The request is a
nudge, never a fact: the tick reads Prometheus as every tick does, so a payload naming nodes,
true or not, can at most cause one more poll (and those are coalesced: at most one per
``detection.wake_min_interval_seconds``).

Authentication: ``Authorization: Bearer <token>``, the token in ``detection.alertmanager_token_file``
(re-read per request, so a rotated Secret takes effect) or ``detection.alertmanager_token_env``;
compared in constant time. Alertmanager sends it with ``http_config: {authorization:
{credentials_file: ...}}`` (docs/operations.md). Without a configured token every request is
refused. This route needs no dashboard identity and no CSRF token; bodies are bounded by
``api.max_body_bytes`` before they are read (413, :mod:`api.limits`).

Answers:

- 200 ``{"woken": true, ...}``: an early tick will run; ``woken: false`` when no alert in the body
  is one of healer's (no ``healer_rule`` label): nothing to look at.
- 400: not an Alertmanager webhook message (version 4); the message names the field.
- 401: no token, a wrong one, or none configured (logged, with the caller's address).
- 404: no controller runs in this process (``healer serve``).
- 503: this replica does not lead (a standby): Alertmanager retries, and the Service may send the
  retry to the leader; the leader's poll sees the alert in any case.

Each answer is counted in ``healer_alertmanager_notifications_total{result}`` (:mod:`healer.metrics`).

Reads ``app.state.settings``, ``app.state.wake`` (a callable: True when an early tick will run,
None without a controller), ``app.state.ruleset_provider`` (each rule's node labels, for the log)
and ``app.state.metrics``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Sequence

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from healer.config import DetectionSettings, Settings
from healer.errors import TicketError
from healer.metrics import HealerMetrics
from healer.ruleset.schema import DEFAULT_NODE_LABELS, RuleSet
from healer.sources.alertmanager import NotificationError, read_notification
from healer.tickets.signing import load_secret

log = logging.getLogger(__name__)

router = APIRouter(tags=["alerts"])

WEBHOOK_PATH = "/api/v1/alertmanager/webhook"
#: ``healer_alertmanager_notifications`` results of the refusals, by status.
_REFUSALS = {400: "malformed", 401: "refused", 404: "no_controller", 503: "standby"}


class WebhookResult(BaseModel):
    """What the notification did: ``woken`` when an early tick will run."""

    woken: bool
    alerts: int = Field(description="Alerts in the notification.")
    healer_alerts: int = Field(description="Those of healer's rules (label healer_rule).")
    rules: list[str] = Field(description="The rules they name (at most 20).")
    nodes: list[str] = Field(description="The nodes they name, unchecked (at most 20).")


def _token(detection: DetectionSettings) -> bytes | None:
    try:
        return load_secret(
            env=detection.alertmanager_token_env,
            file=detection.alertmanager_token_file,
            what="the Alertmanager receiver (detection.alertmanager_token_*)",
        )
    except TicketError as exc:
        log.error("%s", exc)
        return None


def _refuse(client: str, why: str) -> HTTPException:
    log.warning("refused an Alertmanager notification from %s: %s", client, why)
    return HTTPException(401, f"Alertmanager receiver: {why}")


def _check_token(detection: DetectionSettings, authorization: str, client: str) -> None:
    token = _token(detection)
    if token is None:
        raise _refuse(
            client,
            "no token is configured (detection.alertmanager_token_file or _env): every request is refused",
        )
    scheme, _, given = authorization.partition(" ")
    if not authorization:
        raise _refuse(client, "no Authorization header (Alertmanager: http_config.authorization)")
    if scheme.lower() != "bearer" or not given.strip():
        raise _refuse(client, "Authorization must be 'Bearer <token>'")
    if not hmac.compare_digest(given.strip().encode(), token):
        raise _refuse(client, "wrong bearer token")


def _node_labels(rules: Callable[[], RuleSet | None] | None) -> Callable[[str], Sequence[str]]:
    ruleset = rules() if rules is not None else None
    by_rule = {r.name: r.node_labels for r in ruleset.rules} if ruleset is not None else {}
    return lambda name: by_rule.get(name, DEFAULT_NODE_LABELS)


def _handle(
    *,
    body: bytes,
    authorization: str,
    client: str,
    detection: DetectionSettings,
    wake: Callable[[], bool] | None,
    rules: Callable[[], RuleSet | None] | None,
) -> WebhookResult:
    _check_token(detection, authorization, client)
    try:
        summary = read_notification(body, node_labels=_node_labels(rules))
    except NotificationError as exc:
        log.warning("refused an Alertmanager notification from %s: %s", client, exc)
        raise HTTPException(400, str(exc)) from None
    if wake is None:
        raise HTTPException(
            404, "no controller runs in this process (healer serve): point Alertmanager at healer run"
        )
    result = WebhookResult(
        woken=False,
        alerts=summary.alerts,
        healer_alerts=summary.healer_alerts,
        rules=list(summary.rules),
        nodes=list(summary.nodes),
    )
    if not summary.healer_alerts:
        log.info("Alertmanager notification (receiver %r) has no alert of healer's rules", summary.receiver)
        return result
    if not wake():
        raise HTTPException(
            503, "this replica does not lead or does not run alerts mode; the leader polls on its own"
        )
    log.info(
        "Alertmanager: %d alert(s) of %s naming %s: early tick",
        summary.healer_alerts,
        ", ".join(summary.rules),
        ", ".join(summary.nodes) or "no node",
        extra={"truncated_alerts": summary.truncated},
    )
    return result.model_copy(update={"woken": True})


@router.post(
    WEBHOOK_PATH,
    response_model=WebhookResult,
    summary="Alertmanager webhook: tick now (alerts mode)",
    responses={400: {}, 401: {"description": "missing or wrong bearer token"}, 404: {}, 503: {}},
)
async def alertmanager_webhook(request: Request) -> WebhookResult:
    """Wake the controller for an early tick when an alert of healer's rules changed."""
    body = await request.body()  # bounded by the app's body limit (api.limits)
    state = request.app.state
    settings: Settings = state.settings
    metrics: HealerMetrics = state.metrics
    try:
        result = await run_in_threadpool(
            _handle,
            body=body,
            authorization=request.headers.get("authorization", ""),
            client=request.client.host if request.client else "unknown",
            detection=settings.detection,
            wake=getattr(state, "wake", None),
            rules=state.ruleset_provider,
        )
    except HTTPException as exc:
        metrics.count_notification(_REFUSALS.get(exc.status_code, "error"))
        raise
    metrics.count_notification("woken" if result.woken else "not_ours")
    return result
