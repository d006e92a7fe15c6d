"""A service missing on a developer's machine skips the tests that need it, one summary line per
service, wherever the test reaches it (a session or module fixture, the test itself); in CI
(``HEALER_REQUIRE_SERVICES=1``) the same tests fail."""

from __future__ import annotations

import pytest

from tests.conftest import REPO

pytest_plugins = ["pytester"]

PLUGINS = ("-p", "tests.service_skips", "-p", "no:xdist", "-p", "no:cacheprovider")

MODULE = '''
import pytest

from healer.sources.local_server import find_binary
from tests.service_skips import require_binary


@pytest.fixture(scope="session")
def server():
    yield find_binary("healer-no-such-server", package="no-such-server")


@pytest.fixture(scope="module")
def tool():
    return require_binary("healer-no-such-tool", package="no-such-tools")


def test_uses_the_server(server): ...
def test_uses_the_server_too(server): ...
def test_uses_the_tool(tool): ...
def test_runs_the_tool_itself():
    require_binary("healer-no-such-tool", package="no-such-tools")
def test_needs_nothing(): ...
'''


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.delenv("HEALER_REQUIRE_SERVICES", raising=False)
    pytester.makepyfile(test_services=MODULE)
    return pytester


def test_a_missing_service_skips_with_one_line_per_service(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess(*PLUGINS, "-rs")
    result.assert_outcomes(passed=1, skipped=4)
    skip_lines = [ln for ln in result.outlines if ln.startswith("SKIPPED")]
    assert len(skip_lines) == 2, skip_lines
    server_line, tool_line = sorted(skip_lines)
    assert server_line.startswith("SKIPPED [2]")
    assert "healer-no-such-server not found on PATH (Debian/Ubuntu package 'no-such-server')" in server_line
    assert tool_line.startswith("SKIPPED [2]")
    assert "healer-no-such-tool not found on PATH (Debian/Ubuntu package 'no-such-tools')" in tool_line
    assert "bash .ci/run installs every service" in tool_line


def test_in_ci_a_missing_service_fails_its_tests(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEALER_REQUIRE_SERVICES", "1")
    result = suite.runpytest_subprocess(*PLUGINS)
    result.assert_outcomes(passed=1, failed=1, errors=3)
    result.stdout.fnmatch_lines(["*healer-no-such-server not found on PATH*HEALER_REQUIRE_SERVICES=1*"])
