"""``scripts/apt-install.sh`` (what ``.ci/run`` and ``scripts/demo.sh`` install with) waits for another
apt, as on a fresh cloud machine running unattended upgrades, instead of failing at once.

apt-get and sudo are stand-ins on PATH here: one that answers like apt-get while another apt holds
its locks, and logs how it was called.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "apt-install.sh"

#: A stand-in apt-get: `update` fails as apt-get does on a held lists lock while $LOCKED_UPDATES > 0
#: (one fewer each time) or for $UPDATE_ERROR; the first `install` fails as on stale package lists.
FAKE_APT_GET = r"""#!/usr/bin/env bash
echo "$*" >>"$LOG"
case " $* " in
  *" update "*)
    n=$(cat "$STATE/locked" 2>/dev/null || echo 0)
    if [ "$n" -gt 0 ]; then
      echo $((n - 1)) >"$STATE/locked"
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
      echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
      exit 100
    fi
    if [ -n "${UPDATE_ERROR:-}" ]; then echo "$UPDATE_ERROR" >&2; exit 100; fi
    touch "$STATE/updated";;
  *" install "*)
    if [ ! -e "$STATE/updated" ]; then echo "E: Unable to locate package prometheus" >&2; exit 100; fi;;
esac
"""


def run(tmp_path: Path, *, locked_updates: int, update_error: str = "") -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    (tmp_path / "locked").write_text(str(locked_updates))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "LOG": str(tmp_path / "log"),
        "STATE": str(tmp_path),
        "HEALER_APT_WAIT": "30",
        "UPDATE_ERROR": update_error,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "prometheus", "chromium"], env=env, capture_output=True, text=True, timeout=60
    )


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().splitlines()


def test_install_waits_for_the_dpkg_lock_and_update_for_the_lists_lock(tmp_path: Path) -> None:
    done = run(tmp_path, locked_updates=2)
    assert done.returncode == 0, done.stderr
    log = calls(tmp_path)
    installs = [c for c in log if " install " in f" {c} "]
    assert len(installs) == 2
    for install in installs:  # apt-get itself waits up to 30 s for the dpkg lock
        assert "-o DPkg::Lock::Timeout=30" in install
        assert install.endswith("install --no-install-recommends prometheus chromium")
    assert len([c for c in log if c.endswith(" update")]) == 3  # two refused while locked, then done
    assert done.stderr.count("another apt holds the package lists") == 1


def test_update_failing_for_another_reason_fails_at_once_with_apt_gets_message(tmp_path: Path) -> None:
    done = run(tmp_path, locked_updates=0, update_error="E: Failed to fetch http://deb.debian.org/")
    assert done.returncode != 0
    assert "E: Failed to fetch http://deb.debian.org/" in done.stderr
    assert len([c for c in calls(tmp_path) if c.endswith(" update")]) == 1


def test_ci_and_the_demo_install_through_it() -> None:
    for script in (REPO / ".ci" / "run", REPO / "scripts" / "demo.sh"):
        commands = [ln.strip() for ln in script.read_text().splitlines() if not ln.strip().startswith("#")]
        unquoted = [re.sub(r'"[^"]*"', "", c) for c in commands]  # messages may name apt-get
        assert not [c for c in unquoted if re.search(r"\bapt-get\s+(-\S+\s+)*(install|update)\b", c)], script
        assert [c for c in commands if "scripts/apt-install.sh" in c], script
