"""The ``healer`` command in a terminal and in a pipe, as kubectl and promtool behave: tables cut to
the terminal's width (``-o wide`` for whole lines), exit 0 when the reader of a pipe leaves
(``| head -1``), and errors that say what was looked for and how to point healer elsewhere.

Each runs the installed entry point (``python -m healer``) in a process of its own, its stdout a
real terminal (a pseudo-terminal 80 columns wide), a pipe, or a pipe already closed.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.services import free_port

COLUMNS = 80


def _env() -> dict[str, str]:
    """No HEALER_ settings from the caller, and no COLUMNS: the terminal says how wide it is."""
    drop = ("COLUMNS", "LINES")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_") and k not in drop}
    return {**env, "PYTHONPATH": str(REPO)}  # this checkout, from any working directory


def healer(*args: str, cwd: Path = REPO, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healer", *args],
        cwd=cwd,
        env=_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


def in_terminal(*args: str) -> list[str]:
    """The lines ``healer ARGS`` writes to an 80-column terminal."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
    chunks = []
    with subprocess.Popen(
        [sys.executable, "-m", "healer", *args], cwd=REPO, env=_env(), stdout=follower, stderr=subprocess.PIPE
    ) as process:
        os.close(follower)
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's last writer has gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert process.stderr is not None
        errors = process.stderr.read().decode()
    assert process.returncode == 0, errors
    return b"".join(chunks).decode().replace("\r\n", "\n").splitlines()


def test_rules_show_fits_the_terminal_and_wide_keeps_whole_lines() -> None:
    table = in_terminal("rules", "show", "--no-promql")
    assert max(len(line) for line in table) <= COLUMNS
    assert any(line.endswith("…") for line in table)  # the expressions are cut
    wide = in_terminal("rules", "show", "--no-promql", "-o", "wide")
    assert max(len(line) for line in wide) > COLUMNS
    assert not any(line.endswith("…") for line in wide)
    assert [line[:40] for line in wide] == [line[:40] for line in table]  # same rows, same columns


def test_rules_show_in_a_pipe_writes_whole_lines() -> None:
    piped = healer("rules", "show", "--no-promql")
    assert piped.returncode == 0, piped.stderr
    lines = piped.stdout.splitlines()
    assert max(len(line) for line in lines) > COLUMNS
    assert lines == healer("rules", "show", "--no-promql", "-o", "wide").stdout.splitlines()


@pytest.mark.parametrize(
    "args",
    [
        ["rules", "show", "--no-promql"],
        ["rules", "show", "--no-promql", "-o", "yaml"],
        ["rules", "export", "--no-promql"],
        ["rules", "validate", "--no-promql", "-o", "json"],
        ["--help"],
    ],
    ids=" ".join,
)
def test_a_reader_that_left_ends_the_command_with_status_0(args: list[str]) -> None:
    """``healer rules show | head -1``: the reader has gone before healer writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = healer(*args, stdout=write_end)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


def test_rules_show_outside_the_repository_says_where_it_looked_and_how_to_point_it(tmp_path: Path) -> None:
    done = healer("rules", "show", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    first, hint = done.stderr.splitlines()
    looked = f"looked for {tmp_path / 'rules'}, the rules_paths setting"
    assert first == f"error: rules: no such file or directory ({looked})"
    assert "`healer rules show PATH...`" in hint
    assert "HEALER_RULES_PATHS=" in hint and "--config" in hint


def test_doctor_exporters_without_a_prometheus_says_how_to_point_at_one() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = healer("doctor", "exporters", "--prometheus", url)
    assert done.returncode == 1
    *_, error, hint = done.stderr.splitlines()  # after a promtool warning, where it is missing
    assert error.startswith("error: Prometheus could not be queried: ")
    assert hint.startswith(f"healer asked {url};")
    assert "--prometheus URL" in hint and "HEALER_PROMETHEUS__URL" in hint
