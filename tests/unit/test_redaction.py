"""One redaction for URLs and secrets (``healer.redaction``): URLs, free text, log records."""

from __future__ import annotations

import io
import json
import logging

import pytest

from healer.logs import configure_logging
from healer.redaction import redact_text, redact_url

SECRET = "s3cr3t-value-for-tests"


class TestRedaction:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            (
                "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXX",
                "https://hooks.slack.com/services/REDACTED/REDACTED/REDACTED",
            ),
            ("https://user:hunter2@example.com/api/issue", "https://REDACTED@example.com/api/issue"),
            (
                "https://example.com/hook?token=abc&team=gpu",
                "https://example.com/hook?token=REDACTED&team=REDACTED",
            ),
            (
                "https://discord.com/api/webhooks/123456/aBcDeFgHiJkLmNoP",
                "https://discord.com/api/webhooks/REDACTED/REDACTED",
            ),
            ("http://127.0.0.1:9300/intake/v1", "http://127.0.0.1:9300/intake/v1"),
            ("https://example.com/hook/a1b2c3d4e5f6a7b8c9d0/x", "https://example.com/hook/REDACTED/x"),
            ("https://jira.example.com/rest/api/2/issue", "https://jira.example.com/rest/api/2/issue"),
        ],
    )
    def test_redacts(self, url: str, expected: str) -> None:
        assert redact_url(url) == expected

    def test_text_replaces_urls_and_secrets(self) -> None:
        url = "https://x.example/services/T1/B2/SECRETTOKEN123456"
        text = f"POST {url} failed; echoed s3cr3t-value-for-tests"
        scrubbed = redact_text(text, urls=[url], secrets=[SECRET])
        assert "SECRETTOKEN" not in scrubbed
        assert "s3cr3t" not in scrubbed
        assert "x.example/services/REDACTED" in scrubbed

    def test_text_replaces_parts_of_known_urls_echoed_alone(self) -> None:
        url = "https://support.example/api/T1/tok3n5ecretvalue9876/create?apikey=k3y-abcdef"
        echoed = 'HTTP 404: {"error": "no route /api/T1/tok3n5ecretvalue9876/create", "key": "k3y-abcdef"}'
        text = redact_text(echoed, urls=[url])
        assert "tok3n5ecretvalue9876" not in text and "k3y-abcdef" not in text

    @pytest.mark.parametrize(
        ("text", "hidden"),
        [
            ("Prometheus http://user:pa55word@prom:9090: ConnectError", "pa55word"),
            ("connect postgresql+psycopg://healer:dbpass1@db/healer failed", "dbpass1"),
            ("sent Authorization: Bearer abcdef0123456789", "abcdef0123456789"),
            ('{"password": "hunter22", "user": "x"}', "hunter22"),
            ("retry https://x.example/hook?token=q1w2e3r4t5, later", "q1w2e3r4t5"),
        ],
    )
    def test_text_finds_secrets_it_was_not_told_about(self, text: str, hidden: str) -> None:
        redacted = redact_text(text)
        assert hidden not in redacted and "REDACTED" in redacted
        assert redact_text(redacted) == redacted  # idempotent

    def test_plain_text_is_untouched(self) -> None:
        text = "node gpu-node-07 quarantined: GPU 3 at 91 C (http://prometheus:9090/graph)"
        assert redact_text(text) == text


class TestLogs:
    def test_every_log_line_and_traceback_is_redacted(self, capsys: pytest.CaptureFixture[str]) -> None:
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        try:
            configure_logging("INFO", json=True)
            log = logging.getLogger("healer.test")
            log.info("prometheus at %s", "http://admin:pr0m-pass@prom:9090")
            try:
                raise RuntimeError("POST https://hooks.slack.com/services/T1/B2/XyZsecret123 failed")
            except RuntimeError:
                log.exception("delivery failed")
        finally:
            root.handlers[:], root.level = saved
        err = capsys.readouterr().err
        lines = [json.loads(line) for line in io.StringIO(err) if line.strip()]
        assert len(lines) == 2
        assert "pr0m-pass" not in err and "XyZsecret123" not in err
        assert lines[0]["message"] == "prometheus at http://REDACTED@prom:9090"
        assert "services/REDACTED" in lines[1]["exc_info"]
