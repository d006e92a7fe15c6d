"""The parts ledger on the dashboard as a user reads it (HTML over a real uvicorn, SQLite and
PostgreSQL): the Parts page, and the repeat-part flag on the page of a node holding a part that
failed before."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.model.states import NodeState
from healer.store import nodes as repo
from healer.store.models import Gpu
from tests.integration.test_api_pages import text_of as page_text
from tests.integration.test_api_support import (
    EVIL_SERIAL,
    MOVED_GPU,
    NOW,
    VIEWER_TOKEN,
    bearer,
    build_app,
    http_client,
    make_settings,
    seed_parts,
    seeded_client,
)
from tests.integration.test_api_support import (
    _failure as failure,
)


def text_of(page: httpx.Response) -> str:
    """The page's text as read (tags removed; no space left before a closing bracket or comma)."""
    return re.sub(r" ([),:])", r"\1", page_text(page))


@pytest.fixture
def client(session_factory: sessionmaker[Session]) -> Iterator[httpx.Client]:
    seed_parts(session_factory)
    with seeded_client(session_factory) as (c, _ids):
        yield c


def test_nav_links_to_the_parts_page(client: httpx.Client) -> None:
    assert '<a href="/parts" >Parts</a>' in client.get("/").text
    assert '<a href="/parts" aria-current="page">Parts</a>' in client.get("/parts").text


def test_parts_page_flags_the_repeat_part_first_with_where_it_failed(client: httpx.Client) -> None:
    page = client.get("/parts")
    assert page.status_code == 200
    text = text_of(page)
    assert "1 repeat part: failed again after a repair (on any node)" in text
    table = page.text.split('data-testid="parts"')[1].split("</table>")[0]
    rows = table.split("<tr")[2:]  # after the header row
    assert f'data-part="{MOVED_GPU}"' in rows[0] and 'data-testid="repeat-flag"' in rows[0]
    first = text_of(httpx.Response(200, text=rows[0]))
    assert (
        f"GPU {MOVED_GPU} (serial {EVIL_SERIAL}) repeat "
        "2026-03-01 09:00:00Z on gpu-node-a1, incident #" in first
    )
    assert "repaired 2026-03-01 11:00:00Z on gpu-node-b2" in first
    assert first.endswith("gpu-node-a1 gpu-node-b2 2h 0m")  # nodes, mean time between failures
    # The HCA repaired by a reboot is listed, not flagged as a repeat.
    assert 'data-part="gpu-node-c3/mlx5_0"' in rows[1] and "repeat-flag" not in rows[1]
    # The serial came from an exporter label: shown as text, never as markup.
    assert "<b>sn-1650</b>" not in page.text and html.escape(EVIL_SERIAL) in page.text


def test_parts_page_shows_repair_success_per_step_and_provider(client: httpx.Client) -> None:
    steps = text_of(
        httpx.Response(200, text=client.get("/parts").text.split('data-testid="repair-steps"')[1])
    )
    # Step, provider, attempts, succeeded, rate: the reset and the reboot returned their nodes; the
    # ticket for the repeat part is still open.
    assert "reboot node-agent 1 1 100%" in steps
    assert "reset-gpu node-agent 1 1 100%" in steps
    assert "ticket acme 1 0 0%" in steps


def test_parts_page_shows_time_between_failures_per_node(
    client: httpx.Client, session_factory: sessionmaker[Session]
) -> None:
    with session_factory() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-b2", now=NOW)
        repo.transition(
            s, node, NodeState.REPAIRED, now=NOW - timedelta(minutes=50), actor="healer", reason="r"
        )
        repo.close_incident(s, node, now=NOW - timedelta(minutes=40), reason="returned to service")
        repo.ensure_incident(s, node, now=NOW - timedelta(minutes=30), summary="again")
        repo.transition(
            s, node, NodeState.QUARANTINED, now=NOW - timedelta(minutes=30), actor="healer", reason="x"
        )
    nodes = text_of(
        httpx.Response(200, text=client.get("/parts").text.split('data-testid="node-failures"')[1])
    )
    assert "gpu-node-b2 2 30m 0s" in nodes  # most failures first
    assert "gpu-node-a1 1 -" in nodes


def test_parts_page_window_is_a_query_parameter(client: httpx.Client) -> None:
    text = text_of(client.get("/parts?days=1"))
    assert "over the last 1 days" in text
    assert client.get("/parts?days=0").status_code == 422
    assert client.get("/parts?days=abc").status_code == 422


