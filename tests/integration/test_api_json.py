"""The JSON API (``/api/v1``) over a real uvicorn, on SQLite and PostgreSQL: lists, filters,
cursor pagination, node detail and history, actions, and the error bodies."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store.models import Finding
from tests.integration.test_api_support import (
    EVIL_LABEL,
    NOW,
    OPERATOR_TOKEN,
    VIEWER_TOKEN,
    Seeded,
    bearer,
    seeded_client,
)

OP = bearer(OPERATOR_TOKEN)
HOT_HEADLINE = "GpuTooHot firing on GPU 3 (value 85.5 degrees C, held 5m): GPU 3 above 78 C"


@pytest.fixture
def served(session_factory: sessionmaker[Session]) -> Iterator[tuple[httpx.Client, Seeded]]:
    with seeded_client(session_factory) as pair:
        yield pair


@pytest.fixture
def client(served: tuple[httpx.Client, Seeded]) -> httpx.Client:
    return served[0]


@pytest.fixture
def seeded(served: tuple[httpx.Client, Seeded]) -> Seeded:
    return served[1]


def assert_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


class TestLists:
    def test_nodes_unhealthy_newest_change_first(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/nodes", params={"unhealthy": True}).json()
        assert [n["name"] for n in body["items"]] == ["gpu-node-07", "gpu-node-11", "gpu-node-03"]
        hot = body["items"][0]
        assert hot["state"] == "quarantined"
        assert hot["rules"] == ["GpuTooHot"]
        assert hot["affected_gpus"] == ["3"]
        assert hot["gpu_count"] == 8
        # no GPU of gpu-node-11 recorded: unknown, never "0 GPUs"
        assert body["items"][1]["gpu_count"] is None
        assert hot["ticket"]["status"] == "pending"
        assert body["next_cursor"] is None

    @pytest.mark.parametrize(
        ("params", "names"),
        [
            ({"state": "awaiting_repair"}, ["gpu-node-03"]),
            ({"state": ["blocked", "quarantined"]}, ["gpu-node-07", "gpu-node-11"]),
            ({"pool": "a100", "sort": "name"}, ["gpu-node-11", "gpu-node-20", "gpu-node-21", "gpu-node-22"]),
            ({"rule": "XidFatal"}, ["gpu-node-03"]),
            ({"q": "node-2", "sort": "name"}, ["gpu-node-20", "gpu-node-21", "gpu-node-22"]),
            ({"q": "%"}, []),
        ],
    )
    def test_node_filters(self, client: httpx.Client, params: dict[str, object], names: list[str]) -> None:
        body = client.get("/api/v1/nodes", params=params).json()
        assert [n["name"] for n in body["items"]] == names

    @pytest.mark.parametrize("sort", ["name", "since"])
    def test_cursor_pagination_visits_every_node_once(self, client: httpx.Client, sort: str) -> None:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params: dict[str, object] = {"limit": 2, "sort": sort}
            if cursor:
                params["cursor"] = cursor
            body = client.get("/api/v1/nodes", params=params).json()
            seen += [n["name"] for n in body["items"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert sorted(seen) == sorted(set(seen)) and len(seen) == 6
        if sort == "name":
            assert seen == sorted(seen)

    def test_bad_cursors_are_400(self, client: httpx.Client) -> None:
        assert_error(client.get("/api/v1/nodes", params={"cursor": "garbage!"}), 400, "invalid_cursor")
        name_cursor = client.get("/api/v1/nodes", params={"limit": 1, "sort": "name"}).json()["next_cursor"]
        mixed = client.get("/api/v1/nodes", params={"cursor": name_cursor, "sort": "since"})
        assert_error(mixed, 400, "invalid_cursor")

    def test_validation_errors_are_422_with_the_error_body(self, client: httpx.Client) -> None:
        assert_error(client.get("/api/v1/nodes", params={"limit": 0}), 422, "validation_error")
        assert_error(client.get("/api/v1/nodes", params={"sort": "random"}), 422, "validation_error")

    def test_incidents(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/incidents").json()
        # Headlined by the incident's finding; gpu-node-03's finding is on no incident: as opened.
        assert [(i["node"], i["summary"], i["first_summary"]) for i in body["items"]] == [
            ("gpu-node-07", HOT_HEADLINE, "GPU 3 too hot"),
            ("gpu-node-03", "Xid 79", "Xid 79"),
        ]
        only = client.get("/api/v1/incidents", params={"node": "gpu-node-03", "open": True}).json()
        assert [i["node"] for i in only["items"]] == ["gpu-node-03"]
        assert_error(client.get("/api/v1/incidents", params={"node": "nope"}), 404, "not_found")

    def test_findings_with_values_and_labels(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/findings", params={"rule": "GpuTooHot"}).json()
        (finding,) = body["items"]
        assert finding["value"] == 85.5
        assert finding["labels"]["modelName"] == EVIL_LABEL  # JSON carries it as data, unchanged
        assert client.get("/api/v1/findings", params={"state": "resolved"}).json()["items"] == []

    def test_findings_paginate(self, client: httpx.Client) -> None:
        first = client.get("/api/v1/findings", params={"limit": 1}).json()
        second = client.get("/api/v1/findings", params={"limit": 1, "cursor": first["next_cursor"]}).json()
        assert first["items"][0]["id"] != second["items"][0]["id"]
        assert second["next_cursor"] is None

    def test_tickets_with_timings_and_delivery_errors(self, client: httpx.Client, seeded: Seeded) -> None:
        body = client.get("/api/v1/tickets", params={"open": True}).json()
        by_id = {t["id"]: t for t in body["items"]}
        hot = by_id[seeded.hot_ticket_id]
        assert hot["delivery_error"] == "HTTP 503: provider unavailable"
        assert hot["delivery_attempts"] == 3
        acked = by_id[seeded.acked_ticket_id]
        assert acked["time_to_acknowledge_seconds"] == 4 * 3600
        assert acked["age_seconds"] == 24 * 3600
        assert acked["external_id"] == "RMA-42"
        assert client.get("/api/v1/tickets", params={"open": False}).json()["items"] == []
        assert [
            t["node"] for t in client.get("/api/v1/tickets", params={"node": "gpu-node-03"}).json()["items"]
        ] == ["gpu-node-03"]

    def test_rules_with_health_and_rejected_reload(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/rules").json()
        assert body["loaded"] is True
        rules = {r["name"]: r for r in body["rules"]}
        assert rules["XidFatal"]["health"] == "error"
        assert rules["XidFatal"]["last_error"] == "bad_data: parse error"
        assert rules["XidFatal"]["firing_nodes"] == 1
        assert rules["GpuTooHot"]["health"] == "ok"
        assert rules["GpuTooHot"]["for_seconds"] == 300
        assert rules["GpuTooHot"]["actions"] == ["quarantine", "ticket"]
        assert "rules/bad.yaml:3:5" in body["rejected"][0]["error"]

    def test_audit_filters(self, client: httpx.Client) -> None:
        refused = client.get("/api/v1/audit", params={"status": "refused"}).json()["items"]
        assert [(a["kind"], a["target"]) for a in refused] == [("quarantine", "gpu-node-11")]
        assert refused[0]["error"].startswith("budget")
        dry = client.get("/api/v1/audit", params={"status": "dry_run", "kind": "cordon"}).json()["items"]
        assert [a["target"] for a in dry] == ["gpu-node-07"]
        assert client.get("/api/v1/audit", params={"actor": "nobody"}).json()["items"] == []

    def test_status(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/status").json()
        assert body["counts"]["quarantined"] == 1 and body["total"] == 6
        assert body["breaker"] == {
            "tripped": True,
            "reason": "6 nodes went bad in 300s",
            "tripped_at": NOW.isoformat(),
            "held": ["gpu-node-21"],
        }
        budgets = {b["pool"]: b for b in body["budgets"]}
        assert budgets["h100"]["out_of_service"] == 2  # quarantined + awaiting_repair
        assert body["last_tick"]["age_seconds"] == 20


class TestNode:
    def test_detail(self, client: httpx.Client) -> None:
        body = client.get("/api/v1/nodes/gpu-node-07").json()
        assert body["node"]["state"] == "quarantined"
        assert [g["index"] for g in body["gpus"]] == list(range(8))
        assert body["gpus"][3]["pci_bus_id"] == "00000000:15:00.0"
        assert body["open_incident"]["summary"] == HOT_HEADLINE
        assert body["open_incident"]["first_summary"] == "GPU 3 too hot"
        verdict = body["node"]["verdict"]
        assert verdict["fired"] == "GpuTooHot on GPU 3: 85.5 degrees C (threshold > 78), firing for 1h 0m"
        assert (verdict["value"], verdict["threshold"], verdict["held_seconds"]) == (85.5, "> 78", 3600.0)
        assert (
            verdict["did"] == "would have cordoned (dry-run), asked default for a repair (ticket #1, pending)"
        )
        assert verdict["human"] == "nothing: healer is handling it" and not verdict["needs_human"]
        assert [t["to_state"] for t in body["transitions"]] == ["quarantined", "suspect"]
        assert body["transitions"][0]["evidence"]["value"] == 85.5
        assert [a["kind"] for a in body["actions"]] == ["cordon"]
        assert body["tickets"][0]["provider"] == "default"

    def test_unknown_node_is_404(self, client: httpx.Client) -> None:
        assert_error(client.get("/api/v1/nodes/nope"), 404, "not_found")
        assert_error(client.get("/api/v1/nodes/nope/history"), 404, "not_found")

    def test_history_pages_through_many_transitions(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "gpu-node-20", now=NOW)
            for i in range(25):
                state = NodeState.SUSPECT if i % 2 == 0 else NodeState.HEALTHY
                repo.transition(
                    s, node, state, now=NOW + timedelta(seconds=i // 2), actor="healer", reason=f"r{i}"
                )
        reasons: list[str] = []
        cursor = None
        while True:
            params: dict[str, object] = {"limit": 10}
            if cursor:
                params["cursor"] = cursor
            body = client.get("/api/v1/nodes/gpu-node-20/history", params=params).json()
            reasons += [t["reason"] for t in body["items"]]
            cursor = body["next_cursor"]
            if not cursor:
                break
        # Equal timestamps are ordered by id: nothing lost or repeated at page edges.
        assert reasons == [f"r{i}" for i in reversed(range(25))]


def _hot_finding(node: str, incident_id: int | None, **kw: object) -> Finding:
    values: dict[str, object] = {
        "rule": "GpuTooHot",
        "series_key": f"{node}/0",
        "node_name": node,
        "gpu": "0",
        "state": "pending",
        "severity": "critical",
        "value": 79.0,
        "unit": "degrees C",
        "labels": {"gpu": "0", "Hostname": node},
        "summary": "GPU 0 above 78 C",
        "active_since": NOW - timedelta(minutes=20),
        "fired_at": None,
        "resolved_at": None,
        "last_seen_at": NOW - timedelta(minutes=20),
        "incident_id": incident_id,
    }
    return Finding(**{**values, **kw})


class TestHeadlineAndVerdict:
    def test_the_incident_headline_follows_a_later_finding(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        first = "GpuTooHot pending on GPU 0 (value 79 degrees C, acts if it holds 5m): GPU 0 above 78 C"
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "gpu-node-30", now=NOW - timedelta(days=1), pool="h100")
            incident = repo.ensure_incident(s, node, now=NOW - timedelta(minutes=20), summary=first)
            s.add(_hot_finding(node.name, incident.id))
            repo.transition(
                s, node, NodeState.SUSPECT, now=NOW - timedelta(minutes=20), actor="healer", reason=first
            )
        (opened,) = client.get("/api/v1/incidents", params={"node": "gpu-node-30"}).json()["items"]
        assert opened["summary"] == first
        assert (opened["value"], opened["unit"]) == (79.0, "degrees C")

        # Later ticks: it fired, and the node was drained at 84-86 C.
        with session_factory() as s, s.begin():
            s.execute(
                update(Finding)
                .where(Finding.series_key == "gpu-node-30/0")
                .values(state="firing", value=86.0, fired_at=NOW - timedelta(minutes=15), last_seen_at=NOW)
            )
            node = repo.get_or_create_node(s, "gpu-node-30", now=NOW)
            repo.transition(
                s, node, NodeState.DRAINING, now=NOW - timedelta(minutes=10), actor="healer", reason="x"
            )
        (now,) = client.get("/api/v1/incidents", params={"node": "gpu-node-30"}).json()["items"]
        assert now["summary"] == "GpuTooHot firing on GPU 0 (value 86 degrees C, held 5m): GPU 0 above 78 C"
        assert now["first_summary"] == first
        assert (now["rule"], now["gpu"], now["value"], now["evidence_at"]) == (
            "GpuTooHot",
            "0",
            86.0,
            "2026-03-01T12:00:00Z",
        )
        detail = client.get("/api/v1/nodes/gpu-node-30").json()
        assert detail["open_incident"]["summary"] == now["summary"]
        assert detail["node"]["verdict"]["value"] == 86.0
        page = client.get("/nodes/gpu-node-30").text
        # The page's incident line too (the timeline keeps the suspect step's own words).
        headline = page[page.index('data-testid="incident-headline">') :].split("</span>", 1)[0]
        assert "value 86 degrees C" in headline and "acts if it holds" not in headline
        assert "(opened as: GpuTooHot pending on GPU 0 (value 79 degrees C" in page

    def test_a_validating_node_keeps_its_rule_and_says_when_it_is_back(
        self, client: httpx.Client, session_factory: sessionmaker[Session]
    ) -> None:
        with session_factory() as s, s.begin():
            node = repo.get_or_create_node(s, "gpu-node-31", now=NOW - timedelta(days=1), pool="h100")
            incident = repo.ensure_incident(s, node, now=NOW - timedelta(hours=2), summary="GpuTooHot firing")
            incident.rule = "GpuTooHot"
            incident.cordoned_by_healer = True
            incident.expect_unschedulable = True
            incident.clear_since = NOW - timedelta(minutes=2)
            s.add(
                _hot_finding(
                    node.name,
                    incident.id,
                    state="resolved",
                    value=85.0,
                    active_since=NOW - timedelta(hours=2),
                    fired_at=NOW - timedelta(hours=2) + timedelta(minutes=5),
                    resolved_at=NOW - timedelta(minutes=3),
                    last_seen_at=NOW - timedelta(minutes=3),
                )
            )
            repo.transition(
                s,
                node,
                NodeState.VALIDATING,
                now=NOW - timedelta(minutes=3),
                actor="healer",
                reason="repaired",
            )
        (row,) = client.get("/api/v1/nodes", params={"state": "validating"}).json()["items"]
        assert (row["rules"], row["affected_gpus"]) == (["GpuTooHot"], ["0"])
        verdict = row["verdict"]
        assert verdict["waiting_for"] == "the recovery hold (5m, clear since 2026-03-01 11:58:00Z)"
        assert verdict["expected_back"] == "2026-03-01T12:03:00Z"
        assert verdict["fired"].startswith(
            "GpuTooHot on GPU 0: 85 degrees C (threshold > 78), cleared 3m 0s ago"
        )
        by_rule = client.get("/api/v1/nodes", params={"rule": "GpuTooHot"}).json()["items"]
        assert "gpu-node-31" in [n["name"] for n in by_rule]
        fragment = client.get("/fragments/fleet", params={"state": "validating"}).text
        assert "GpuTooHot" in fragment and "back by 2026-03-01 12:03:00Z" in fragment

    def test_a_node_blocked_by_the_budget_waits_for_room(self, client: httpx.Client) -> None:
        (row,) = client.get("/api/v1/nodes", params={"state": "blocked"}).json()["items"]
        assert row["verdict"]["waiting_for"].startswith("room in its pool's budget (budget: 2 of 2 nodes")
        assert not row["verdict"]["needs_human"]


class TestActions:
    def test_release(self, client: httpx.Client) -> None:
        r = client.post("/api/v1/nodes/gpu-node-07/release", json={"reason": "GPU 3 reseated"}, headers=OP)
        assert r.status_code == 200, r.text
        # A request: the controller's next tick moves the node (one writer of node state).
        assert r.json()["node"]["state"] == "quarantined"
        assert "release requested" in r.json()["message"]
        audit = client.get("/api/v1/audit", params={"kind": "release"}).json()["items"]
        rows = [(a["actor"], a["target"], a["status"]) for a in audit]
        assert rows == [("alice", "gpu-node-07", "pending")]
        assert audit[0]["detail"]["reason"] == "GPU 3 reseated"

    def test_release_refusals(self, client: httpx.Client) -> None:
        assert_error(client.post("/api/v1/nodes/gpu-node-20/release", headers=OP), 409, "conflict")
        assert_error(client.post("/api/v1/nodes/nope/release", headers=OP), 404, "not_found")

    def test_note(self, client: httpx.Client) -> None:
        r = client.post("/api/v1/nodes/gpu-node-07/notes", json={"text": "vendor on site tue"}, headers=OP)
        assert r.status_code == 200, r.text
        notes = client.get("/api/v1/nodes/gpu-node-07").json()["notes"]
        assert [(n["actor"], n["detail"]["text"]) for n in notes] == [("alice", "vendor on site tue")]
        assert_error(
            client.post("/api/v1/nodes/gpu-node-07/notes", json={"text": "   "}, headers=OP),
            422,
            "validation_error",
        )
        assert_error(
            client.post("/api/v1/nodes/gpu-node-07/notes", json={}, headers=OP), 422, "validation_error"
        )

    def test_pause_resume(self, client: httpx.Client) -> None:
        assert client.post("/api/v1/pause", json={"reason": "cooling work"}, headers=OP).status_code == 200
        status = client.get("/api/v1/status").json()
        assert (status["paused"], status["pause_reason"]) == (True, "cooling work")
        assert client.post("/api/v1/resume", headers=OP).status_code == 200
        assert client.get("/api/v1/status").json()["paused"] is False
        kinds = [a["kind"] for a in client.get("/api/v1/audit", params={"actor": "alice"}).json()["items"]]
        assert kinds == ["resume", "pause"]

    def test_breaker_reset(self, client: httpx.Client) -> None:
        r = client.post("/api/v1/breaker/reset", headers=OP)
        assert r.status_code == 200, r.text
        assert r.json()["held"] == ["gpu-node-21"]
        assert client.get("/api/v1/status").json()["breaker"]["tripped"] is False
        assert_error(client.post("/api/v1/breaker/reset", headers=OP), 409, "conflict")

    def test_ticket_close(self, client: httpx.Client, seeded: Seeded) -> None:
        r = client.post(
            f"/api/v1/tickets/{seeded.acked_ticket_id}/close", json={"reason": "replaced"}, headers=OP
        )
        assert r.status_code == 200, r.text
        assert (r.json()["ticket"]["status"], r.json()["ticket"]["closed_by"]) == ("closed", "alice")
        assert_error(
            client.post(f"/api/v1/tickets/{seeded.acked_ticket_id}/close", headers=OP), 409, "conflict"
        )
        assert_error(client.post("/api/v1/tickets/99999/close", headers=OP), 404, "not_found")
        audit = client.get("/api/v1/audit", params={"kind": "ticket_close"}).json()["items"]
        assert [a["actor"] for a in audit] == ["alice"]

    def test_viewer_token_is_refused_every_action(self, client: httpx.Client, seeded: Seeded) -> None:
        viewer = bearer(VIEWER_TOKEN)
        for path in (
            "/api/v1/nodes/gpu-node-07/release",
            "/api/v1/pause",
            "/api/v1/resume",
            "/api/v1/breaker/reset",
            f"/api/v1/tickets/{seeded.hot_ticket_id}/close",
        ):
            assert_error(client.post(path, headers=viewer), 403, "forbidden")
        assert_error(
            client.post("/api/v1/nodes/gpu-node-07/notes", json={"text": "x"}, headers=viewer),
            403,
            "forbidden",
        )
        assert client.get("/api/v1/nodes/gpu-node-07").json()["node"]["state"] == "quarantined"

    def test_unknown_route_and_method_use_the_error_body(self, client: httpx.Client) -> None:
        assert_error(client.get("/api/v1/nothing"), 404, "not_found")
        assert_error(client.get("/api/v1/pause"), 405, "method_not_allowed")


def test_openapi_documents_models(client: httpx.Client) -> None:
    spec = client.get("/openapi.json").json()
    assert "/api/v1/nodes" in spec["paths"]
    assert "/api/v1/nodes/{name}/release" in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert {"NodeSummary", "NodeDetail", "ErrorBody", "TicketOut", "RulesOut"} <= set(schemas)
    assert "/" not in spec["paths"]  # pages are not API
