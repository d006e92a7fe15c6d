"""What a new user trips on in the first hour, as a separate ``healer`` process sees it: a command
pointed at nothing says what to set; a port 0 is a free port, named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.healer_cli import run_healer
from tests.services import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HEALER_DATABASE__URL": f"sqlite:///{tmp_path / 'healer.db'}",
        **extra,
    }


def test_evaluate_without_a_prometheus_names_the_flag_and_the_variable(tmp_path: Path) -> None:
    done = run_healer(
        "evaluate",
        "--once",
        "--no-store",
        "--prometheus",
        f"http://127.0.0.1:{free_port()}",
        env=env(tmp_path, HEALER_RULES_PATHS=f'["{REPO / "rules"}"]'),
    )
    assert done.returncode == 1
    assert "--prometheus URL, or HEALER_PROMETHEUS__URL" in done.stderr


def test_evaluate_outside_the_repository_says_where_it_looked(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "healer", "evaluate", "--once", "--no-store"],
        env=env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"looked for {tmp_path / 'rules'}" in done.stderr and "HEALER_RULES_PATHS" in done.stderr


def test_rules_test_fails_naming_the_path_when_nothing_would_run(tmp_path: Path) -> None:
    empty = tmp_path / "rules" / "tests"
    empty.mkdir(parents=True)
    done = run_healer("rules", "test", str(empty), env=env(tmp_path))
    assert done.returncode == 1
    assert f"no rule test files (*.yaml, *.yml) in {empty}" in done.stderr
    missing = run_healer("rules", "test", str(tmp_path / "nowhere"), env=env(tmp_path))
    assert missing.returncode == 1
    assert f"{tmp_path / 'nowhere'}: cannot read: No such file or directory" in missing.stderr


def test_serve_on_port_0_listens_on_a_free_port_and_says_which(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "healer", "serve", "--port", "0"],
        env=env(tmp_path, HEALER_RULES_PATHS=f'["{REPO / "rules"}"]'),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        for line in process.stderr:  # JSON lines; the one naming the address comes before serving
            found = re.search(r"dashboard on http://127\.0\.0\.1:(\d+)/", line)
            if found:
                port = int(found.group(1))
                assert port not in (0, 8080)
                break
        else:
            raise AssertionError("serve never said where it listens")
        # It answers there (and its uvicorn lines carry no terminal colour codes).
        assert wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200)
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=30)
    assert "color_message" not in rest