def test_node_page_flags_a_repeat_part_with_its_id_serial_and_where_it_failed(client: httpx.Client) -> None:
    page = client.get("/nodes/gpu-node-b2")
    assert page.status_code == 200
    flag = page.text.split('data-testid="repeat-part"')[1].split("</div>")[0]
    assert 'class="banner error"' in page.text.split('data-testid="repeat-part"')[0].rsplit("<div", 1)[1]
    text = text_of(httpx.Response(200, text=flag))
    assert f"Repeat part: this node holds GPU {MOVED_GPU} (serial {EVIL_SERIAL})" in text
    assert "failed again after a repair, so it goes straight to replacement" in text
    assert "2026-03-01 09:00:00Z on gpu-node-a1, incident #" in text and "repaired" in text
    assert "2026-03-01 11:00:00Z on gpu-node-b2" in text
    assert '<a href="/nodes/gpu-node-a1">gpu-node-a1</a>' in flag
    assert "<b>sn-1650</b>" not in page.text


def test_node_page_flags_a_part_repaired_before(client: httpx.Client) -> None:
    page = client.get("/nodes/gpu-node-c3")
    assert page.text.count('data-testid="repeat-part"') == 1
    assert "Part repaired before: this node holds HCA gpu-node-c3/mlx5_0, which failed and was repaired" in (
        text_of(page)
    )


def test_a_part_repaired_in_the_open_incident_is_not_flagged_as_repaired_before(
    client: httpx.Client, session_factory: sessionmaker[Session]
) -> None:
    """gpu-node-d4's HCA fails, is repaired, and the node is validating in the same incident: not
    a part "repaired before" until that incident has closed."""
    at = NOW - timedelta(minutes=30)
    with session_factory() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-d4", now=at - timedelta(days=1), pool="h100")
        repo.ensure_incident(s, node, now=at, summary="InfinibandLinkDown firing")
        for state, minutes in (
            (NodeState.QUARANTINED, 0),
            (NodeState.REPAIRED, 5),
            (NodeState.VALIDATING, 6),
        ):
            evidence = failure(None, device="mlx5_1") if state == NodeState.QUARANTINED else None
            repo.transition(
                s,
                node,
                state,
                now=at + timedelta(minutes=minutes),
                actor="healer",
                reason="r",
                evidence=evidence,
            )
    assert 'data-testid="repeat-part"' not in client.get("/nodes/gpu-node-d4").text

    with session_factory() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-d4", now=NOW)
        repo.transition(s, node, NodeState.HEALTHY, now=NOW, actor="healer", reason="held clear")
        repo.close_incident(s, node, now=NOW, reason="returned to service")
    assert "Part repaired before: this node holds HCA gpu-node-d4/mlx5_1" in text_of(
        client.get("/nodes/gpu-node-d4")
    )


def test_node_holding_the_part_by_inventory_is_flagged(
    client: httpx.Client, session_factory: sessionmaker[Session]
) -> None:
    """The GPU that failed on gpu-node-a1 now sits in gpu-node-07 (its GPU inventory says so)."""
    assert 'data-testid="repeat-part"' not in client.get("/nodes/gpu-node-07").text
    with session_factory() as s, s.begin():
        node = repo.get_or_create_node(s, "gpu-node-07", now=NOW)
        s.add(Gpu(uuid=MOVED_GPU, node_id=node.id, index=9, first_seen=NOW, last_seen=NOW))
    text = text_of(client.get("/nodes/gpu-node-07"))
    assert f"Repeat part: this node holds GPU {MOVED_GPU}" in text


def test_a_node_whose_part_never_came_back_from_repair_is_not_flagged(client: httpx.Client) -> None:
    assert 'data-testid="repeat-part"' not in client.get("/nodes/gpu-node-20").text


def test_parts_page_has_no_script_and_the_dashboard_headers(client: httpx.Client) -> None:
    page = client.get("/parts")
    assert "<script" not in page.text.lower()
    directives = dict(
        d.strip().split(" ", 1) for d in page.headers["content-security-policy"].split(";") if d.strip()
    )
    assert directives["script-src"] == "'self'" and page.headers["x-frame-options"] == "DENY"


def test_parts_page_needs_the_viewer_role(session_factory: sessionmaker[Session]) -> None:
    seed_parts(session_factory)
    with http_client(build_app(session_factory, make_settings(anonymous_role="none"))) as c:
        assert c.get("/parts").status_code in (303, 401)  # a page: to the login form
        assert MOVED_GPU in c.get("/parts", headers=bearer(VIEWER_TOKEN)).text
