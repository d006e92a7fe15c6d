"""Payload templates: valid JSON for any label text, errors that name template and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from healer.errors import TicketError
from healer.tickets.templates import PAYLOAD_VERSION, builtin_templates, render

HOSTILE = 'x"}], "injected": true, "a": ["\\\n\t</script><b>&{{ 7*7 }}{% raw %}\u2028\U0001f525\x00'


def context(label: str = "ok", *, escalated: bool = False, value: Any = 79.0) -> dict[str, Any]:
    finding = {
        "rule": "GpuXidErrors",
        "gpu": "GPU-0f1e2d3c",
        "severity": "critical",
        "value": value,
        "unit": "xid",
        "labels": {"UUID": "GPU-0f1e2d3c", "err_msg": label, "Hostname": "gpu-node-1"},
        "since": "2026-11-29T11:00:00+00:00",
        "fired_at": "2026-11-29T11:05:00+00:00",
        "summary": f"Xid 79 ({label})",
    }
    return {
        "version": PAYLOAD_VERSION,
        "idempotency_key": "healer-test-incident-1-acme",
        "cluster": "test",
        "provider": "acme",
        "ticket_id": 1,
        "callback_url": "http://dash/api/v1/tickets/1/status",
        "dashboard_url": "http://dash/nodes/gpu-node-1",
        "created_at": "2026-11-29T12:00:00+00:00",
        "title": f"[test] GPU node gpu-node-1 needs repair: GpuXidErrors {label}",
        "summary": f"GpuXidErrors: {label}",
        "severity": "critical",
        "node": {"name": "gpu-node-1", "pool": "a100", "state": "awaiting_repair", "url": "http://dash/n"},
        "incident": {"id": 1, "opened_at": "2026-11-29T11:00:00+00:00", "summary": label},
        "gpus": [
            {
                "uuid": "GPU-0f1e2d3c",
                "index": 3,
                "pci_bus_id": "00000000:3B:00.0",
                "model": label,
                "rules": [],
            }
        ],
        "findings": [finding],
        "rules": ["GpuXidErrors"],
        "escalated": escalated,
        "escalation": {"escalated": escalated, "window_days": 30, "reason": label, "previous": []},
    }


def test_builtins_shipped() -> None:
    assert {"generic.json.j2", "slack.json.j2", "jira.json.j2"} <= set(builtin_templates())


@pytest.mark.parametrize("name", ["generic.json.j2", "slack.json.j2", "jira.json.j2"])
@pytest.mark.parametrize("escalated", [False, True])
@pytest.mark.parametrize("value", [79.0, "NaN", None])
def test_hostile_labels_render_valid_json(name: str, escalated: bool, value: Any) -> None:
    payload = json.loads(render(name, context(HOSTILE, escalated=escalated, value=value)))
    assert "injected" not in payload
    assert "idempotency_key" in json.dumps(payload) or "healer-test-incident-1-acme" in json.dumps(payload)


def test_generic_keeps_label_text_exactly() -> None:
    payload = json.loads(render("generic.json.j2", context(HOSTILE)))
    assert payload["findings"][0]["labels"]["err_msg"] == HOSTILE
    assert payload["version"] == PAYLOAD_VERSION
    assert payload["idempotency_key"] == "healer-test-incident-1-acme"
    assert payload["gpus"][0]["pci_bus_id"] == "00000000:3B:00.0"


def test_slack_escapes_mrkdwn() -> None:
    text = json.dumps(json.loads(render("slack.json.j2", context("<!channel> & co"))))
    assert "<!channel>" not in text
    assert "&lt;!channel&gt; &amp; co" in text


def test_jira_has_create_issue_fields() -> None:
    payload = json.loads(render("jira.json.j2", context(escalated=True)))
    fields = payload["fields"]
    assert fields["project"] == {"key": "GPU"}
    assert "healer-test-incident-1-acme" in fields["labels"]
    assert "healer-repeat" in fields["labels"]


def test_template_from_the_templates_dir(tmp_path: Path) -> None:
    path = tmp_path / "mine.json.j2"
    path.write_text('{"node": {{ node.name | tojson }}}\n')
    assert json.loads(render("mine.json.j2", context(), templates_dir=tmp_path)) == {"node": "gpu-node-1"}


def test_syntax_error_names_template_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json.j2"
    path.write_text('{\n  "a": 1,\n  "b": {{ node.name | tojson }\n}\n')
    with pytest.raises(TicketError, match=r"broken\.json\.j2 line 3"):
        render(path.name, context(), templates_dir=tmp_path)


def test_undefined_variable_names_template_and_line(tmp_path: Path) -> None:
    path = tmp_path / "typo.json.j2"
    path.write_text('{\n  "a": 1,\n\n  "b": {{ nod.name | tojson }}\n}\n')
    with pytest.raises(TicketError, match=r"typo\.json\.j2 line 4: .*nod"):
        render(path.name, context(), templates_dir=tmp_path)


def test_output_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raw.json.j2"
    path.write_text('{"label": "{{ findings[0].labels.err_msg }}"}')
    with pytest.raises(TicketError, match=r"raw\.json\.j2 renders invalid JSON.*tojson"):
        render(path.name, context(HOSTILE), templates_dir=tmp_path)


def test_sandbox_blocks_unsafe_attribute(tmp_path: Path) -> None:
    path = tmp_path / "evil.json.j2"
    path.write_text('{"x": {{ node.__class__.__mro__ | tojson }}}')
    with pytest.raises(TicketError, match=r"evil\.json\.j2 line 1"):
        render(path.name, context(), templates_dir=tmp_path)


def test_unknown_template() -> None:
    with pytest.raises(TicketError, match=r"'nope\.j2' not found .*generic\.json\.j2"):
        render("nope.j2", context())


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../secrets.j2", "sub/dir.j2", "..", ".hidden", "a\\b.j2", ""]
)
def test_paths_are_refused_before_anything_is_read(tmp_path: Path, name: str) -> None:
    with pytest.raises(TicketError, match="must be a name"):
        render(name, context(), templates_dir=tmp_path)


def test_binary_template_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "blob.json.j2").write_bytes(bytes(range(256)) * 4)
    with pytest.raises(TicketError, match=r"blob\.json\.j2 is not UTF-8 text"):
        render("blob.json.j2", context(), templates_dir=tmp_path)
    (tmp_path / "nul.json.j2").write_bytes(b'{"a": 1}\x00')
    with pytest.raises(TicketError, match=r"nul\.json\.j2 is not text"):
        render("nul.json.j2", context(), templates_dir=tmp_path)


def test_symlink_out_of_the_templates_dir_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text('{"stolen": true}')
    inside = tmp_path / "dir"
    inside.mkdir()
    (inside / "link.json.j2").symlink_to(outside)
    with pytest.raises(TicketError, match="outside"):
        render("link.json.j2", context(), templates_dir=inside)


def test_oversized_template_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big.json.j2").write_text("{}" + " " * (300 * 1024))
    with pytest.raises(TicketError, match="larger than"):
        render("big.json.j2", context(), templates_dir=tmp_path)
