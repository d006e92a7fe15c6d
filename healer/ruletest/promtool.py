"""promtool's own test cases (``alert_rule_test``, ``promql_expr_test`` over Prometheus rule files),
run by ``promtool test rules`` itself.

Why promtool and not a reimplementation: promtool's verdict depends on Prometheus's rule manager
(``for``, ``keep_firing_for``, recording rules feeding later groups, ``group_eval_order``,
``ALERTS``), its Go template engine (``humanize``, ``$externalLabels``, ``printf``...), its series
loader (``stale`` is a staleness marker) and on quirks of the installed version (promtool 2.42 loads
a test without ``interval`` at interval 0). Only promtool gives promtool's verdict, and it ships in
the same Debian package (``prometheus``) as the Prometheus healer already needs for its own tests.

A file's verdict is promtool's on the file as written. When the file fails, each test case is run
again alone (the same file-level keys, the rule file paths resolved as promtool resolves them
against the original file's folder, the one test) so the failure is pinned to the test case's line:
promtool evaluates each test in a fresh storage and rule manager, so a test's verdict alone is its
verdict in the file.

Errors: promtool's messages, with its temporary file's path replaced by the test file's; a file that
promtool rejects as a whole (a YAML error, an unknown key: ``line N: field X not found``) is a
:class:`FileError` at ``file:line``.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from healer.ruleset.prometheus_import import is_prometheus_rule
from healer.sources.local_server import find_binary

#: promtool's own test keys; healer's engine never reads them.
PROMTOOL_TEST_KEYS = frozenset({"alert_rule_test", "promql_expr_test", "external_labels", "external_url"})
#: healer's extension keys: per test, and per file.
HEALER_TEST_KEYS = frozenset({"exp_findings", "exp_steps"})
HEALER_FILE_KEYS = frozenset({"safety", "recovery_hold"})

#: ``line 11: field exp_lables not found in type main.alert`` (yaml.v2's strict unmarshal).
_UNKNOWN_FIELD = re.compile(r"^\s*line (\d+): field (\S+) not found in type main\.(\w+)\s*$")
#: promtool's own framing lines, dropped from the failure text it prints.
_FRAMING = re.compile(r"^\s*(Unit Testing: .*|FAILED:|SUCCESS)\s*$")


@dataclass(frozen=True)
class Case:
    """One test case of a file: where it is, its name, and its YAML node (sent to promtool)."""

    line: int
    name: str
    node: CommentedMap


@dataclass(frozen=True)
class CaseFailure:
    case: Case
    message: str


@dataclass(frozen=True)
class FileError:
    """promtool rejected the file as a whole (no test case ran); ``message`` starts with file:line."""

    message: str


@dataclass(frozen=True)
class Verdict:
    """promtool's verdict on a file: its exit status, and the failing test cases (or a file error)."""

    passed: bool
    failures: list[CaseFailure]
    error: FileError | None = None


def resolve_rule_files(test_file: Path, entries: Sequence[Any]) -> list[str]:
    """The ``rule_files`` entries as promtool resolves them: a relative path is joined to the test
    file's folder (absolute here, so a copy elsewhere finds the same files); globs stay for promtool."""
    base = test_file.parent.absolute()
    return [
        str(e) if not str(e) or os.path.isabs(str(e)) else os.path.normpath(base / str(e)) for e in entries
    ]


def rule_file_kind(path: Path) -> str | None:
    """``prometheus`` for a Prometheus rule file (``alert:``/``record:`` rules), ``healer`` for
    healer's (``name:`` rules), None when it cannot tell (unreadable, no rules)."""
    try:
        doc = YAML(typ="safe").load(path.read_text())
    except (OSError, YAMLError):  # a broken file is reported by whichever loader runs it
        return None
    kinds: set[str] = set()
    for group in (doc or {}).get("groups") or [] if isinstance(doc, dict) else []:
        for rule in (group or {}).get("rules") or [] if isinstance(group, dict) else []:
            if isinstance(rule, dict):
                if is_prometheus_rule(rule):
                    kinds.add("prometheus")
                elif "name" in rule:
                    kinds.add("healer")
    return kinds.pop() if len(kinds) == 1 else None


