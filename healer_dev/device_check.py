"""The device check (``scripts/device-check.sh``): the agent's NVML reader and exporter on a real GPU,
each fact the default rules read beside what the simulator assumes for the same field.

It reads the GPUs through :func:`healer.nodeagent.nvml.open_nvml` (the real NVML, or ``--recorded``
a recording), the kernel log (``--kmsg``, default ``/dev/kmsg``: root or CAP_SYSLOG) and the
InfiniBand ``hw_counters`` (``--sysfs``, default ``/sys``) with the agent's readers, serves them
with the agent's exporter on loopback, scrapes that ``/metrics`` once, prints a line on the kernel
log, one on the HCAs and one on the log bundle the agent would attach to a ticket (captured as
before a reboot, with ``--bundle-command``'s output, default ``nvidia-smi -q``: its encoded size
against the annotation's limit, the time it took, the command's exit), and, for every DCGM
metric the default pack (``rules/``) reads:

* the agent's answer: present or why not, Prometheus type, unit, integral or not, the values over
  the GPUs (min..max);
* the simulator's assumption (``healer_dev.simulator``): whether it emits the metric, its type, its
  value format (``d`` integer, ``f`` decimal), its unit (from the help text) and the range of its
  healthy fleet (busy and idle nodes, three moments);
* a verdict: ``ok``, or what differs (type, integral or not, presence, a value outside the
  simulated healthy range, which is a note, not a failure: an idle or a hot GPU is still a GPU).

Exit 0 when NVML answered (whatever the verdicts), 2 when NVML is not available (the reason
printed). Offline: it needs the checkout and its virtual environment, nothing else.
``--out DIR`` also writes what NVML answered as a recording (``nvml-recording.json``, a fixture
from real hardware), the scrape (``metrics.prom``) and the bundle's text (``log-bundle.txt``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import re
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from healer.model.repair import decode_bundle
from healer.nodeagent.bundle import ENCODED_MAX_BYTES, Capture
from healer.nodeagent.exposition import serve
from healer.nodeagent.facts import HostFacts
from healer.nodeagent.infiniband import read_hw_counters
from healer.nodeagent.kmsg import DevKmsg, KmsgFile, KmsgSource, parse_xid
from healer.nodeagent.nvml import FACTS, NvmlCalls, NvmlUnavailable, RecordingNvml, open_nvml, read_nvml
from healer.ruleset.loading import load_ruleset
from healer_dev.simulator import catalog as c
from healer_dev.simulator.fleet import Fleet, FleetConfig

REPO = Path(__file__).resolve().parents[1]
_DCGM = re.compile(r"\bDCGM_(?:FI|EXP)_[A-Z0-9_]+")
#: Metric names the rules accept as another name of the same field (rules/gpu-thermal.yaml, field 112).
ALIASES = {
    "DCGM_FI_DEV_GPU_TEMP_MARGIN_CELSIUS": "DCGM_FI_DEV_GPU_TEMP_LIMIT",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}
_KERNEL_LOG = {"DCGM_FI_DEV_XID_ERRORS", "DCGM_EXP_XID_ERRORS_COUNT"}


def rule_metrics(rules: Path = REPO / "rules") -> list[str]:
    """Every DCGM metric name the pack's expressions read, sorted."""
    names: set[str] = set()
    for rule in load_ruleset([rules], promtool=False).rules:
        names.update(m for m in _DCGM.findall(rule.expr) if not m.startswith("DCGM_FR_"))
    return sorted(names)


@dataclass(frozen=True)
class Observed:
    """A metric as one side sees it: present, type, unit, values, and why absent."""

    present: bool
    kind: str = ""
    unit: str = ""
    integral: bool | None = None
    low: float = math.nan
    high: float = math.nan
    why: str = ""

    def values(self) -> str:
        if not self.present or math.isnan(self.low):
            return "-"
        return f"{self.low:g}" if self.low == self.high else f"{self.low:g}..{self.high:g}"


