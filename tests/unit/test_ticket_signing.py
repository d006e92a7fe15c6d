"""Signatures, secrets and URL redaction; backoff and Retry-After arithmetic."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest

from healer.errors import SignatureError, TicketError
from healer.tickets import signing
from healer.tickets.delivery import backoff_seconds, retry_after_seconds

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SECRET = b"s3cr3t-value-for-tests"


class TestSignVerify:
    def test_round_trip_returns_the_digest(self) -> None:
        body = b'{"status": "resolved"}'
        headers = signing.signature_headers(SECRET, body=body, now=NOW)
        assert headers[signing.TIMESTAMP_HEADER] == str(int(NOW.timestamp()))
        assert headers[signing.SIGNATURE_HEADER].startswith("sha256=")
        digest = signing.verify(SECRET, headers=headers, body=body, now=NOW, max_skew_seconds=300)
        assert headers[signing.SIGNATURE_HEADER] == f"sha256={digest}"

    def test_signature_is_hmac_of_timestamp_dot_body(self) -> None:
        import hashlib
        import hmac

        expected = hmac.new(SECRET, b"1700000000.{}", hashlib.sha256).hexdigest()
        assert signing.sign(SECRET, timestamp=1700000000, body=b"{}") == f"sha256={expected}"

    @pytest.mark.parametrize(
        ("mutate", "message"),
        [
            (lambda h, b: ({}, b), "missing"),
            (lambda h, b: ({signing.TIMESTAMP_HEADER: h[signing.TIMESTAMP_HEADER]}, b), "missing"),
            (lambda h, b: (h, b + b" "), "does not match"),
            (lambda h, b: ({**h, signing.SIGNATURE_HEADER: "sha256=" + "0" * 64}, b), "does not match"),
            (lambda h, b: ({**h, signing.SIGNATURE_HEADER: "md5=abc"}, b), "sha256=<64 hex digits>"),
            (lambda h, b: ({**h, signing.TIMESTAMP_HEADER: "yesterday"}, b), "unix seconds"),
        ],
    )
    def test_refusals(self, mutate: object, message: str) -> None:
        body = b'{"status": "resolved"}'
        headers, body = mutate(signing.signature_headers(SECRET, body=body, now=NOW), body)  # type: ignore[operator]
        with pytest.raises(SignatureError, match=message):
            signing.verify(SECRET, headers=headers, body=body, now=NOW, max_skew_seconds=300)

    def test_wrong_secret_refused(self) -> None:
        headers = signing.signature_headers(b"other", body=b"{}", now=NOW)
        with pytest.raises(SignatureError, match="does not match"):
            signing.verify(SECRET, headers=headers, body=b"{}", now=NOW, max_skew_seconds=300)

    @pytest.mark.parametrize("offset", [-301, 301])
    def test_timestamp_outside_skew_refused(self, offset: int) -> None:
        headers = signing.signature_headers(SECRET, body=b"{}", now=NOW + timedelta(seconds=offset))
        with pytest.raises(SignatureError, match="clock skew"):
            signing.verify(SECRET, headers=headers, body=b"{}", now=NOW, max_skew_seconds=300)

    @pytest.mark.parametrize("offset", [-299, 299])
    def test_timestamp_inside_skew_accepted(self, offset: int) -> None:
        headers = signing.signature_headers(SECRET, body=b"{}", now=NOW + timedelta(seconds=offset))
        signing.verify(SECRET, headers=headers, body=b"{}", now=NOW, max_skew_seconds=300)


class TestSecrets:
    def test_from_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("T_SECRET", "abc123\n")
        assert signing.load_secret(env="T_SECRET", file=None, what="x") == b"abc123"

    def test_from_file_strips_newline(self, tmp_path: Path) -> None:
        (tmp_path / "secret").write_text("from-a-mount\n")
        assert signing.load_secret(env=None, file=tmp_path / "secret", what="x") == b"from-a-mount"

    def test_none_configured(self) -> None:
        assert signing.load_secret(env=None, file=None, what="x") is None

    def test_missing_env_names_variable_not_value(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("T_MISSING", raising=False)
        with pytest.raises(TicketError, match="provider acme: secret environment variable T_MISSING"):
            signing.load_secret(env="T_MISSING", file=None, what="provider acme")

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(TicketError, match="cannot read secret file"):
            signing.load_secret(env=None, file=tmp_path / "nope", what="x")


class TestBackoff:
    def test_full_jitter_window_doubles_and_caps(self) -> None:
        rng = random.Random(7)
        for attempts, high in [(1, 5.0), (2, 10.0), (3, 20.0), (10, 900.0), (200, 900.0)]:
            samples = [
                backoff_seconds(attempts, base_seconds=5, max_seconds=900, rng=rng) for _ in range(200)
            ]
            assert all(0.0 <= s <= high for s in samples)
            assert max(samples) > high * 0.8  # the whole window is used

    def test_retry_after_seconds(self) -> None:
        assert retry_after_seconds("120", now=NOW) == 120.0
        assert retry_after_seconds(None, now=NOW) is None
        assert retry_after_seconds("soon", now=NOW) is None

    def test_retry_after_http_date(self) -> None:
        when = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
        assert retry_after_seconds(when, now=NOW) == 90.0

    def test_retry_after_in_the_past_is_now(self) -> None:
        when = format_datetime(NOW - timedelta(seconds=90), usegmt=True)
        assert retry_after_seconds(when, now=NOW) == 0.0

    def test_retry_after_capped(self) -> None:
        assert retry_after_seconds(str(10**9), now=NOW) == 6 * 3600.0
