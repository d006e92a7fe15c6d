"""The rules' record over a real uvicorn, on SQLite and PostgreSQL: ``GET /api/v1/trust`` and the
Trust page from a closed incident's outcome (the metrics, on the wall clock, are in
tests/e2e/test_run_trust.py), and an operator's outcome edit
(audited, kept, refused for viewers and open incidents)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store import outcomes
from tests.integration.test_api_support import NOW, OPERATOR_TOKEN, VIEWER_TOKEN, bearer, seeded_client

OP = bearer(OPERATOR_TOKEN)
RULE = "TrustRecordRule"


@pytest.fixture
def served(session_factory: sessionmaker[Session]) -> Iterator[tuple[httpx.Client, int, int]]:
    """The seeded app plus a node quarantined by RULE for 2 h that recovered with no repair
    (closed), and one still out (open)."""
    with seeded_client(session_factory) as (client, _):
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "trust-node-1", now=NOW - timedelta(days=2), pool="h100")
            at = NOW - timedelta(days=1)
            incident = repo.ensure_incident(s, node, now=at, summary=f"{RULE} firing")
            incident.rule = RULE
            incident.gpus = 8
            for hours, state in (
                (0, NodeState.SUSPECT),
                (1, NodeState.QUARANTINED),
                (2, NodeState.VALIDATING),
            ):
                repo.transition(
                    s,
                    node,
                    state,
                    now=at + timedelta(hours=hours),
                    actor="healer",
                    reason="t",
                    incident=incident,
                )
            repo.transition(
                s,
                node,
                NodeState.HEALTHY,
                now=at + timedelta(hours=3),
                actor="healer",
                reason="held",
                incident=incident,
            )
            repo.close_incident(s, node, now=at + timedelta(hours=3), reason="returned to service")
            s.flush()
            outcomes.settle(s, incident, now=at + timedelta(hours=3))
            other = repo.get_or_create_node(s, "trust-node-2", now=NOW - timedelta(days=2), pool="h100")
            open_one = repo.ensure_incident(s, other, now=NOW - timedelta(hours=1), summary="open")
            open_one.rule = RULE
            s.flush()
            ids = (incident.id, open_one.id)
        yield client, *ids


def record(client: httpx.Client) -> dict[str, object]:
    rules = {r["rule"]: r for r in client.get("/api/v1/trust", params={"days": 7}).json()["rules"]}
    return rules[RULE]


def test_a_recovery_without_repair_is_a_false_quarantine_until_an_operator_says_otherwise(
    served: tuple[httpx.Client, int, int],
) -> None:
    client, closed, still_open = served
    first = record(client)
    # Out from the quarantine (1 h) to the close (3 h): 2 h x 8 GPUs.
    assert (first["decided"], first["confirmed"], first["false_quarantines"], first["precision"]) == (
        1,
        0,
        1,
        0.0,
    )
    assert first["bases"] == {"recovered": 1}
    assert (first["gpu_hours"], first["node_hours"], first["median_time_to_repair_seconds"]) == (
        16.0,
        2.0,
        7200.0,
    )
    page = client.get("/trust", params={"days": 7}).text
    assert f'data-rule="{RULE}"' in page and "16.00" in page

    path = f"/api/v1/incidents/{closed}/outcome"
    assert client.post(path, json={"outcome": "confirmed"}, headers=bearer(VIEWER_TOKEN)).status_code == 403
    assert client.post(path, json={"outcome": "maybe"}, headers=OP).status_code == 422
    r = client.post(path, json={"outcome": "confirmed", "reason": "DCGM diag failed on GPU 3"}, headers=OP)
    assert r.status_code == 200, r.text
    # The incidents page and API filter by it.
    def listed(outcome: str) -> list[int]:
        items = client.get("/api/v1/incidents", params={"outcome": outcome}).json()["items"]
        return [i["id"] for i in items]

    assert listed("confirmed") == [closed] and listed("not_confirmed") == []
    page = client.get("/incidents", params={"outcome": "confirmed"}).text
    assert f'data-incident="{closed}"' in page
    after = record(client)
    assert (after["confirmed"], after["false_quarantines"], after["precision"], after["bases"]) == (
        1,
        0,
        1.0,
        {"operator": 1},
    )
    (audit,) = client.get("/api/v1/audit", params={"kind": "outcome"}).json()["items"]
    assert audit["actor"] == "alice"
    assert audit["detail"]["from"]["outcome"] == "not_confirmed"
    assert audit["detail"]["to"] == {"outcome": "confirmed", "basis": "operator", "by": "alice"}
    assert audit["detail"]["reason"] == "DCGM diag failed on GPU 3"

    # Back to the derived outcome; an open incident has none to set; an unknown one is 404.
    assert client.post(path, json={"outcome": None}, headers=OP).status_code == 200
    assert record(client)["bases"] == {"recovered": 1}
    assert listed("not_confirmed") == [closed] and listed("confirmed") == []
    assert (
        client.post(
            f"/api/v1/incidents/{still_open}/outcome", json={"outcome": "confirmed"}, headers=OP
        ).status_code
        == 409
    )
    assert (
        client.post("/api/v1/incidents/999999/outcome", json={"outcome": "confirmed"}, headers=OP).status_code
        == 404
    )
