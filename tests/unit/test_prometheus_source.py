"""The Prometheus source against a real HTTP server on loopback that answers like Prometheus.

Each test scripts the server's answer; nothing in the client is patched.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from healer.errors import QueryError, SourceUnavailable
from healer.sources.base import Deadline
from healer.sources.prometheus import PrometheusSource

AT = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


@dataclass
class Answer:
    status: int = 200
    body: bytes | str | dict[str, object] = b""
    content_type: str = "application/json"
    hang: bool = False  # accept the request, never answer (until the test ends)
    trickle: float = 0.0  # send the body one byte per this many seconds


@dataclass
class FakePrometheus:
    """A loopback server answering ``/api/v1/query`` with ``answer``; records each request."""

    url: str
    answer: Answer = field(default_factory=Answer)
    requests: list[dict[str, list[str]]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    state: FakePrometheus

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            state.requests.append({"path": [parts.path], **parse_qs(parts.query)})
            answer = state.answer
            if answer.hang:
                state.release.wait(30)
                return
            body = answer.body
            if isinstance(body, dict):
                body = json.dumps(body)
            if isinstance(body, str):
                body = body.encode()
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                if answer.trickle:
                    for i in range(len(body)):
                        if state.release.wait(answer.trickle):
                            return
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                else:
                    self.wfile.write(body)
            except OSError:
                pass  # the client gave up, as it should

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state = FakePrometheus(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield state
    state.release.set()
    server.shutdown()
    server.server_close()


def success(result: list[dict[str, object]], **extra: object) -> dict[str, object]:
    return {"status": "success", "data": {"resultType": "vector", "result": result}, **extra}


def series(value: str, **labels: str) -> dict[str, object]:
    return {"metric": labels, "value": [AT.timestamp(), value]}


def source(fake: FakePrometheus, **kwargs: float) -> PrometheusSource:
    return PrometheusSource(fake.url, **kwargs)


class TestSuccess:
    def test_samples_labels_and_values(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body=success([series("84.5", Hostname="n1", gpu="3")]))
        result = source(fake).query("DCGM_FI_DEV_GPU_TEMP > 78", at=AT)
        assert [(s.labels, s.value) for s in result.samples] == [({"Hostname": "n1", "gpu": "3"}, 84.5)]
        assert result.warnings == []

    def test_nan_and_infinities_are_parsed(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(
            body=success([series("NaN", gpu="0"), series("+Inf", gpu="1"), series("-Inf", gpu="2")])
        )
        values = [s.value for s in source(fake).query("x", at=AT).samples]
        assert math.isnan(values[0])
        assert values[1:] == [math.inf, -math.inf]

    def test_empty_result_is_success_not_failure(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body=success([]))
        result = source(fake).query("up == 0", at=AT)
        assert result.samples == []

    def test_warnings_are_kept(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body=success([series("1", node="n1")], warnings=["store eu-1 unavailable"]))
        result = source(fake).query("x", at=AT)
        assert result.warnings == ["store eu-1 unavailable"]
        assert len(result.samples) == 1

    def test_victoria_metrics_stats_are_ignored_and_a_partial_answer_is_a_warning(
        self, fake: FakePrometheus
    ) -> None:
        fake.answer = Answer(
            body=success([series("1", node="n1")], isPartial=True, stats={"seriesFetched": "1"})
        )
        result = source(fake).query("x", at=AT)
        assert [s.labels for s in result.samples] == [{"node": "n1"}]
        assert len(result.warnings) == 1 and "isPartial" in result.warnings[0]

    def test_scalar_result_is_one_unlabelled_sample(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(
            body={"status": "success", "data": {"resultType": "scalar", "result": [AT.timestamp(), "2"]}}
        )
        assert [(s.labels, s.value) for s in source(fake).query("1+1", at=AT).samples] == [({}, 2.0)]

    def test_one_get_at_the_tick_time_with_the_budget(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body=success([]))
        src = source(fake, timeout_seconds=4)
        src.query("up", at=AT)
        assert len(fake.requests) == 1
        request = fake.requests[0]
        assert request["path"] == ["/api/v1/query"]
        assert request["query"] == ["up"]
        assert float(request["time"][0]) == AT.timestamp()
        assert request["timeout"] == ["4000ms"]  # Prometheus durations take no fractions
        assert src.queries_sent == 1


class TestRuleErrors:
    def test_bad_data_is_a_query_error_with_the_promql(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(
            status=400,
            body={"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'},
        )
        with pytest.raises(QueryError, match=r"bad_data.*unexpected.*query: sum\(x\}"):
            source(fake).query("sum(x}", at=AT)
        assert len(fake.requests) == 1  # a broken rule is not retried

    def test_execution_error_is_a_query_error(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(
            status=422,
            body={"status": "error", "errorType": "execution", "error": "many-to-many matching not allowed"},
        )
        with pytest.raises(QueryError, match="many-to-many"):
            source(fake).query("a * b", at=AT)

    def test_victoria_metrics_422_with_the_status_as_error_type_is_a_query_error(
        self, fake: FakePrometheus
    ) -> None:
        # VictoriaMetrics 1.79's answer to `sum(` (errorType is the HTTP status).
        fake.answer = Answer(
            status=422,
            body={"status": "error", "errorType": "422", "error": 'singleExpr: unexpected token ""'},
        )
        with pytest.raises(QueryError, match=r"HTTP 422 422: singleExpr.*query: sum\("):
            source(fake).query("sum(", at=AT)
        assert len(fake.requests) == 1

    def test_victoria_metrics_422_for_a_timeout_is_unavailable(self, fake: FakePrometheus) -> None:
        # VictoriaMetrics 1.79's answer to a query queued past -search.maxQueryDuration.
        error = (
            "cannot execute query: timeout exceeded before starting the query processing: "
            "30.000 seconds (elapsed 33.775 seconds)"
        )
        fake.answer = Answer(status=422, body={"status": "error", "errorType": "422", "error": error})
        with pytest.raises(SourceUnavailable, match=r"HTTP 422 422: .*timeout exceeded"):
            source(fake).query("up", at=AT)

    def test_victoria_metrics_503_is_unavailable(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(status=503, body={"status": "error", "errorType": "503", "error": "timeout"})
        with pytest.raises(SourceUnavailable, match="HTTP 503 503"):
            source(fake).query("up", at=AT)


class TestUnavailable:
    @pytest.mark.parametrize(
        ("status", "error_type"), [(503, "timeout"), (500, "internal"), (499, "canceled")]
    )
    def test_server_errors_are_unavailable_without_retry(
        self, fake: FakePrometheus, status: int, error_type: str
    ) -> None:
        fake.answer = Answer(status=status, body={"status": "error", "errorType": error_type, "error": "x"})
        with pytest.raises(SourceUnavailable, match=f"HTTP {status} {error_type}"):
            source(fake).query("up", at=AT)
        assert len(fake.requests) == 1

    def test_plain_text_503_of_a_server_not_ready(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(status=503, body="Service Unavailable", content_type="text/plain; charset=utf-8")
        with pytest.raises(SourceUnavailable, match="HTTP 503, answer is not JSON: 'Service Unavailable'"):
            source(fake).query("up", at=AT)
        assert len(fake.requests) == 1

    def test_html_on_200_is_not_a_result(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body="<html>login</html>", content_type="text/html")
        with pytest.raises(SourceUnavailable, match="not JSON"):
            source(fake).query("up", at=AT)

    def test_json_that_is_not_an_api_answer(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body={"hello": "world"})
        with pytest.raises(SourceUnavailable, match="not a Prometheus API answer"):
            source(fake).query("up", at=AT)

    def test_malformed_data(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(body={"status": "success", "data": {"resultType": "vector"}})
        with pytest.raises(SourceUnavailable, match="malformed"):
            source(fake).query("up", at=AT)

    def test_connection_refused(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Nothing listens on the port any more.
        with pytest.raises(SourceUnavailable, match="Connection refused"):
            PrometheusSource(f"http://127.0.0.1:{port}").query("up", at=AT)

    def test_hanging_server_times_out_at_the_query_timeout(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(hang=True)
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match=r"timed out after 0\.3s"):
            source(fake, timeout_seconds=0.3).query("up", at=AT)
        assert 0.25 < time.monotonic() - started < 2.0
        assert len(fake.requests) == 1  # no hidden retry

    def test_tick_deadline_caps_the_query_timeout(self, fake: FakePrometheus) -> None:
        fake.answer = Answer(hang=True)
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match="timed out"):
            source(fake, timeout_seconds=10).query("up", at=AT, deadline=Deadline(0.3))
        assert time.monotonic() - started < 2.0

    def test_expired_deadline_sends_nothing(self, fake: FakePrometheus) -> None:
        with pytest.raises(SourceUnavailable, match="deadline passed before querying"):
            source(fake).query("up", at=AT, deadline=Deadline(0))
        assert fake.requests == []

    def test_trickling_answer_is_abandoned_at_the_budget(self, fake: FakePrometheus) -> None:
        # Each byte arrives well within the read timeout, but the whole answer would take ~10 s.
        fake.answer = Answer(body=success([series("1", node="n1")] * 3), trickle=0.05)
        started = time.monotonic()
        with pytest.raises(SourceUnavailable, match="ran out while reading"):
            source(fake, timeout_seconds=0.5).query("up", at=AT)
        assert time.monotonic() - started < 2.0


def test_credentials_in_the_url_are_redacted(fake: FakePrometheus) -> None:
    fake.answer = Answer(status=503, body="not ready", content_type="text/plain")
    url = fake.url.replace("http://", "http://admin:s3cret@")
    with pytest.raises(SourceUnavailable) as info:
        PrometheusSource(url).query("up", at=AT)
    assert "s3cret" not in str(info.value)
    assert "REDACTED@127.0.0.1" in str(info.value)  # one redaction marker everywhere