def _dump(doc: CommentedMap) -> str:
    yaml = YAML(typ="rt")
    yaml.width = 4096  # keep long expressions and values on their lines
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return buf.getvalue()


def _promtool(path: Path) -> tuple[int, str]:
    """``promtool test rules path``: exit status and its output (stdout and stderr in order)."""
    done = subprocess.run(
        [find_binary("promtool", package="prometheus"), "test", "rules", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    return done.returncode, done.stdout


def _clean(output: str, shown: Path | str, actual: Path) -> str:
    """promtool's failure text without its framing, naming ``shown`` for the file it ran."""
    lines = [
        line.replace(str(actual), str(shown)).rstrip()
        for line in output.splitlines()
        if line.strip() and not _FRAMING.match(line)
    ]
    return "\n".join(lines)


def _file_error(output: str, shown: str, ran: Path, unchanged: bool) -> FileError | None:
    """A failure of the whole file before any test ran: promtool's YAML errors. Lines are the test
    file's own when promtool read it unchanged; an unknown key is named as such."""
    if "yaml:" not in output:
        return None
    mapped, other = [], []
    for line in _clean(output, shown, ran).splitlines():
        m = _UNKNOWN_FIELD.match(line)
        if m and unchanged:
            mapped.append(
                f"{shown}:{m.group(1)}: unsupported key {m.group(2)!r} "
                f"(the promtool on PATH knows no such key in its {m.group(3)})"
            )
        else:
            other.append(line.strip())
    if mapped:  # yaml.v2's header line says nothing the mapped lines do not
        other = [line for line in other if line != "yaml: unmarshal errors:"]
    lines = mapped + [f"{shown}: promtool: {line}" for line in other]
    return FileError("\n".join(lines) or f"{shown}: promtool: {output.strip()}")


def run_cases(
    test_file: Path,
    doc: CommentedMap,
    cases: Sequence[Case],
    *,
    unchanged: bool,
    rule_files: Sequence[str] | None = None,
    drop_keys: frozenset[str] = frozenset(),
) -> Verdict:
    """promtool's verdict on ``cases`` of ``test_file`` (its parsed ``doc``).

    ``unchanged``: ``cases`` are all of the file's tests as written, so promtool runs the file itself
    first. Otherwise (healer's files: their ``promql_expr_test`` parts) a copy of ``doc`` holding
    ``cases`` runs, with ``rule_files`` in place of the file's and the file keys ``drop_keys`` left out.
    """
    shown = str(test_file)
    files = (
        list(rule_files)
        if rule_files is not None
        else resolve_rule_files(test_file, list(doc.get("rule_files") or []))
    )
    with tempfile.TemporaryDirectory(prefix="healer-promtool-") as tmp:

        def copy(tests: Sequence[Case], name: str) -> Path:
            out = CommentedMap()
            for key, value in doc.items():
                if key not in drop_keys:
                    out[key] = value
            out["rule_files"] = files
            out["tests"] = CommentedSeq([c.node for c in tests])
            path = Path(tmp) / name
            path.write_text(_dump(out))
            return path

        whole = test_file if unchanged else copy(cases, "cases.yml")
        status, output = _promtool(whole)
        if status == 0:
            return Verdict(passed=True, failures=[])
        error = _file_error(output, shown, whole, unchanged)
        if error is not None:
            return Verdict(passed=False, failures=[], error=error)
        failures = []
        for i, case in enumerate(cases):
            alone = copy([case], f"case-{i}.yml")
            case_status, case_output = _promtool(alone)
            if case_status != 0:
                failures.append(CaseFailure(case, _clean(case_output, shown, alone)))
        if not failures:
            # Failed as a file but in no test alone: a file-level check (a repeated group_eval_order).
            return Verdict(
                passed=False, failures=[], error=FileError(f"{shown}: {_clean(output, shown, whole)}")
            )
        return Verdict(passed=False, failures=failures)
