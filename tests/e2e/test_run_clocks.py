"""`healer run` replicas whose clocks disagree by three minutes (issue 24): one under libfaketime
+90 s, one at -90 s, on the real control plane and PostgreSQL. The Lease changes hands while a
finding is pending and again while a node is held clear, and neither the rule's ``for`` nor the
recovery hold is cut short or stretched: a new leader measures them on the clock both replicas
share (the database server's), not as its own "now" minus a time the other one stored.

Before: with ``for: 40s`` a node was quarantined 10-23 s after its finding started when a replica
whose clock runs ahead took over; one behind would have held it minutes too long.

Real processes and services: two `healer run` under Debian's libfaketime, KWOK nodes, a real
Prometheus scraping the fleet simulator, PostgreSQL. Times are the test's (and the API server's
audit log's) clock, which is neither replica's.
"""

from __future__ import annotations

import glob
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from healer.errors import BinaryNotFound
from healer.store.models import Node, Transition
from tests.e2e.harness import Healer, World, hot_gpu_rules
from tests.services import wait_until

pytestmark = pytest.mark.prometheus

FOR = 12.0  # seconds: the rule's for
HOLD = 12.0  # seconds: the recovery hold
LEASE = 5  # seconds: lease_duration_seconds (a takeover comes 5 s after the last renewal seen)
SLACK = LEASE + 4.0  # seconds: a takeover, a tick (1 s) and a loaded machine's scheduling

RULES = hot_gpu_rules("[quarantine]", hold=f"{FOR:.0f}s")


def transitions(sessions: sessionmaker[Session], node: str) -> list[Transition]:
    with sessions() as s:
        return list(s.scalars(select(Transition).join(Node).where(Node.name == node).order_by(Transition.id)))


def state(sessions: sessionmaker[Session], node: str) -> str | None:
    with sessions() as s:
        return s.scalar(select(Node.state).where(Node.name == node))


def libfaketime() -> str:
    """The path of Debian's libfaketime (package ``libfaketime``, which ``faketime`` depends on)."""
    found = sorted(
        glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1")
    )
    if not found:
        raise BinaryNotFound("libfaketime.so.1", package="libfaketime", where="/usr/lib")
    return found[0]


#: Python's ``time.sleep`` is ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``, which
#: libfaketime 0.9.10 answers EINVAL whatever its settings; timed waits on a condition work. The
#: skewed replicas import this (``sitecustomize``) so their sleeps (retries, back-offs) are waits.
SLEEP_SHIM = """
import threading
import time

_wait = threading.Event().wait


def _sleep(seconds):
    if seconds > 0:
        _wait(seconds)


time.sleep = _sleep
"""


def skewed(library: str, offset: str, site: Path) -> list[str]:
    """The command prefix that runs a process with its wall clock ``offset`` off (libfaketime
    preloaded by ``env``, which execs: the signals the test sends reach healer itself, where the
    ``faketime`` wrapper would fork). Only the wall clock: a faked monotonic clock breaks every
    timed wait (the kernel times them on the real one), and it has no offset to speak of anyway.
    ``site`` holds :data:`SLEEP_SHIM` as ``sitecustomize.py``."""
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLEEP_SHIM)
    return [
        "env",
        f"PYTHONPATH={site}",
        f"LD_PRELOAD={library}",
        f"FAKETIME={offset}",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
    ]


def hand_over(world: World, procs: dict[str, Healer], *, to: str) -> None:
    """Freeze every other replica (SIGSTOP) until ``to`` holds the Lease, then let them go on."""
    frozen = [h for name, h in procs.items() if name != to]
    for h in frozen:
        h.process.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: world.lease_holder() == to, timeout=60, what=f"{to} takes the Lease")
    finally:
        for h in frozen:
            h.process.send_signal(signal.SIGCONT)


@pytest.mark.postgres
def test_skewed_replicas_hand_over_without_cutting_for_or_the_hold_short(world: World, pg_url: str) -> None:
    library = libfaketime()
    world.add_nodes(3, pool="h100")
    bad = world.node_name(0)
    world.rules(RULES)
    sessions = world.sessions(pg_url)
    # The GPU heats up 10 s into the run: both replicas lead and stand by before it does.
    scenario = f"faults: [{{at: 10s, node: {bad}, gpu: 3, fault: hot_gpu, target: 90, ramp: 1s}}]"
    with world.metrics(3, scenario) as metrics:
        config = world.config(
            db=pg_url,
            prometheus_url=metrics.url,
            kubernetes={"lease_duration_seconds": LEASE, "renew_interval_seconds": 1},
            safety={"max_unhealthy": 1, "max_unhealthy_percent": 50, "recovery_hold_seconds": HOLD},
        )
        behind = world.start(
            config,
            identity="behind",
            log="behind.log",
            wrapper=skewed(library, "-90s", world.tmp_path / "site"),
        )
        wait_until(lambda: world.lease_holder() == "behind", timeout=60, what="the slow-clock replica leads")
        ahead = world.start(
            config,
            identity="ahead",
            log="ahead.log",
            wrapper=skewed(library, "+90s", world.tmp_path / "site"),
        )
        procs = {"behind": behind, "ahead": ahead}

        hot_query = f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} > 78'
        wait_until(lambda: metrics.prometheus.query(hot_query), timeout=90, interval=0.1, what="the GPU hot")
        hot_at = time.time()
        wait_until(lambda: state(sessions, bad) == "suspect", timeout=30, what="the finding pending")
        # The replica whose clock runs 180 s ahead takes over while the finding is pending.
        hand_over(world, procs, to="ahead")
        # A quarantine-only rule: quarantined, then awaiting_repair (no ticket) in the same pass.
        wait_until(lambda: bad in world.kube.cordons(), timeout=FOR + 60, what="cordoned")
        quarantined_at = world.kube.cordons()[bad]  # when the API server applied the cordon

        metrics.cool(bad)
        cool_query = f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{bad}"}} < 78'
        wait_until(lambda: metrics.prometheus.query(cool_query), timeout=30, interval=0.1, what="cool")
        cool_at = time.time()
        wait_until(lambda: state(sessions, bad) == "validating", timeout=30, what="validating")
        # And the one 180 s behind takes over while the node is held clear.
        hand_over(world, procs, to="behind")
        wait_until(lambda: state(sessions, bad) == "healthy", timeout=HOLD + 60, what="returned to service")
        returned_at = time.time()
        for h in procs.values():
            h.alive()
        moves = transitions(sessions, bad)
        for h in procs.values():
            h.stop()

    # Not before for/the hold (a tick's rounding aside), and not later than a takeover and a tick.
    assert FOR - 1.5 <= quarantined_at - hot_at <= FOR + SLACK, (hot_at, quarantined_at)
    assert HOLD - 1.5 <= returned_at - cool_at <= HOLD + SLACK, (cool_at, returned_at)
    # Each step was recorded by the replica that led then, with fencing numbers that only grow.
    by = [(t.to_state, t.holder) for t in moves]
    assert ("quarantined", "ahead") in by and ("healthy", "behind") in by, by
    tokens = [int(t.fencing_token) for t in moves if t.fencing_token is not None]
    assert tokens == sorted(tokens)
    # The recorded times are the shared clock's, not a replica's 90 s off: within seconds of ours.
    for t in moves:
        at = t.at.timestamp() if isinstance(t.at, datetime) else float(t.at)
        assert abs(at - quarantined_at) < 300 and abs(at - time.time()) < 600, t