def _samples(text: str) -> dict[str, tuple[str, list[float]]]:
    out: dict[str, tuple[str, list[float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, (family.type, []))[1].append(float(s.value))
    return out


def _observed(kind: str, unit: str, values: Sequence[float]) -> Observed:
    return Observed(
        present=True,
        kind=kind,
        unit=unit,
        integral=all(float(v).is_integer() for v in values),
        low=min(values),
        high=max(values),
    )


def simulator_assumptions() -> dict[str, Observed]:
    """The simulated dcgm-exporter's families: type, format, unit, healthy range (busy and idle
    nodes at 0, 5 and 10 minutes)."""
    families = {f.name: f for f in (*c.DCGM_FAMILIES, *c.NVLINK5_FAMILIES, c.XID_COUNT_FAMILY)}
    fleet = Fleet(FleetConfig(nodes=6, idle_fraction=0.5, seed=7, exporter_version="4.x"))
    seen: dict[str, list[float]] = {}
    for node in fleet.node_names:
        for t in (0.0, 300.0, 600.0):
            for name, (_kind, values) in _samples(fleet.render_dcgm(node, t)).items():
                seen.setdefault(name, []).extend(values)
    out: dict[str, Observed] = {}
    for name, fam in families.items():
        unit_match = re.search(r"\(in ([^)]+)\)", fam.help)
        unit = unit_match.group(1) if unit_match else ""
        values = seen.get(name, [])
        if values:
            o = _observed(fam.type, unit, values)
            out[name] = Observed(True, fam.type, unit, fam.fmt == "d", o.low, o.high)
        else:
            out[name] = Observed(True, fam.type, unit, fam.fmt == "d", why="emitted only on a fault")
    return out


def agent_observations(scrape: str, nvml_error: str) -> dict[str, Observed]:
    """What the agent's scrape holds per metric, with the unit its reader documents."""
    units = {f.metric: f.unit for f in FACTS}
    out: dict[str, Observed] = {}
    for name, (kind, values) in _samples(scrape).items():
        out[name] = _observed(kind, units.get(name, "Xid code" if name in _KERNEL_LOG else ""), values)
    if nvml_error:
        for f in FACTS:
            out.setdefault(f.metric, Observed(False, why=nvml_error))
    return out


def verdict(metric: str, agent: Observed, sim: Observed | None) -> str:
    notes: list[str] = []
    if sim is None:
        notes.append("not simulated")
    if not agent.present:
        return "; ".join([*notes, "agent: absent"]) or "agent: absent"
    if sim is not None:
        if sim.kind and agent.kind != sim.kind:
            notes.append(f"typed {agent.kind} here, {sim.kind} by dcgm-exporter (PromQL reads both)")
        if agent.integral is not None and sim.integral is not None and agent.integral != sim.integral:
            notes.append("integral differs")
        known = sim.present and not math.isnan(sim.low) and not math.isnan(agent.low)
        if known and (agent.low < sim.low or agent.high > sim.high):
            notes.append("outside simulated healthy range (note)")
    return "; ".join(notes) or "ok"


def _why_absent(metric: str, missing: dict[str, set[str]]) -> str:
    if metric in _KERNEL_LOG:
        return "no Xid in the kernel log"
    if metric.startswith("DCGM_FI_PROF_"):
        return "DCGM profiling module only, not in NVML"
    if metric.startswith("DCGM_FI_DEV_NVLINK_COUNT_"):
        return "NVLink5 counters: not read by the agent"
    if metric in missing:
        return "; ".join(sorted(missing[metric]))
    return "not read by the agent"


def table(rows: Iterable[Sequence[str]]) -> str:
    rows = [list(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _kmsg_source(path: Path) -> KmsgSource:
    """The device for a character device (``/dev/kmsg``), else a file of records (a fixture)."""
    return DevKmsg(str(path)) if path.is_char_device() else KmsgFile(path)


def _host_summary(sysfs: Path, kmsg: KmsgSource) -> list[str]:
    """One line each: the kernel log as the agent reads it, the InfiniBand hw_counters found."""
    try:
        records = kmsg.read_all()
        xids = [x for r in records if (x := parse_xid(r)) is not None]
        kernel = f"kernel log: {len(records)} records from {kmsg.name}, {len(xids)} Xid lines"
        if xids:
            kernel += f" (last: Xid {xids[-1].xid} on {xids[-1].pci_bus_id})"
    except OSError as exc:
        kernel = f"kernel log: cannot read {kmsg.name}: {exc.strerror or exc}"
    counters, problems = read_hw_counters(sysfs)
    ports = sorted({(c.device, c.port) for c in counters})
    infiniband = f"InfiniBand hw_counters: {len(counters)} files on {len(ports)} port(s) under {sysfs}"
    if problems:
        infiniband += f", {len(problems)} unreadable (first: {problems[0].source}: {problems[0].message})"
    return [kernel, infiniband]


def log_bundle(kmsg: KmsgSource, command: Sequence[str], at: str) -> tuple[str, str]:
    """The log bundle the agent would attach to a ticket from this machine (``Capture``, as before a
    reboot): one line saying its size against the annotation's limit, what it holds and how long
    it took to capture; and its text as the controller decodes it."""
    start = time.monotonic()
    encoded = Capture(
        node="device-check", why="a device check", kmsg=kmsg, nvidia_smi=command, at=at
    ).encoded()
    took = time.monotonic() - start
    if not encoded:
        return f"log bundle: does not fit in {ENCODED_MAX_BYTES:,} bytes even without its kernel log", ""
    text = decode_bundle(encoded)
    status = [line for line in text.splitlines() if line.startswith(("(exit ", "(not run"))]
    cut = ", cut to fit" if "lines left out (size cap)" in text else ""
    line = (
        f"log bundle: {len(encoded):,} bytes gzip+base64 (limit {ENCODED_MAX_BYTES:,}) of "
        f"{len(text):,} bytes of text{cut}, captured in {took:.1f} s; "
        f"{' '.join(command)}: {status[-1].strip('()') if status else '-'}"
    )
    return line, text


def run(
    nvml: NvmlCalls | None,
    *,
    nvml_error: str,
    source: str,
    out: Path | None = None,
    sysfs: Path = Path("/sys"),
    kmsg: Path = Path("/dev/kmsg"),
    bundle_command: Sequence[str] = ("nvidia-smi", "-q"),
) -> tuple[str, int]:
    """The report and the exit status."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"healer device check, {now}", f"NVML: {source}"]
    kmsg_source = _kmsg_source(kmsg)
    bundle_line, bundle_text = log_bundle(kmsg_source, bundle_command, now)
    host = [*_host_summary(sysfs, kmsg_source), bundle_line]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "log-bundle.txt").write_text(bundle_text)
    if nvml is None:
        lines += [*host, f"error: {nvml_error}"]
        return "\n".join(lines) + "\n", 2
    recording = RecordingNvml(nvml)
    reading = read_nvml(recording)
    models = sorted({g.model for g in reading.gpus})
    lines += [
        f"GPUs: {len(reading.gpus)} x {', '.join(models) or '-'}",
        f"driver: {reading.driver_version}",
        f"machine: {platform.machine()}, Python {platform.python_version()}",
    ]
    facts = HostFacts(
        node="device-check", sysfs=sysfs, kmsg=kmsg_source, uptime=Path("/proc/uptime"), nvml=recording
    )
    lines += host
    server, thread = serve(facts, address="127.0.0.1", port=0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=30) as r:
            scrape = r.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    missing: dict[str, set[str]] = {}
    for g in reading.gpus:
        for metric, why in g.missing.items():
            missing.setdefault(metric, set()).add(why)
    agent = agent_observations(scrape, "")
    sim = simulator_assumptions()
    rows = [
        [
            "metric (rules read)",
            "agent",
            "type",
            "unit",
            "integral",
            "values",
            "simulator",
            "type",
            "unit",
            "integral",
            "healthy range",
            "verdict",
        ]
    ]
    for metric in rule_metrics():
        name = ALIASES.get(metric, metric)
        a = agent.get(name) or Observed(False, why=_why_absent(name, missing))
        s = sim.get(name)
        rows.append(
            [
                metric if name == metric else f"{metric} (= {name})",
                "present" if a.present else f"absent: {a.why}",
                a.kind or "-",
                a.unit or "-",
                "-" if a.integral is None else ("yes" if a.integral else "no"),
                a.values(),
                "absent" if s is None else ("present" if not s.why else s.why),
                s.kind if s else "-",
                (s.unit or "-") if s else "-",
                "-" if s is None or s.integral is None else ("yes" if s.integral else "no"),
                s.values() if s else "-",
                verdict(metric, a, s),
            ]
        )
    nvlink = [g for g in reading.gpus if g.nvlink]
    lines += ["", table(rows), ""]
    lines.append(
        f"NVLink per link (healer_agent_nvlink_errors_total): {sum(len(g.nvlink) for g in nvlink)} "
        f"counters on {len(nvlink)} GPU(s), links {sorted({k[0] for g in nvlink for k in g.nvlink}) or '-'}"
    )
    if out is not None:
        (out / "nvml-recording.json").write_text(json.dumps(recording.dump(), indent=1) + "\n")
        (out / "metrics.prom").write_text(scrape)
    return "\n".join(lines) + "\n", 0


def main(argv: Sequence[str] | None = None) -> int:
    summary = __doc__.split("\n\n")[0].replace("``", "")
    parser = argparse.ArgumentParser(
        prog="device-check",
        description=summary,
        epilog=(
            "Needs healer installed with the agent extra (pip install -e '.[agent]': nvidia-ml-py) "
            "and, for /dev/kmsg, root or CAP_SYSLOG. Exit status: 0 NVML answered (the table says "
            "what differs); 2 NVML not available (the reason printed). Runs on real GPUs are kept "
            "in docs/device-checks/."
        ),
    )
    parser.add_argument("--recorded", type=Path, help="read a recorded NVML device instead of the real one")
    parser.add_argument(
        "--out", type=Path, help="also write nvml-recording.json, metrics.prom and log-bundle.txt here"
    )
    parser.add_argument(
        "--bundle-command",
        default="nvidia-smi -q",
        help="the command the log bundle carries the output of (default nvidia-smi -q)",
    )
    parser.add_argument("--sysfs", type=Path, default=Path("/sys"), help="sysfs root (default /sys)")
    parser.add_argument(
        "--kmsg", type=Path, default=Path("/dev/kmsg"), help="kernel log: the device or a file of records"
    )
    args = parser.parse_args(argv)
    try:
        nvml: NvmlCalls | None = open_nvml(args.recorded)
        error = ""
    except NvmlUnavailable as exc:
        nvml, error = None, str(exc)
    source = f"recorded device {args.recorded}" if args.recorded else "this machine's driver (pynvml)"
    if error:
        source += ": not available"
    report, status = run(
        nvml,
        nvml_error=error,
        source=source,
        out=args.out,
        sysfs=args.sysfs,
        kmsg=args.kmsg,
        bundle_command=shlex.split(args.bundle_command),
    )
    sys.stdout.write(report)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
