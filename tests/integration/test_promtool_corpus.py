"""promtool's own test files (tests/fixtures/promtool/, see its README) get the same verdict from
``healer rules test`` as from the real ``promtool test rules``: per file and per test case.

promtool prints no verdict per test case (its failure text names a test only for alert failures),
so each case's verdict is promtool's on a copy of the file holding that case alone, cut from the
file's text (every other test's lines left out, the rest byte for byte) in a copy of the corpus, so
``rule_files`` resolve as in the original. promtool evaluates each test in a fresh storage, so a
case's verdict alone is its verdict in the file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.healer_cli import run_healer
from tests.prometheus_releases import PrometheusRelease

pytestmark = pytest.mark.prometheus

CORPUS = REPO / "tests" / "fixtures" / "promtool"
#: Test files: a top-level ``tests:`` key (the rule files beside them have ``groups:``).
FILES = sorted(p for p in CORPUS.rglob("*.y*ml") if re.search(r"^tests:", p.read_text(), re.M))
#: Test cases (file, line of the case) written for Prometheus 2 that promtool 3 fails: range
#: selectors and the lookback window are left-open in Prometheus 3 (its migration guide), so a
#: sample exactly on a window's left edge is out. What each counts or finds on 3.x instead. Upstream
#: changed its own ``cmd/promtool/testdata/unittest.yml`` the same way (61 samples to 60) for 3.0.
LEFT_OPEN_FAILURES: dict[str, dict[int, str]] = {
    "helm-chart/xid_tests.yaml": {9: 'count_over_time(a{n="times"}[5m]) at 5m: 3 samples, not 4'},
    "prometheus-testdata/unittest.yml": {
        9: "timestamp(gpu_gap) at 5m: the sample at 0 is 5m old, outside the 5m lookback: nothing",
        53: "count_over_time(constant_one[1h]) at 1h: 60 evaluations, not 61",
        92: "count_over_time(gpu_temp[1m]) recorded at 1m: 60 samples, not 61",
    },
}


def _promtool(path: Path, promtool: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _cases(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """The file's lines and each test's line range [start, end) (0-based): the block sequence under
    the top-level ``tests:``, each item from its ``- `` line to the next one or the next top-level key."""
    lines = text.splitlines(keepends=True)
    top = next(i for i, line in enumerate(lines) if line.startswith("tests:"))
    starts: list[int] = []
    end = len(lines)
    indent: str | None = None
    for i in range(top + 1, len(lines)):
        line = lines[i]
        if line[:1] not in ("", " ", "#", "\n", "-"):
            end = i  # the next top-level key
            break
        m = re.match(r"^( *)- ", line)
        if m and (indent is None or m.group(1) == indent):
            indent = m.group(1)
            starts.append(i)
    return lines, [(s, e) for s, e in zip(starts, [*starts[1:], end], strict=True)]


def _promtool_case_verdicts(path: Path, tmp_path: Path, promtool: str) -> dict[int, bool]:
    """Per test case (its 1-based line): whether promtool passes the file cut down to it."""
    copy = tmp_path / "corpus"
    shutil.copytree(CORPUS, copy)
    lines, ranges = _cases(path.read_text())
    verdicts = {}
    for n, (start, end) in enumerate(ranges):
        others = {i for s, e in ranges if (s, e) != (start, end) for i in range(s, e)}
        alone = copy / path.relative_to(CORPUS).with_name(f"case-{n}-{path.name}")
        alone.write_text("".join(line for i, line in enumerate(lines) if i not in others))
        verdicts[start + 1] = _promtool(alone, promtool).returncode == 0
    return verdicts


def test_the_corpus_is_large_enough_and_has_files_meant_to_fail() -> None:
    assert len(FILES) >= 10
    assert len({p.relative_to(CORPUS).parts[0] for p in FILES}) >= 3
    assert sum("fail" in p.name for p in FILES) >= 2
    for path in FILES:  # each names the public file it follows
        assert "commit " in path.read_text().split("\n\n")[0], path


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(CORPUS)) for p in FILES])
def test_healer_gives_promtools_verdict_per_file_and_per_test(
    path: Path, tmp_path: Path, prometheus_release: PrometheusRelease
) -> None:
    promtool = prometheus_release.promtool  # BinaryNotFound: skipped, or failed in CI
    whole = _promtool(path, promtool)
    # The corpus means what its names say: promtool fails exactly the files named *fail*, and on
    # Prometheus 3 also those with a case its left-open windows change.
    left_open = (
        LEFT_OPEN_FAILURES.get(str(path.relative_to(CORPUS)), {}) if prometheus_release.major >= 3 else {}
    )
    meant_to_fail = "fail" in path.name or bool(left_open)
    assert (whole.returncode != 0) == meant_to_fail, whole.stdout + whole.stderr

    # healer runs the promtool and prometheus it finds on PATH: this release's.
    healer = run_healer("rules", "test", str(path), env={"PATH": prometheus_release.path()}, timeout=300)

    assert healer.returncode == (1 if whole.returncode else 0), healer.stderr
    if "yaml: unmarshal errors" in whole.stderr:
        # Rejected before any test ran: a file error at the offending key's line, as promtool's.
        line = re.search(r"line (\d+): field (\S+) not found", whole.stderr)
        assert line, whole.stderr
        assert f"error: {path}:{line.group(1)}: unsupported key {line.group(2)!r}" in healer.stderr, (
            healer.stderr
        )
        assert "1 file(s) not run" in healer.stderr
        return
    verdicts = _promtool_case_verdicts(path, tmp_path, promtool)
    assert (whole.returncode == 0) == all(verdicts.values())
    if "fail" not in path.name:  # exactly the cases the left-open windows change fail
        assert {line for line, ok in verdicts.items() if not ok} == set(left_open)
    failed_lines = {
        int(m) for m in re.findall(rf"^FAILED {re.escape(str(path))}:(\d+): ", healer.stderr, re.M)
    }
    assert failed_lines == {line for line, ok in verdicts.items() if not ok}, healer.stderr
    passed = sum(verdicts.values())
    summary = f"{passed} of {len(verdicts)} test(s) passed in 1 file(s)"
    assert summary in (healer.stdout if whole.returncode == 0 else healer.stderr)
