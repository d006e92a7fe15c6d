"""``healer incident list|show`` and ``healer node show``: the history a user reads, on the
dashboard tests' seeded fleet (``tests.integration.test_api_support.seed``) in SQLite, plus two
closed incidents.

The seed (at NOW): gpu-node-07 (h100) quarantined, its open incident "GPU 3 too hot" (GpuTooHot)
with a finding, transitions, a dry-run cordon and a ticket whose delivery fails; gpu-node-03 (h100)
awaiting repair on an open incident "Xid 79" with an acknowledged ticket; gpu-node-11 (a100)
blocked, without an incident. Added here: gpu-node-07's closed XidFatal incident of 20 days ago
and gpu-node-11's closed GpuTooHot incident of 5 days ago.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from sqlalchemy import select
from typer.testing import CliRunner, Result

from healer.cli import app
from healer.cli.incident import option_time
from healer.model.states import ActionStatus
from healer.store import nodes as repo
from healer.store.models import Action, DomainIncident, Finding, Incident, Node
from healer.store.session import make_engine, make_sessionmaker, transaction
from tests.integration.test_api_support import NOW, seed

runner = CliRunner()


def _iso(delta: timedelta) -> str:
    return (NOW + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def db_url(migrated_sqlite_url: str) -> str:
    engine = make_engine(migrated_sqlite_url)
    factory = make_sessionmaker(engine)
    seed(factory)
    with transaction(factory) as s:
        hot = s.scalar(select(Incident).where(Incident.summary == "GPU 3 too hot"))
        assert hot is not None
        hot.rule = "GpuTooHot"
        node07 = s.scalar(select(Node).where(Node.name == "gpu-node-07"))
        node11 = s.scalar(select(Node).where(Node.name == "gpu-node-11"))
        assert node07 is not None and node11 is not None
        old = Incident(
            node_id=node07.id,
            opened_at=NOW - timedelta(days=20),
            closed_at=NOW - timedelta(days=18),
            summary="Xid 48 double-bit ECC",
            close_reason="repaired by the provider",
            rule="XidFatal",
        )
        cool = Incident(
            node_id=node11.id,
            opened_at=NOW - timedelta(days=5),
            closed_at=NOW - timedelta(days=4),
            summary="GPU 0 too hot",
            close_reason="returned to service",
        )
        s.add_all([old, cool])
        s.flush()
        s.add(
            Finding(
                rule="GpuTooHot",
                series_key="gpu-node-11/0",
                node_name="gpu-node-11",
                gpu="0",
                state="resolved",
                value=81.0,
                labels={"gpu": "0"},
                summary="GPU 0 above 78 C",
                active_since=NOW - timedelta(days=5),
                resolved_at=NOW - timedelta(days=4),
                last_seen_at=NOW - timedelta(days=4),
                incident_id=cool.id,
            )
        )
        repo.record_action(
            s,
            kind="ticket",
            status=ActionStatus.FAILED,
            actor="healer",
            now=NOW - timedelta(minutes=30),
            node=node07,
            incident=hot,
            error="POST https://provider.example/api?token=s3cret-token failed",
        )
    engine.dispose()
    return migrated_sqlite_url


def _run(db_url: str, *args: str) -> Result:
    return runner.invoke(app, list(args), env={"HEALER_DATABASE__URL": db_url})


def _out(db_url: str, *args: str) -> str:
    result = _run(db_url, *args)
    assert result.exit_code == 0, result.output
    return result.stdout


def _ids(db_url: str, *args: str) -> list[int]:
    return [r["id"] for r in json.loads(_out(db_url, "incident", "list", *args, "-o", "json"))]


#: The two GpuTooHot incidents' headlines: told by their latest finding, not the words they
#: opened with ("GPU 3 too hot", "GPU 0 too hot": their ``first_summary``).
HOT = "GpuTooHot firing on GPU 3 (value 85.5 degrees C): GPU 3 above 78 C"
COOLED = "GpuTooHot resolved on GPU 0 (last value 81): GPU 0 above 78 C"


def _incident_id(db_url: str, summary: str) -> int:
    (found,) = [
        r["id"]
        for r in json.loads(_out(db_url, "incident", "list", "-o", "json"))
        if r["first_summary"] == summary
    ]
    return int(found)


# --- healer incident list -----------------------------------------------------------------------


def test_incident_list_shows_every_incident_newest_first(db_url: str) -> None:
    table = _out(db_url, "incident", "list").splitlines()
    assert table[0].split() == ["ID", "STATE", "OPENED", "CLOSED", "NODE", "POOL", "RULE", "SUMMARY"]
    summaries = [line.split("  ")[-1].strip() for line in table[1:]]
    assert summaries == [HOT, "Xid 79", COOLED, "Xid 48 double-bit ECC"]
    hot = table[1]
    assert "open" in hot and _iso(-timedelta(hours=1)) in hot and "gpu-node-07" in hot and "GpuTooHot" in hot
    # An incident without healer's rule shows its findings' rules.
    assert "GpuTooHot" in table[3] and "gpu-node-11" in table[3] and "a100" in table[3]
    assert "closed" in table[4] and _iso(-timedelta(days=18)) in table[4]


def test_incident_list_speaks_json_and_yaml(db_url: str) -> None:
    records = json.loads(_out(db_url, "incident", "list", "-o", "json"))
    assert [r["first_summary"] for r in records] == [
        "GPU 3 too hot",
        "Xid 79",
        "GPU 0 too hot",
        "Xid 48 double-bit ECC",
    ]
    first = records[0]
    assert first["node"] == "gpu-node-07" and first["pool"] == "h100" and first["state"] == "open"
    assert first["rule"] == "GpuTooHot" and first["rules"] == ["GpuTooHot"]
    assert first["opened_at"] == _iso(-timedelta(hours=1)) and first["closed_at"] is None
    assert yaml.safe_load(_out(db_url, "incident", "list", "-o", "yaml")) == records


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--state", "open"], ["GPU 3 too hot", "Xid 79"]),
        (["--state", "closed"], ["GPU 0 too hot", "Xid 48 double-bit ECC"]),
        (["--rule", "GpuTooHot"], ["GPU 3 too hot", "GPU 0 too hot"]),  # healer's rule, or a finding's
        (["--rule", "XidFatal"], ["Xid 48 double-bit ECC"]),
        (["--pool", "a100"], ["GPU 0 too hot"]),
        (["--node", "gpu-node-07"], ["GPU 3 too hot", "Xid 48 double-bit ECC"]),
        (["--search", "XID"], ["Xid 79", "Xid 48 double-bit ECC"]),  # any case
        (["-q", "node-11"], ["GPU 0 too hot"]),  # the node's name
        (["--search", "gputoohot"], ["GPU 3 too hot"]),  # healer's rule
        (["--search", "%"], []),  # a literal, not a LIKE wildcard
        # Open at some time in the window: closed after --since, or still open.
        (["--since", _iso(-timedelta(days=10))], ["GPU 3 too hot", "Xid 79", "GPU 0 too hot"]),
        (["--until", _iso(-timedelta(days=3))], ["GPU 0 too hot", "Xid 48 double-bit ECC"]),
        (
            ["--since", _iso(-timedelta(days=19)), "--until", _iso(-timedelta(days=3))],
            ["GPU 0 too hot", "Xid 48 double-bit ECC"],
        ),
        (["--state", "open", "--pool", "h100", "--search", "hot"], ["GPU 3 too hot"]),
        (["--limit", "1"], ["GPU 3 too hot"]),
    ],
)
def test_incident_list_filters_narrow_the_list(db_url: str, args: list[str], expected: list[str]) -> None:
    records = json.loads(_out(db_url, "incident", "list", *args, "-o", "json"))
    assert [r["first_summary"] for r in records] == expected


def test_incident_list_says_when_nothing_matches(db_url: str) -> None:
    assert (
        _out(db_url, "incident", "list", "--node", "gpu-node-99").strip()
        == "no incidents match these filters"
    )


def test_incident_list_says_when_the_limit_cut_it(db_url: str) -> None:
    out = _out(db_url, "incident", "list", "--limit", "2")
    assert "(the newest 2; --limit shows more)" in out


def test_a_time_that_is_not_one_names_the_option(db_url: str) -> None:
    result = _run(db_url, "incident", "list", "--since", "last tuesday")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --since 'last tuesday' is not a time: use ISO 8601")


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("2h", timedelta(hours=2)),
        ("-7d", timedelta(days=7)),
        ("now-90m", timedelta(minutes=90)),
        ("now", timedelta()),
    ],
)
def test_since_and_until_take_durations_before_now(text: str, ago: timedelta) -> None:
    assert option_time("--since", text, NOW) == NOW - ago
    assert option_time("--until", "2026-02-01T00:00:00Z", NOW) == NOW.replace(month=2, day=1, hour=0)
    assert option_time("--since", None, NOW) is None


# --- healer incident show -----------------------------------------------------------------------


def test_incident_show_prints_its_findings_actions_tickets_and_transitions(db_url: str) -> None:
    hot = _incident_id(db_url, "GPU 3 too hot")
    out = _out(db_url, "incident", "show", str(hot))
    lines = out.splitlines()
    assert lines[0] == f"incident {hot}: node gpu-node-07 (pool h100)"
    assert f"state:    open since {_iso(-timedelta(hours=1))}" in lines
    assert "rule:     GpuTooHot" in lines and f"summary:  {HOT}" in lines
    assert "opened as: GPU 3 too hot" in lines
    findings = out[out.index("FINDINGS:") : out.index("ACTIONS:")]
    assert findings.splitlines()[1].split()[:4] == ["RULE", "GPU", "STATE", "VALUE"]
    assert "GpuTooHot  3    firing  85.5 degrees C" in findings
    actions = out[out.index("ACTIONS:") : out.index("TICKETS:")]
    assert "cordon" in actions and "dry_run" in actions
    assert "s3cret-token" not in out  # the action's error is redacted, as on the dashboard
    tickets = out[out.index("TICKETS:") : out.index("TRANSITIONS:")]
    assert "default" in tickets and "pending" in tickets and "provider unavailable" in tickets
    transitions = out[out.index("TRANSITIONS:") :].splitlines()
    assert transitions[1].split() == ["AT", "FROM", "TO", "ACTOR", "REASON"]
    # Oldest first: the incident's story in order.
    assert "suspect" in transitions[2] and "GpuTooHot pending" in transitions[2]
    assert "quarantined" in transitions[3] and "GpuTooHot firing for 5m" in transitions[3]


def test_incident_show_of_a_closed_incident_says_how_it_ended(db_url: str) -> None:
    old = _incident_id(db_url, "Xid 48 double-bit ECC")
    out = _out(db_url, "incident", "show", str(old))
    closed, opened = _iso(-timedelta(days=18)), _iso(-timedelta(days=20))
    assert f"state:    closed {closed}: repaired by the provider (opened {opened})" in out
    assert "FINDINGS: none" in out and "TICKETS: none" in out


def test_incident_outcome_is_set_by_hand_and_audited(db_url: str) -> None:
    old = _incident_id(db_url, "Xid 48 double-bit ECC")
    args = ("incident", "outcome", str(old), "not_confirmed", "-r", "reseated, fine since", "--actor", "bob")
    out = _out(db_url, *args)
    assert out.strip() == f"incident {old}: not_confirmed (operator, by bob)"
    engine = make_engine(db_url)
    with make_sessionmaker(engine)() as s:
        (row,) = s.scalars(select(Action).where(Action.kind == "outcome")).all()
        assert (row.actor, row.incident_id) == ("bob", old)
        assert row.detail is not None and row.detail["reason"] == "reseated, fine since"
    engine.dispose()
    hot = _incident_id(db_url, "GPU 3 too hot")  # still open
    result = _run(db_url, "incident", "outcome", str(hot), "confirmed")
    assert result.exit_code == 1 and f"incident {hot} is still open" in result.stderr


def test_incident_show_speaks_json_and_yaml(db_url: str) -> None:
    hot = _incident_id(db_url, "GPU 3 too hot")
    document = json.loads(_out(db_url, "incident", "show", str(hot), "-o", "json"))
    assert document["incident"]["id"] == hot and document["incident"]["state"] == "open"
    assert [f["rule"] for f in document["findings"]] == ["GpuTooHot"]
    assert document["findings"][0]["active_since"] == _iso(-timedelta(hours=1))
    assert [(a["kind"], a["status"]) for a in document["actions"]] == [
        ("cordon", "dry_run"),
        ("ticket", "failed"),
    ]
    assert "s3cret-token" not in json.dumps(document)
    assert [t["status"] for t in document["tickets"]] == ["pending"]
    assert [(t["from"], t["to"]) for t in document["transitions"]] == [
        ("healthy", "suspect"),
        ("suspect", "quarantined"),
    ]
    assert yaml.safe_load(_out(db_url, "incident", "show", str(hot), "-o", "yaml")) == document


def test_an_unknown_incident_is_an_error_naming_it(db_url: str) -> None:
    result = _run(db_url, "incident", "show", "9999")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: unknown incident 9999 (`healer incident list` lists them)"
    assert result.stdout == ""


# --- healer node show ---------------------------------------------------------------------------


def test_node_show_prints_state_open_incident_gpus_ticket_and_history(db_url: str) -> None:
    hot = _incident_id(db_url, "GPU 3 too hot")
    out = _out(db_url, "node", "show", "gpu-node-07")
    lines = out.splitlines()
    assert lines[0] == f"node gpu-node-07: quarantined since {_iso(-timedelta(minutes=55))} (pool h100)"
    assert lines[1] == f"open incident: {hot} (GpuTooHot), opened {_iso(-timedelta(hours=1))}: {HOT}"
    assert lines[2].startswith("ticket: ") and " default pending, created " in lines[2]
    gpus = out[out.index("GPUS:") : out.index("TICKETS:")].splitlines()
    assert gpus[1].split() == ["INDEX", "UUID", "MODEL", "PCI", "BUS", "LAST", "SEEN"]
    assert len([g for g in gpus if g]) == 2 + 8
    assert "GPU-0000-3" in gpus[5] and "NVIDIA H100 80GB HBM3" in gpus[5]
    assert "GpuTooHot" in out[out.index("ACTIVE FINDINGS:") : out.index("GPUS:")]
    incidents = out[out.index("RECENT INCIDENTS:") : out.index("LAST TRANSITIONS:")].splitlines()
    assert incidents[1].split() == ["ID", "STATE", "OPENED", "CLOSED", "RULE", "SUMMARY"]
    assert HOT in incidents[2] and "Xid 48 double-bit ECC" in incidents[3]
    transitions = out[out.index("LAST TRANSITIONS:") :].splitlines()
    assert "quarantined" in transitions[2] and "suspect" in transitions[3]  # newest first


def test_node_show_of_a_node_without_an_open_incident(db_url: str) -> None:
    out = _out(db_url, "node", "show", "gpu-node-11")
    assert out.splitlines()[1] == "open incident: none"
    assert "GPUS: none" in out and COOLED in out and "blocked" in out.splitlines()[0]


def test_node_show_limit_bounds_each_history(db_url: str) -> None:
    document = json.loads(_out(db_url, "node", "show", "gpu-node-07", "--limit", "1", "-o", "json"))
    assert [i["first_summary"] for i in document["incidents"]] == ["GPU 3 too hot"]
    assert [i["summary"] for i in document["incidents"]] == [HOT]
    assert [t["to"] for t in document["transitions"]] == ["quarantined"]


def test_node_show_speaks_json_and_yaml(db_url: str) -> None:
    document = json.loads(_out(db_url, "node", "show", "gpu-node-03", "-o", "json"))
    assert document["node"] == {
        "name": "gpu-node-03",
        "state": "awaiting_repair",
        "since": _iso(-timedelta(days=1)),
        "pool": "h100",
        "opted_out": False,
    }
    assert document["open_incident"]["summary"] == "Xid 79"
    assert [t["external_id"] for t in document["tickets"]] == ["RMA-42"]
    assert [f["rule"] for f in document["findings"]] == ["XidFatal"]
    assert document["gpus"] == []
    assert yaml.safe_load(_out(db_url, "node", "show", "gpu-node-03", "-o", "yaml")) == document


def test_an_unknown_node_is_an_error_naming_it(db_url: str) -> None:
    result = _run(db_url, "node", "show", "gpu-node-99")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: unknown node 'gpu-node-99' (`healer node list --all` lists the nodes healer knows)"
    )


def test_incident_show_names_the_domain_incident_it_is_part_of(db_url: str) -> None:
    """A node incident taken into a switch's fault says so, in the text and in JSON: the domain's
    one ticket covers it (no replacement ticket of its own)."""
    hot = _incident_id(db_url, "GPU 3 too hot")
    engine = make_engine(db_url)
    with transaction(make_sessionmaker(engine)) as s:
        domain = DomainIncident(
            kind="ib_leaf",
            name="leaf-3",
            size=16,
            first_seen=NOW - timedelta(minutes=70),
            opened_at=NOW - timedelta(minutes=60),
            members=[{"node": "gpu-node-07", "joined_at": _iso(-timedelta(minutes=60))}],
        )
        s.add(domain)
        s.flush()
        incident = s.get(Incident, hot)
        assert incident is not None
        incident.domain_incident_id = domain.id
        domain_id = domain.id
    engine.dispose()

    out = _out(db_url, "incident", "show", str(hot))
    assert (
        f"domain:   part of domain incident {domain_id} (ib_leaf leaf-3, open): one ticket for the "
        f"domain, on the dashboard at /domains/{domain_id}"
    ) in out.splitlines()
    shown = json.loads(_out(db_url, "incident", "show", str(hot), "-o", "json"))
    assert shown["incident"]["domain"] == {"id": domain_id, "kind": "ib_leaf", "name": "leaf-3", "open": True}
    old = _incident_id(db_url, "Xid 48 double-bit ECC")
    assert "domain:" not in _out(db_url, "incident", "show", str(old))
    listed = {r["id"]: r["domain"] for r in json.loads(_out(db_url, "incident", "list", "-o", "json"))}
    assert listed[hot] is not None and listed[old] is None
